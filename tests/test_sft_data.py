"""SFT on your own demonstrations (aepo_rl/train/sft_data.py): every accepted layout becomes the protocol's
turns, tool results have loss mask 0, every mistake names file, row and message before any model is
built, and a tiny SFT runs from a file through `aepo sft --data` and `AEPOTrainer(sft_dataset=...)`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aepo_rl import cli
from aepo_rl.config import ConfigError, load_config
from aepo_rl.models import encode_prompt
from aepo_rl.protocol import Protocol
from aepo_rl.tasks.common import system_prompt
from aepo_rl.tasks.loaders import DatasetError
from aepo_rl.tools.base import tool_factory
from aepo_rl.train.sft import tokenize_demonstration
from aepo_rl.train.sft_data import SFTData, load_sft_data, parse_row, read_file, spaced_values

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "sft"
TOOLS = {name: tool_factory(name) for name in ("search", "python")}
RESULT = "Page 1: Velmora — Velmora was founded in 1874 by Ada Korrin."
ANSWER = "<answer>\\boxed{Ada Korrin}</answer>"
# The one trajectory every layout below writes: a search, its result, the answer.
# Copied values are written after a space, as the teacher writes them (spaced_values).
SPACED_ANSWER = "<answer>\\boxed{ Ada Korrin}</answer>"
XML_PIECES = [("<search> Velmora founder</search>", True), (f" <result>\n{RESULT}\n</result>", False),
              (f" {SPACED_ANSWER}", True)]


def rendered(row: dict, fmt: str = "xml", tokenizer=None) -> list[tuple[str, bool]]:
    demo = parse_row(row, "demos.jsonl:1", fmt)
    return demo.demonstration(Protocol(TOOLS, fmt), tokenizer, 0).pieces


def user(text="Who founded Velmora?"):
    return {"role": "user", "content": text}


def assistant(content, **extra):
    return {"role": "assistant", "content": content, **extra}


def tool(content=RESULT):
    return {"role": "tool", "content": content}


def openai_call(name="search", arguments='{"query": "Velmora founder"}'):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


SAME_TRAJECTORY = {
    "messages with XML calls": {"messages": [user(), assistant("<search>Velmora founder</search>"), tool(),
                                             assistant(ANSWER)]},
    "messages with OpenAI tool_calls": {"messages": [user(), assistant(None, tool_calls=[openai_call()]), tool(),
                                                     assistant(ANSWER)]},
    "tool_calls with an arguments object": {"messages": [
        user(), assistant("", tool_calls=[{"function": {"name": "search", "arguments": {"query": "Velmora founder"}}}]),
        tool(), assistant(ANSWER)]},
    "one message with the result inside": {"messages": [
        user(), assistant(f"<search>Velmora founder</search> <result>\n{RESULT}\n</result> {ANSWER}")]},
    "ShareGPT": {"conversations": [
        {"from": "human", "value": "Who founded Velmora?"},
        {"from": "function_call", "value": json.dumps({"name": "search", "arguments": {"query": "Velmora founder"}})},
        {"from": "observation", "value": RESULT}, {"from": "gpt", "value": ANSWER}]},
    "TRL strings": {"prompt": "Who founded Velmora?",
                    "completion": f"<search>Velmora founder</search> <result>\n{RESULT}\n</result> {ANSWER}"},
    "TRL messages": {"prompt": [user()], "completion": [assistant(None, tool_calls=[openai_call()]), tool(),
                                                        assistant(ANSWER)]},
}


@pytest.mark.parametrize("layout", SAME_TRAJECTORY)
def test_every_layout_becomes_the_same_protocol_turns(layout):
    assert rendered(SAME_TRAJECTORY[layout]) == XML_PIECES


def test_the_prompt_gets_the_protocol_system_message_unless_it_has_one():
    demo = parse_row(SAME_TRAJECTORY["messages with XML calls"], "x", "xml")
    example = demo.demonstration(Protocol(TOOLS, "xml"), None, 0).example
    assert example.messages == [{"role": "system", "content": system_prompt(("search", "python"))}, user()]
    assert example.question == "Who founded Velmora?"
    own = {"messages": [{"role": "system", "content": "Be brief."},
                        *SAME_TRAJECTORY["messages with XML calls"]["messages"]]}
    own_example = parse_row(own, "x").demonstration(Protocol(TOOLS, "xml"), None, 0).example
    assert own_example.messages[0]["content"] == "Be brief."
    sharegpt = {"system": "Be brief.", **SAME_TRAJECTORY["ShareGPT"]}
    assert parse_row(sharegpt, "x").prompt[0] == {"role": "system", "content": "Be brief."}


def test_earlier_turns_are_prompt_and_only_the_last_reply_is_trained():
    row = {"messages": [user("Hi"), assistant("Hello."), *SAME_TRAJECTORY["messages with XML calls"]["messages"]]}
    demo = parse_row(row, "x")
    assert [m["content"] for m in demo.prompt] == ["Hi", "Hello.", "Who founded Velmora?"]
    assert rendered(row) == XML_PIECES


def test_parallel_tool_calls_become_one_call_per_round_in_order():
    row = {"messages": [user(), assistant("<think>two pages</think>", tool_calls=[
        openai_call(arguments={"query": "Velmora founder"}), openai_call("python", {"code": "print(2024 - 1874)"})]),
        tool(), tool("150"), assistant("<answer>\\boxed{150}</answer>")]}
    assert rendered(row) == [("<think>two pages</think>", True), (" <search> Velmora founder</search>", True),
                             (f" <result>\n{RESULT}\n</result>", False), (" <python>print(2024 - 1874)</python>", True),
                             (" <result>\n150\n</result>", False), (" <answer>\\boxed{ 150}</answer>", True)]


def test_calls_are_written_in_the_rollout_format(tiny_tokenizer):
    """tool_calls become Hermes <tool_call> text with rollout.tool_format=hermes, each result a ChatML user turn for
    a ChatML tokenizer, exactly as Protocol writes them for the rollout."""
    protocol = Protocol(TOOLS, "hermes")
    pieces = rendered(SAME_TRAJECTORY["messages with OpenAI tool_calls"], "hermes", tiny_tokenizer)
    assert pieces == [(protocol.format_call("search", " Velmora founder"), True),
                      (protocol.format_result(RESULT, tiny_tokenizer), False), (SPACED_ANSWER, True)]
    assert "<|im_start|>user\n<tool_response>" in pieces[1][0]
    exported = {"messages": [user(), assistant(pieces[0][0] + pieces[1][0] + SPACED_ANSWER)]}
    assert rendered(exported, "hermes", tiny_tokenizer) == pieces  # a Hermes rollout read back


def test_tool_result_tokens_have_loss_mask_zero_and_ids_are_built_piece_by_piece(tiny_tokenizer):
    demo = parse_row(SAME_TRAJECTORY["messages with OpenAI tool_calls"], "x").demonstration(
        Protocol(TOOLS, "xml"), tiny_tokenizer, 0)
    sample = tokenize_demonstration(tiny_tokenizer, demo, max_length=512)
    prompt = encode_prompt(tiny_tokenizer, demo.example.messages)  # the chat template, as rollouts build prompts
    pieces = [tiny_tokenizer(text, add_special_tokens=False)["input_ids"] for text, _ in XML_PIECES]
    assert sample.input_ids == prompt + pieces[0] + pieces[1] + pieces[2] + [tiny_tokenizer.eos_token_id]
    assert sample.loss_mask == ([0] * len(prompt) + [1] * len(pieces[0]) + [0] * len(pieces[1])
                                + [1] * len(pieces[2]) + [1])
    masked = tiny_tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m == 0])
    trained = tiny_tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m == 1])
    assert RESULT in masked and "<result>" in masked and "Velmora founder" not in masked
    assert trained == f"<search> Velmora founder</search> {SPACED_ANSWER}<|im_end|>"


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_a_copied_value_is_the_same_tokens_in_the_demo_as_in_the_question_and_the_result(tiny_tokenizer):
    """Demonstrations written like examples/sft (no space before a copied name) are rendered with one, as the
    teacher writes them, so the name in the call and the answer is the question's and the result's tokens."""
    question, result = "Where was Ada Korrin born?", "Page 1: Ada Korrin — Ada Korrin was born in Velmora."
    row = {"messages": [user(question), assistant(None, tool_calls=[openai_call(arguments={"query": "Ada Korrin"})]),
                        tool(result), assistant("<answer>\\boxed{Velmora}</answer>")]}
    demo = parse_row(row, "x").demonstration(Protocol(TOOLS, "xml"), tiny_tokenizer, 0)
    encode = lambda text: tiny_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    name, place = encode(" Ada Korrin"), encode(" Velmora")
    assert encode("Ada Korrin")[0] != name[0]  # written without its space the name would be other tokens
    assert _contains(encode(question), name) and _contains(encode(result), place)
    (call, _), (answer, _) = demo.pieces[0], demo.pieces[2]
    assert _contains(encode(call), name) and _contains(encode(answer), place)
    sample = tokenize_demonstration(tiny_tokenizer, demo, max_length=512)
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask) if m]
    assert _contains(trained, name) and _contains(trained, place)


def test_calls_written_in_text_get_the_space_and_code_does_not():
    text = ("<think>look up</think><search>Ada Korrin</search>, <search> Velmora</search>, <python>print(1)</python>"
            " <answer>\\boxed{1874} or \\boxed{ 1874}</answer>")
    assert spaced_values(Protocol(TOOLS, "xml"), text) == (
        "<think>look up</think><search> Ada Korrin</search>, <search> Velmora</search>, <python>print(1)</python>"
        " <answer>\\boxed{ 1874} or \\boxed{ 1874}</answer>")
    hermes = Protocol(TOOLS, "hermes")
    written = ('<tool_call>{"name": "search", "arguments": {"query": "Ada Korrin"}}</tool_call>'
               '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
               '<tool_call>not json</tool_call>')
    assert spaced_values(hermes, written) == (hermes.format_call("search", " Ada Korrin") +
                                              hermes.format_call("python", "print(1)") +
                                              "<tool_call>not json</tool_call>")


# ---------------------------------------------------------------- files

def test_example_files_of_every_layout_read(tmp_path):
    data = SFTData.from_files([str(EXAMPLES / name)
                               for name in ("demos.jsonl", "demos_sharegpt.json", "demos_trl.jsonl")])
    assert len(data.demos) == 8 and not data.unanswered()
    assert [d.where for d in data.demos][4] == f"{EXAMPLES / 'demos_sharegpt.json'} row 1"
    lines = tmp_path / "lines.json"  # JSON Lines under a .json name, as LLaMA-Factory also reads
    lines.write_text("".join(json.dumps(row) + "\n" for row in SAME_TRAJECTORY.values()))
    assert [where for where, _ in read_file(lines)] == [f"{lines}:{i}" for i in range(1, 8)]


def test_parquet_rows_with_the_columns_pyarrow_fills_in(tmp_path):
    """A parquet file of chat messages: pyarrow gives every message every key (None where a row had none)."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [SAME_TRAJECTORY["messages with OpenAI tool_calls"], SAME_TRAJECTORY["messages with XML calls"]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "demos.parquet")
    data = SFTData.from_files([str(tmp_path / "demos.parquet")])
    assert [d.where for d in data.demos] == [f"{tmp_path / 'demos.parquet'} row {i}" for i in (1, 2)]
    assert [d.demonstration(Protocol(TOOLS, "xml"), None, 0).pieces for d in data.demos] == [XML_PIECES] * 2


