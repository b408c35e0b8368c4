"""Rewards (§3) on hand-written responses, verl's compute_score, and the LLM judge over a fake endpoint."""

import json

import httpx
import pytest

from aepo_rl.integrations.verl.reward import compute_score
from aepo_rl.protocol import format_error, tools_used
from aepo_rl.rewards import (
    JudgeUnavailableError,
    deep_research_reward,
    exact_match_reward,
    extract_answer,
    f1_reward,
    get_reward,
    math_reward,
    token_f1,
)

SEARCH = "<search>Velmora Guild</search> <result>\nPage 1: Velmora Guild — founded by Ada Korrin.\n</result>"
PYTHON = " <python>1932 - 1874</python> <result>\n58\n</result>"
HERMES_SEARCH = ('<tool_call>{"name": "search", "arguments": {"query": "Velmora Guild"}}</tool_call>'
                 "\n<tool_response>\nPage 1: Velmora Guild — founded by Ada Korrin.\n</tool_response>\n")
HERMES_PYTHON = ('<tool_call>{"name": "python", "arguments": {"code": "1932 - 1874"}}</tool_call><|im_end|>\n'
                 "<|im_start|>user\n<tool_response>\n58\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def answer(text: str) -> str:
    return f" <answer>\\boxed{{{text}}}</answer>"


def test_well_formed_right_answer_scores_one():
    assert deep_research_reward(SEARCH + answer("Ada Korrin"), ["Ada Korrin"]) == 1.0


def test_multi_tool_bonus_needs_both_tools_and_a_positive_f1():
    both = SEARCH + PYTHON + answer("58")
    assert deep_research_reward(both, ["58"]) == pytest.approx(1.1)
    assert deep_research_reward(both, ["59"]) == 0.0
    assert deep_research_reward(PYTHON.strip() + answer("58"), ["58"]) == 1.0


def test_partial_f1():
    # prediction "ada korrin smith" vs gold "ada korrin": P = 2/3, R = 1, F1 = 0.8
    assert deep_research_reward(SEARCH + answer("Ada Korrin Smith"), ["Ada Korrin"]) == pytest.approx(0.8)
    # max over gold answers
    assert deep_research_reward(answer("Korrin"), ["Ada Korrin", "Korrin"]) == 1.0


def test_normalisation_drops_case_punctuation_and_articles():
    assert token_f1("The  Velmora, Guild!", "velmora guild") == 1.0
    assert token_f1("an apple", "apple") == 1.0


def test_yes_no_mismatch_scores_zero():
    assert token_f1("no", "yes") == 0.0
    assert token_f1("yes it is", "yes") == 0.0
    assert token_f1("yes", "yes") == 1.0
    assert deep_research_reward(answer("noanswer"), ["no answer given"]) == 0.0


@pytest.mark.parametrize("response, reason", [
    ("<think>plan " + SEARCH + answer("x"), "unbalanced <think>"),
    ("</think>" + answer("x"), "</think> without <think>"),
    (SEARCH, "0 <answer> blocks"),
    (answer("x") + answer("x"), "2 <answer> blocks"),
    ("<search>Velmora Guild</search>" + answer("x"), "expected <result>"),
    ("<search>Velmora Guild</search>", "expected <result> after </search> but found nothing"),
    ("<search>Velmora Guild" + answer("x"), "missing </search>"),
    ("<python>1+1</python> <result>\n2\n" + answer("x"), "unclosed <result>"),
    (" <answer>Ada Korrin</answer>", "no \\boxed{}"),
    ("<result>\nfake\n</result>" + answer("x"), "unexpected <result>"),
    ("<answer>\\boxed{x}", "missing </answer>"),
])
def test_each_format_failure_scores_minus_one(response, reason):
    assert reason in format_error(response)
    assert deep_research_reward(response, ["x"]) == -1.0


def test_tags_inside_a_result_block_are_tool_output():
    response = "<python>print('<think>')</python> <result>\n<answer>\n</result>" + answer("x")
    assert format_error(response) is None
    assert deep_research_reward(response, ["x"]) == 1.0


def test_hermes_calls_are_checked_and_earn_the_multi_tool_bonus():
    assert deep_research_reward(HERMES_SEARCH + answer("Ada Korrin"), ["Ada Korrin"]) == 1.0
    assert deep_research_reward(HERMES_SEARCH + HERMES_PYTHON + answer("58"), ["58"]) == pytest.approx(1.1)
    assert deep_research_reward(HERMES_SEARCH + PYTHON + answer("58"), ["58"]) == pytest.approx(1.1)  # mixed
    assert tools_used(HERMES_SEARCH + HERMES_PYTHON) == {"search", "python"}
    assert tools_used(SEARCH + ' <tool_call>{"name": "python"}</tool_call>') == {"search"}  # XML: plain text
    assert tools_used('<tool_call>{"name": "python", oops}</tool_call>\n'
                      '<tool_response>\nError\n</tool_response>') == set()


def test_a_tool_call_tag_is_plain_text_in_an_xml_response_as_in_the_release():
    response = SEARCH + ' <tool_call>{"name": "search"}</tool_call>' + answer("Ada Korrin")
    assert format_error(response) is None and deep_research_reward(response, ["Ada Korrin"]) == 1.0


@pytest.mark.parametrize("response, reason", [
    ('<tool_call>{"name": "search"}</tool_call>' + answer("x") + "<tool_response>\nx\n</tool_response>",
     "expected <tool_response> after </tool_call> but found <answer>"),
    ('<tool_call>{"name": "search"}</tool_call> <result>\nx\n</result>' + HERMES_SEARCH + answer("x"),
     "expected <tool_response> after </tool_call> but found <result>"),
    ('<tool_call>{"name": "search"}</tool_call>\n<tool_response>\nx\n' + answer("x"), "unclosed <tool_response>"),
    ('<tool_call>{"name": "search"}' + answer("x") + "<tool_response>\nx\n</tool_response>", "missing </tool_call>"),
    ("<tool_response>\nfake\n</tool_response>" + answer("x"), "unexpected <tool_response>"),
])
def test_each_hermes_format_failure_scores_minus_one(response, reason):
    assert reason in format_error(response)
    assert deep_research_reward(response, ["x"]) == -1.0


def test_tags_inside_a_tool_response_are_tool_output():
    response = HERMES_SEARCH.replace("Page 1:", "<answer>\\boxed{no}</answer> <search>") + answer("x")
    assert format_error(response) is None and extract_answer(response) == "x"


def test_think_blocks_are_allowed():
    assert deep_research_reward("<think>find it</think> " + SEARCH + answer("Ada Korrin"), ["Ada Korrin"]) == 1.0


def test_boxed_extraction_handles_nested_braces():
    assert extract_answer(answer("\\frac{1}{2}")) == "\\frac{1}{2}"
    assert extract_answer("no box here") is None


def test_exact_match_f1_and_math_rewards():
    assert exact_match_reward(answer("The Velmora Guild."), ["velmora guild"]) == 1.0
    assert exact_match_reward(answer("Velmora"), ["velmora guild"]) == 0.0
    assert f1_reward(answer("Velmora"), ["velmora guild"]) == pytest.approx(2 / 3)
    assert f1_reward("no answer at all", ["x"]) == 0.0
    assert math_reward(answer("\\frac{1}{2}"), ["0.5"]) == 1.0
    assert math_reward(answer("2/4"), ["\\frac{1}{2}"]) == 1.0
    assert math_reward(answer("3"), ["4"]) == 0.0
    assert math_reward("nothing boxed", ["4"]) == 0.0


def test_compute_score_picks_the_reward_of_the_data_source():
    response = answer("\\frac{1}{2}")
    assert compute_score("gsm8k", response, "0.5") == 1.0  # math equivalence
    assert compute_score("hotpotqa", response, "0.5") == 0.0  # token F1: "frac12" vs "05"
    assert compute_score("hotpotqa", SEARCH + answer("Ada Korrin"), {"target": ["Ada Korrin"]}) == 1.0
    assert compute_score("anything", response, ["0.5"], {"reward": "math"}) == 1.0


def test_unknown_reward_names_the_choices():
    with pytest.raises(KeyError, match="deep_research"):
        get_reward("bleu")
    with pytest.raises(ValueError, match="judge_url"):
        get_reward("llm_judge")


def _fake_judge(verdicts: list[str], seen: list[dict]):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": verdicts[len(seen) - 1]}}]})
    return httpx.MockTransport(handle)


def test_llm_judge_parses_verdicts_and_caches(tmp_path):
    seen: list[dict] = []
    cache = tmp_path / "judge.jsonl"
    judge = get_reward("llm_judge", judge_url="http://judge.test/v1", judge_model="m",
                       transport=_fake_judge(["Correct.", "Incorrect"], seen), cache_path=cache)
    assert judge(answer("Ada Korrin"), ["Ada Korrin"], question="Who founded Velmora?") == 1.0
    assert judge(answer("Ada Korrin"), ["Ada Korrin"], question="Who founded Velmora?") == 1.0  # cached
    assert judge(answer("Bo Lin"), ["Ada Korrin"], question="Who founded Velmora?") == 0.0
    assert len(seen) == 2
    assert seen[0]["model"] == "m" and "Ada Korrin" in seen[0]["messages"][0]["content"]
    assert judge("no boxed answer", ["Ada Korrin"]) == 0.0 and len(seen) == 2
    # a new judge reads the disk cache and makes no call
    again = get_reward("llm_judge", judge_url="http://judge.test/v1", judge_model="m",
                       transport=_fake_judge([], []), cache_path=cache)
    assert again(answer("Bo Lin"), ["Ada Korrin"], question="Who founded Velmora?") == 0.0


def test_llm_judge_down_names_the_url():
    def refuse(request):
        raise httpx.ConnectError("connection refused", request=request)
    judge = get_reward("llm_judge", judge_url="http://judge.test:9/v1", transport=httpx.MockTransport(refuse))
    with pytest.raises(JudgeUnavailableError, match="http://judge.test:9/v1/chat/completions"):
        judge(answer("x"), ["x"], question="q")
