"""The agent protocol (§1.1, §3): a tool registered in one place is prompted, parsed, executed,
masked and scored under both formats; the module's pieces one by one."""

from __future__ import annotations

import pytest
from fakes import EchoSearch, FakeEngine

from aepo_rl.config import RolloutConfig
from aepo_rl.integrations.verl.reward import compute_score
from aepo_rl.protocol import Protocol, format_error, model_text, token_tags, tools_used, xml_call_tags
from aepo_rl.rewards import deep_research_reward, get_reward
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.tasks.common import SYSTEM_PROMPT, system_prompt
from aepo_rl.tools import get_tool, register_tool


@register_tool("wordcount")
class WordCount:
    """The one definition of the new tool: nothing but name, tag, description and run."""

    name = "wordcount"
    tag = "wordcount"
    description = "Count the words of a text."

    def __init__(self):
        self.calls: list[str] = []

    def run(self, arg: str) -> str:
        self.calls.append(arg)
        return str(len(arg.split()))


SEARCH = "<search>Velmora Guild</search> <result>\nPage 1: Velmora Guild — founded by Ada Korrin.\n</result>"
PYTHON = " <python>1932 - 1874</python> <result>\n58\n</result>"
WORDCOUNT = "<wordcount> three little words</wordcount> <result>\n3\n</result>"
ANSWER_3 = " <answer>\\boxed{ 3}</answer>"


# ---------------------------------------------------------------- end to end, both formats

@pytest.mark.parametrize("fmt", ["xml", "hermes"])
def test_a_registered_tool_works_end_to_end(tiny_tokenizer, fmt):
    tool = get_tool("wordcount")
    protocol = Protocol({"wordcount": tool}, fmt)
    prompt = system_prompt(("wordcount",), fmt)
    assert protocol.tool_line("wordcount") in prompt
    assert ("<wordcount>input</wordcount> Count the words of a text" in prompt) == (fmt == "xml")

    call, answer = protocol.format_call("wordcount", "three little words"), protocol.format_answer(" 3")
    engine = FakeEngine(tiny_tokenizer, lambda seq: ([call, answer][seq.rounds], 1.0))
    prompts = [("p0", tiny_tokenizer.encode("how many words?", add_special_tokens=False))]
    cfg = RolloutConfig(n=1, mode="independent", tool_format=fmt, max_response_length=512)
    t = run_rollout(engine, prompts, {"wordcount": tool}, cfg).groups[0][0]

    assert protocol.stop_strings()[0] in engine.params[0].stop  # </wordcount> or </tool_call>
    assert t.rounds[0].tool_call.name == "wordcount" and tool.calls == ["three little words"]
    assert t.rounds[0].tool_call.result == "3" and t.finish_reason == "answer"
    masked = [i for i, m in zip(t.response_token_ids, t.loss_mask) if m == 0]
    assert tiny_tokenizer.decode(masked) == protocol.format_result("3", tiny_tokenizer)
    assert t.response_text == call + protocol.format_result("3", tiny_tokenizer) + answer
    assert tools_used(t.response_text) == {"wordcount"}
    assert deep_research_reward(t.response_text, ["3"]) == 1.0
    assert compute_score("wordcount_set", t.response_text, ["3"], {"reward": "deep_research"}) == 1.0


# ---------------------------------------------------------------- reward side: text alone

def test_a_new_tool_tag_answered_by_a_result_is_a_call():
    response = WORDCOUNT + ANSWER_3
    assert xml_call_tags(response) == ("search", "python", "wordcount")
    assert format_error(response) is None and get_reward("deep_research")(response, ["3"]) == 1.0
    assert tools_used(response) == {"wordcount"}
    assert model_text(response) == "<wordcount> three little words</wordcount> " + ANSWER_3


@pytest.mark.parametrize("response, reason", [
    ("<wordcount> a b</wordcount> <result>\n2\n" + ANSWER_3, "unclosed <result> block"),
    ("</wordcount> <result>\n2\n</result>" + ANSWER_3, "unexpected </wordcount>"),
    (WORDCOUNT + "<wordcount>x" + ANSWER_3, "missing </wordcount>"),
    (WORDCOUNT + " <wordcount>x</wordcount>" + ANSWER_3, "expected <result> after </wordcount> but found <answer>"),
])
def test_a_new_tool_call_keeps_the_call_rules(response, reason):
    assert reason in format_error(response)
    assert deep_research_reward(response, ["3"]) == -1.0