@pytest.mark.parametrize("content, problem", [
    ("", "has no demonstrations: give one per line (JSONL) or a JSON array of them"),
    ("[]", "has no demonstrations"),
    ('[{"messages": 1}]', "row 1: 'messages' must be a non-empty list"),
    ('[{"messages": [{"role": "user", "content": "q"}]}, 2]', "row 2: expected a JSON object, got int"),
    ('{"a": ', "not valid JSON"),
    ('"text"', "expected a JSON array of demonstrations"),
])
def test_bad_json_files_are_named(tmp_path, content, problem):
    path = tmp_path / "demos.json"
    path.write_text(content)
    with pytest.raises(DatasetError, match=r"demos\.json") as err:
        SFTData.from_files([str(path)])
    assert problem in str(err.value)


def test_a_missing_or_empty_jsonl_file_is_named(tmp_path):
    with pytest.raises(DatasetError, match="nope.jsonl does not exist"):
        SFTData.from_files([str(tmp_path / "nope.jsonl")])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="empty.jsonl has no"):
        SFTData.from_files([str(tmp_path / "empty.jsonl")])


# ---------------------------------------------------------------- mistakes, each named

MISTAKES = {
    "assistant message 2 has tool_calls but no following tool message":
        {"messages": [user(), assistant(None, tool_calls=[openai_call()]), assistant(ANSWER)]},
    "assistant message 2 has 2 tool_calls but only 1 following tool messages":
        {"messages": [user(), assistant(None, tool_calls=[openai_call(), openai_call()]), tool(), assistant(ANSWER)]},
    "tool message 3 answers no call: assistant message 2 before it has no tool_calls "
    "and its text does not end with a call":
        {"messages": [user(), assistant("Let me look."), tool(), assistant(ANSWER)]},
    "the reply ends with tool message 3, a tool result":
        {"messages": [user(), assistant("<search>Velmora founder</search>"), tool()]},
    "unknown demonstration format (the row's fields: 'text'); accepted: 'messages' (chat messages), 'conversations'":
        {"text": "hello"},
    "a row with a 'prompt' and no 'completion' is a question for RL": {"prompt": "Who?", "answer": "x"},
    "message 2 has the role 'bot'": {"messages": [user(), {"role": "bot", "content": "x"}]},
    "no user message": {"messages": [{"role": "system", "content": "s"}, assistant(ANSWER)]},
    "no assistant message after the last user message": {"messages": [user()]},
    "tool message 2 is a tool call or result before the last user message":
        {"messages": [user(), tool(), user(), assistant(ANSWER)]},
    "assistant message 2: tool call 1: 'arguments' has 2 arguments; a protocol call passes exactly one":
        {"messages": [user(), assistant(None, tool_calls=[openai_call(arguments={"query": "a", "k": 2})]), tool(),
                      assistant(ANSWER)]},
    "assistant message 2: tool call 1 must be {\"function\": {\"name\"":
        {"messages": [user(), assistant(None, tool_calls=[{"type": "function"}]), tool(), assistant(ANSWER)]},
    "assistant message 2 writes a Hermes <tool_call> but rollout.tool_format=xml: set rollout.tool_format=hermes":
        {"messages": [user(), assistant('<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'),
                      tool(), assistant(ANSWER)]},
    "assistant message 2 has tool_calls and its text ends with a call too":
        {"messages": [user(), assistant("<search>Velmora founder</search>", tool_calls=[openai_call()]), tool(),
                      assistant(ANSWER)]},
    "function_call turn 2: the value is not JSON": {"conversations": [
        {"from": "human", "value": "q"}, {"from": "function_call", "value": "search(q)"},
        {"from": "observation", "value": "r"}, {"from": "gpt", "value": ANSWER}]},
    "conversations turn 2 is from 'bot'; accepted: system, human": {"conversations": [
        {"from": "human", "value": "q"}, {"from": "bot", "value": "a"}]},
    "assistant message 2: the content must be a string or a list of": {"messages": [user(), assistant(42)]},
    # what exported agent logs get wrong (newcomer 4): each refused, not trained as something else
    "tool message 3 has no 'content': a tool result is the text the tool returned":
        {"messages": [user(), assistant(None, tool_calls=[openai_call()]), {"role": "tool", "tool_call_id": "call_1"},
                      assistant(ANSWER)]},
    "tool message 3 has an empty 'content'":
        {"messages": [user(), assistant(None, tool_calls=[openai_call()]), tool("  "), assistant(ANSWER)]},
    "observation turn 3 has an empty 'value'": {"conversations": [
        {"from": "human", "value": "q"},
        {"from": "function_call", "value": '{"name": "search", "arguments": {"query": "q"}}'},
        {"from": "observation", "value": ""}, {"from": "gpt", "value": ANSWER}]},
    "assistant message 2: tool call 1: 'arguments' is not valid JSON (Expecting ',' delimiter at column 22: "
    "'{\"code\": \"print(1+1)\"'); write it as the JSON text of an object":
        {"messages": [user(), assistant(None, tool_calls=[openai_call("python", '{"code": "print(1+1)"')]), tool(),
                      assistant(ANSWER)]},
    "assistant message 2: tool call 1: 'arguments' is JSON str '\"Velmora founder\"', not an object":
        {"messages": [user(), assistant(None, tool_calls=[openai_call(arguments='"Velmora founder"')]), tool(),
                      assistant(ANSWER)]},
    "function_call turn 2: tool call 1: 'arguments' is not valid JSON": {"conversations": [
        {"from": "human", "value": "q"},
        {"from": "function_call", "value": '{"name": "search", "arguments": "{query"}'},
        {"from": "observation", "value": "r"}, {"from": "gpt", "value": ANSWER}]},
    "assistant message 2: its <tool_call> is not valid JSON":
        {"messages": [user(), assistant('<tool_call>{"name": "search", "arguments": {"query": "q"}</tool_call>'),
                      tool(), assistant(ANSWER)]},
    "assistant message 4 is empty (no text and no tool_calls)":
        {"messages": [user(), assistant(None, tool_calls=[openai_call()]), tool(), assistant("")]},
    "gpt turn 2 is empty (no text and no tool_calls)": {"conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": " "}, {"from": "gpt", "value": ANSWER}]},
}
HERMES_ONLY = {"assistant message 2: its <tool_call> is not valid JSON"}


@pytest.mark.parametrize("problem", MISTAKES)
def test_each_mistake_names_file_row_and_message(problem):
    with pytest.raises(DatasetError) as err:
        parse_row(MISTAKES[problem], "demos.jsonl:17", "hermes" if problem in HERMES_ONLY else "xml")
    assert str(err.value).startswith("demos.jsonl:17: ") and problem in str(err.value), str(err.value)


def test_a_call_of_a_tool_the_task_lacks_is_named():
    row = {"messages": [user(), assistant(None, tool_calls=[openai_call("web_search")]), tool(), assistant(ANSWER)]}
    data = SFTData.from_rows([("demos.jsonl:3", row)], "demos.jsonl")
    with pytest.raises(DatasetError, match="demos.jsonl:3: assistant message 2 calls the tool 'web_search', which the "
                                           r"task does not have \(its tools: search, python\)"):
        data.check_tools(Protocol(TOOLS, "xml"))


def test_a_call_written_in_the_text_of_a_tool_the_task_lacks_is_named():
    for fmt, text in (("xml", "<browse>velmora.org</browse>"),
                      ("hermes", '<tool_call>{"name": "browse", "arguments": {"url": "velmora.org"}}</tool_call>')):
        row = {"messages": [user(), assistant(text), tool(), assistant(ANSWER)]}
        data = SFTData.from_rows([("demos.jsonl:5", row)], "demos.jsonl", fmt)
        with pytest.raises(DatasetError, match="demos.jsonl:5: assistant message 2 calls the tool 'browse', which the "
                                               "task does not have"):
            data.check_tools(Protocol(TOOLS, fmt))
    known = {"messages": [user(), assistant("<python>print(1)</python>"), tool(), assistant(ANSWER)]}
    SFTData.from_rows([("demos.jsonl:6", known)], "demos.jsonl").check_tools(Protocol(TOOLS, "xml"))