def test_a_tag_no_result_answers_is_plain_text():
    response = "<think>I could <count>it</count></think> <b>bold</b>" + ANSWER_3
    assert xml_call_tags(response) == ("search", "python")
    assert format_error(response) is None and tools_used(response) == set()


def test_reserved_tags_never_become_calls():
    response = '<tool_call>{"name": "x"}</tool_call> <result>\n1\n</result>' + ANSWER_3
    assert xml_call_tags(response) == ("search", "python")
    assert format_error(response) == "unexpected <result>"


def test_the_multi_tool_bonus_still_means_search_and_python():
    assert deep_research_reward(SEARCH + " " + WORDCOUNT + ANSWER_3, ["3"]) == 1.0
    assert deep_research_reward(SEARCH + PYTHON + " " + WORDCOUNT + ANSWER_3, ["3"]) == pytest.approx(1.1)


def test_a_new_tool_in_a_hermes_response():
    response = ('<tool_call>{"name": "wordcount", "arguments": {"input": "three little words"}}</tool_call>'
                "\n<tool_response>\n3\n</tool_response>\n" + ANSWER_3)
    assert format_error(response) is None and tools_used(response) == {"wordcount"}
    assert deep_research_reward(response, ["3"]) == 1.0


# ---------------------------------------------------------------- rollout side

TOOLS = {"search": EchoSearch(), "wordcount": WordCount()}


@pytest.mark.parametrize("fmt, stop", [("xml", "</wordcount>"), ("hermes", "</tool_call>")])
def test_format_call_round_trips_through_the_parser(fmt, stop):
    protocol = Protocol(TOOLS, fmt)
    request = protocol.parse_call("<think>count</think> " + protocol.format_call("wordcount", "a b c"), stop)
    assert (request.key, request.name, request.arg, request.error) == ("wordcount", "wordcount", "a b c", None)


def test_system_prompts():
    assert SYSTEM_PROMPT == ("Use tools to answer. <search>query</search> searches, <python>code</python> runs "
                             "Python; results come in <result></result>. Think in <think></think> if needed. "
                             "Answer as <answer>\\boxed{answer}</answer>.")
    hermes = system_prompt(("search", "wordcount"), "hermes")
    assert hermes.startswith('Use tools to answer. <tool_call>{"name": "search", "arguments": {"query": "query"}}'
                             "</tool_call> searches, ")
    assert 'Count the words of a text; results come in <tool_response></tool_response>.' in hermes
    assert system_prompt((WordCount, TOOLS["search"])) == Protocol(
        {"wordcount": WordCount, "search": TOOLS["search"]}).system_prompt()


def test_system_prompt_errors_name_the_tool():
    with pytest.raises(KeyError, match="unknown tool 'browse'; valid names: .*wordcount"):
        system_prompt(("browse",))
    with pytest.raises(TypeError, match="has no name, tag and description"):
        system_prompt((lambda: WordCount(),))  # a factory function, not the tool or its class


def test_the_tools_dict_is_checked():
    with pytest.raises(ValueError, match="cannot use the tag <answer>"):
        Protocol({"answer": WordCount()})
    with pytest.raises(ValueError, match="keys tool 'wordcount' as 'count' but its tag is 'wordcount'"):
        Protocol({"count": WordCount()})
    with pytest.raises(ValueError, match="Hermes result wrapping depends on the tokenizer"):
        Protocol(TOOLS, "hermes").format_result("3")


def test_token_tags_keep_the_tiny_tokenizer_order():
    assert token_tags() == ["<search>", "</search>", "<python>", "</python>", "<result>", "</result>",
                            "<answer>", "</answer>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                            "<tool_response>", "</tool_response>"]
    assert token_tags(("wordcount",))[:2] == ["<wordcount>", "</wordcount>"]


def test_protocol_takes_a_list_of_tools_as_the_trl_docs_pass_it():
    from aepo_rl.tools import get_tool

    search = get_tool("search", corpus="synthetic")
    assert Protocol([search]).system_prompt() == Protocol({search.tag: search}).system_prompt()
    assert "<search>query</search>" in Protocol([search]).system_prompt()
    with pytest.raises(TypeError, match="give a list of tools or a dict of them by tag, got str"):
        Protocol("search")