def test_an_empty_file_of_demonstrations_says_demonstrations(tmp_path):
    for name in ("empty.jsonl", "empty.json"):
        (tmp_path / name).write_text("\n\n")
        with pytest.raises(DatasetError, match=f"{name} has no demonstrations: give one per line") as err:
            SFTData.from_files([str(tmp_path / name)])
        assert "question" not in str(err.value)


def test_sft_data_needs_sft_epochs_and_one_source():
    cfg = load_config("aepo", overrides={"sft.data": [str(EXAMPLES / "demos.jsonl")]})
    assert len(load_sft_data(cfg).demos) == 4 and load_sft_data(load_config("aepo")) is None
    with pytest.raises(ConfigError, match="sft_dataset and sft.data"):
        load_sft_data(cfg, [SAME_TRAJECTORY["ShareGPT"]])
    cfg.sft.epochs = 0
    with pytest.raises(ConfigError, match="sft.epochs=0 skips SFT"):
        load_sft_data(cfg)
    with pytest.raises(DatasetError, match="sft_dataset row 2: unknown demonstration format"):
        load_sft_data(load_config("aepo"), [SAME_TRAJECTORY["ShareGPT"], {"text": "x"}])


# ---------------------------------------------------------------- before any model, and end to end

@pytest.fixture
def no_model(monkeypatch):
    """Building the policy fails the test: every error must come before it."""
    for module in ("aepo_rl.train.sft", "aepo_rl.train.pipeline", "aepo_rl.models"):
        monkeypatch.setattr(f"{module}.load_policy", lambda *a, **k: pytest.fail("a model was built"), raising=False)


def test_cli_errors_come_before_any_model(tmp_path, capsys, no_model):
    bad = tmp_path / "demos.jsonl"
    bad.write_text(json.dumps(MISTAKES["assistant message 2 has tool_calls but no following tool message"]) + "\n")
    assert cli.main(["sft", "--data", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert f"aepo: {bad}:1: assistant message 2 has tool_calls but no following tool message" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert cli.main(["train", "--sft-data", str(bad), f"trainer.run_dir={tmp_path}"]) == 2
    assert f"{bad}:1: assistant message 2" in capsys.readouterr().err
    assert cli.main(["train", "--resume", str(tmp_path), "--sft-data", str(bad)]) == 2
    assert "--sft-data starts a run" in capsys.readouterr().err


def test_a_task_without_demonstrations_is_a_user_error_before_any_model(tmp_path, capsys, no_model):
    questions = EXAMPLES / "questions.jsonl"
    status = cli.main(["sft", "--out", str(tmp_path / "out"), "task.name=file", f"task.train_files=[{questions}]",
                       f"task.corpus={EXAMPLES / 'corpus.jsonl'}", f"model.cache_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert status == 2 and "task 'file' has no demonstrations for cold-start SFT: give your own (sft.data=" in err


def test_a_file_task_without_a_search_corpus_is_a_user_error_before_any_model(tmp_path, capsys, no_model):
    status = cli.main(["sft", "--data", str(EXAMPLES / "demos.jsonl"), "--out", str(tmp_path / "out"), "task.name=file",
                       f"task.train_files=[{EXAMPLES / 'questions.jsonl'}]"])
    err = capsys.readouterr().err
    assert status == 2 and "task 'file' uses the search tool but has no corpus: set task.corpus=" in err


def test_demonstrations_given_as_rl_data_point_to_the_sft_options(capsys):
    from aepo_rl.tasks.loaders import row_to_example

    with pytest.raises(DatasetError, match="demos.jsonl:1: missing field 'question' .*; a row with 'messages' is a "
                                           "demonstration for SFT: give its file with `aepo sft --data`"):
        row_to_example(SAME_TRAJECTORY["messages with XML calls"], "demos.jsonl:1", "d-0", "d")


def test_the_api_reads_and_checks_sft_dataset_at_construction(no_model):
    from aepo_rl import AEPOTrainer

    bad = MISTAKES["tool message 3 answers no call: assistant message 2 before it has no tool_calls "
                   "and its text does not end with a call"]
    with pytest.raises(DatasetError, match="sft_dataset row 2: tool message 3 answers no call"):
        AEPOTrainer(sft_dataset=[SAME_TRAJECTORY["ShareGPT"], bad])
    trainer = AEPOTrainer(sft_dataset=str(EXAMPLES / "demos.jsonl"))
    assert trainer.cfg.sft.data == [str(EXAMPLES / "demos.jsonl")]  # a file is sft.data: config.yaml names it


def test_the_tiny_tokenizer_learns_the_demonstrations_text_too():
    class Task:
        def texts(self):
            return ["a question"]

    data = SFTData.from_rows([("x", SAME_TRAJECTORY["messages with OpenAI tool_calls"])], "x")
    texts = data.with_texts(Task()).texts()
    assert texts[0] == "a question" and "Who founded Velmora?" in texts and RESULT in texts and ANSWER in texts


TINY = ["model.tiny_init=random", "model.tiny_hidden_size=32", "model.tiny_num_layers=1",
        "model.tiny_intermediate_size=64", "model.tiny_num_heads=2", "model.tiny_num_kv_heads=1",
        "model.tiny_head_dim=16", "model.tiny_vocab_size=400", "model.tiny_copy_steps=2", "eval.samples=1",
        "rollout.max_response_length=16", "rollout.max_tokens_per_round=8", "rollout.premonitor_probe_tokens=4"]


def test_aepo_sft_trains_on_a_file_of_demonstrations(tmp_path, capsys):
    """`aepo sft --data` of the example's three files: the tiny model trains on all eight demonstrations, the
    masked loss falls, and the checkpoint and metrics are written."""
    files = [str(EXAMPLES / name) for name in ("demos.jsonl", "demos_sharegpt.json", "demos_trl.jsonl")]
    out = tmp_path / "sft"
    argv = ["sft", "--out", str(out), *[a for f in files for a in ("--data", f)], "task.name=file",
            f"task.train_files=[{EXAMPLES / 'questions.jsonl'}]", f"task.val_files=[{EXAMPLES / 'test.jsonl'}]",
            f"task.corpus={EXAMPLES / 'corpus.jsonl'}", f"model.cache_dir={tmp_path / 'cache'}", *TINY,
            "sft.epochs=6", "sft.batch_size=4", "sft.lr=1e-2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    metrics = json.loads((out / "sft_metrics.json").read_text())
    assert metrics["num_demonstrations"] == 8 and metrics["steps"] == 12
    assert metrics["loss_curve"][-1] < metrics["loss_curve"][0]
    assert (out / "checkpoints" / "sft" / "config.json").is_file()
    assert "file/test" in json.loads((out / "eval.json").read_text())["sft"]
