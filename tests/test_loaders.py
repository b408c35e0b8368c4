"""User data (verl parquet / JSONL), evaluation sets, reasoning-gym, and get_task dispatch."""

import json
from types import SimpleNamespace

import pytest

from aepo_rl.config import ConfigError, load_config
from aepo_rl.evaluate import evaluate
from aepo_rl.tasks import get_task
from aepo_rl.tasks.common import SYSTEM_PROMPT, system_prompt
from aepo_rl.tasks.loaders import DatasetError, default_reward, eval_set_name, load_examples, read_rows

VERL_ROW = {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Who wrote Velmora?"}],
            "ability": "qa", "reward_model": {"style": "rule", "ground_truth": ["Ada Korrin", "A. Korrin"]},
            "extra_info": {"index": 7}}


def write_parquet(path, rows):
    """A parquet file of ``rows`` (pyarrow is the [parquet] extra; without it the test skips)."""
    pa = pytest.importorskip("pyarrow", reason="parquet files are the [parquet] extra: pip install -e '.[parquet]'")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_verl_jsonl_row(tmp_path):
    (example,) = load_examples([write_jsonl(tmp_path / "train.jsonl", [VERL_ROW])], "train")
    assert example.question == "Who wrote Velmora?"
    assert example.answers == ["Ada Korrin", "A. Korrin"]
    assert example.data_source == "hotpotqa" and example.ability == "qa" and example.extra_info == {"index": 7}
    assert example.messages[0] == {"role": "system", "content": SYSTEM_PROMPT}  # protocol prompt added
    assert example.id == "train-train-0"


def test_verl_parquet_keeps_its_own_system_prompt(tmp_path):
    row = {**VERL_ROW, "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}],
           "reward_model": {"style": "rule", "ground_truth": "42"}}
    path = tmp_path / "data.parquet"
    write_parquet(path, [row, row])
    examples = load_examples([str(path)], "val")
    assert len(examples) == 2 and examples[1].id == "data-val-1"
    assert examples[0].messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}]
    assert examples[0].answers == ["42"]


def test_question_answer_rows_use_the_tools_of_the_set(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "2+2?", "answer": "4"}])
    (example,) = load_examples([path], "test", tools=("python",))
    assert example.messages[0]["content"] == system_prompt(("python",))
    assert "<search>" not in example.messages[0]["content"]
    assert example.data_source == "gsm8k" and example.answers == ["4"]


def test_malformed_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [VERL_ROW, "", '{"question": "x", ', VERL_ROW])
    with pytest.raises(DatasetError, match=r"bad\.jsonl:3: not valid JSON"):
        read_rows(path)
    with pytest.raises(DatasetError, match=r"bad\.jsonl:1: expected a JSON object"):
        read_rows(write_jsonl(tmp_path / "bad.jsonl", ["[1, 2]"]))
    with pytest.raises(DatasetError, match="does not exist"):
        read_rows(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("row, field", [
    ({"prompt": VERL_ROW["prompt"], "reward_model": {"style": "rule"}}, "reward_model.ground_truth"),
    ({"prompt": VERL_ROW["prompt"]}, "reward_model.ground_truth"),
    ({"question": "Q?"}, "answer"),
    ({"answer": "A"}, "question"),
])
def test_missing_field_names_field_and_row(tmp_path, row, field):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"question": "ok", "answer": "ok"}, row])
    with pytest.raises(DatasetError, match=rf"rows\.jsonl:2: missing field '{field}'"):
        load_examples([path], "train")


def test_data_errors_count_lines_and_rows_from_1(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"question": "ok", "answer": "ok"}, "", {"question": "Q?"}])
    with pytest.raises(DatasetError, match=r"rows\.jsonl:3: missing field 'answer'"):  # the blank line counts
        load_examples([path], "train")
    table = tmp_path / "rows.parquet"
    write_parquet(table, [{"question": "ok", "answer": "ok"}, {"question": "Q?", "answer": None}])
    with pytest.raises(DatasetError, match=r"rows\.parquet row 2: missing field 'answer'"):
        load_examples([str(table)], "train")


def test_an_empty_data_file_is_named(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(DatasetError, match=r"data file .*empty\.jsonl has no rows"):
        load_examples([path], "train")


def test_prompt_must_be_chat_messages(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{**VERL_ROW, "prompt": ["just text"]}])
    with pytest.raises(DatasetError, match=r"rows\.jsonl:1: field 'prompt' must be a string or a list"):
        load_examples([path], "train")


def test_file_task_splits_reward_and_correct(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [VERL_ROW])
    val = write_jsonl(tmp_path / "val.jsonl", [{"question": "Who?", "answer": ["Ada Korrin"]}])
    task = get_task(load_config(overrides={"task.name": "file", "task.train_files": [train], "task.val_files": [val]}))
    assert [e.question for e in task.examples("train")] == ["Who wrote Velmora?"]
    assert task.examples("test") == task.examples("dev") == task.examples("val")
    example = task.examples("test")[0]
    assert task.reward(example, "<answer>\\boxed{Ada Korrin Smith}</answer>") == pytest.approx(0.8)
    assert task.correct(example, "<answer>\\boxed{ada korrin}</answer>")
    assert not task.correct(example, "<answer>\\boxed{Ada Korrin Smith}</answer>")
    assert task.demonstrations() == [] and "Who wrote Velmora?" in task.texts()
    with pytest.raises(ValueError, match="task.corpus"):
        task.tools()  # search needs a corpus or a server


def test_eval_set_defaults(tmp_path):
    val = write_jsonl(tmp_path / "aime.jsonl", [{"question": "1/2 + 1/2?", "answer": "1"}])
    task = get_task(load_config(overrides={"task.name": "aime24", "task.val_files": [val]}))
    assert task.reward_name == "math" and task.allowed_tools == ("python",)
    assert task.correct(task.examples("test")[0], "<answer>\\boxed{\\frac{2}{2}}</answer>")
    overridden = get_task(load_config(overrides={"task.name": "aime24", "task.val_files": [val],
                                                 "task.reward": "exact_match"}))
    assert overridden.reward_name == "exact_match"
    assert default_reward("HotpotQA") == "deep_research" and default_reward("aime_2025") == "math"
    assert eval_set_name("2WikiMultihopQA") == "2wiki" and eval_set_name("my_data") is None
    with pytest.raises(DatasetError, match="task.val_files"):
        get_task(load_config(overrides={"task.name": "gaia"}))


def test_reasoning_gym_task_uses_the_generator_checker():
    cfg = load_config(overrides={"task.name": "reasoning_gym:basic_arithmetic", "task.num_train": 4,
                                 "task.num_dev": 2, "task.num_test": 3})
    task = get_task(cfg)
    example = task.examples("test")[0]
    assert len(task.examples("test")) == 3 and example.messages[1]["content"] == example.question
    right = (f"<python>{example.question}</python> <result>\nx\n</result> "
             f"<answer>\\boxed{{{example.answers[0]}}}</answer>")
    assert task.reward(example, right) == 1.0 and task.correct(example, right)
    wrong = f"<answer>\\boxed{{{example.answers[0]}1}}</answer>"
    assert task.reward(example, wrong) < 1.0 and not task.correct(example, wrong)  # the checker may give partial credit
    assert task.reward(example, f"\\boxed{{{example.answers[0]}}}") == -1.0  # no <answer> block
    assert task.examples("train")[0].question != task.examples("test")[0].question


def test_unknown_task_names_the_choices():
    with pytest.raises(ConfigError, match="reasoning_gym:<generator>"):
        get_task(load_config(overrides={"task.name": "imagenet"}))


def test_rows_without_a_system_message_get_the_protocol_of_the_tool_format():
    from aepo_rl.tasks.common import system_prompt
    from aepo_rl.tasks.loaders import row_to_example

    plain = row_to_example({"question": "q?", "answer": "a"}, "f.jsonl:1", "f-train-0", "f", fmt="hermes")
    verl = row_to_example({"prompt": [{"role": "user", "content": "q?"}], "reward_model": {"ground_truth": "a"}},
                          "f.parquet:1", "f-train-0", "f", fmt="hermes")
    for example in (plain, verl):
        assert example.messages[0] == {"role": "system", "content": system_prompt(("search", "python"), "hermes")}
        assert "<tool_call>" in example.messages[0]["content"]
    assert "<search>" in row_to_example({"question": "q?", "answer": "a"}, "f", "i", "f").messages[0]["content"]


def test_every_row_layout_keeps_its_extra_info(tmp_path):
    """extra_info (e.g. a difficulty or hop count, which eval.json's by_hops reads) survives question/answer rows
    as it does verl's and TRL's; anything but an object is named."""
    hops = {"hops": 3, "difficulty": 7}
    rows = [{"question": "Who?", "answer": "Ada", "extra_info": hops},
            {"prompt": "Who?", "answer": "Ada", "extra_info": hops},
            {**VERL_ROW, "extra_info": hops}, {"question": "Who?", "answer": "Ada"}]
    examples = load_examples([write_jsonl(tmp_path / "rows.jsonl", rows)], "test")
    assert [e.extra_info for e in examples] == [hops, hops, hops, {}]
    with pytest.raises(DatasetError, match=r"rows\.jsonl:1: field 'extra_info' must be an object"):
        load_examples([write_jsonl(tmp_path / "rows.jsonl", [{"question": "Who?", "answer": "Ada", "extra_info": 3}])],
                      "test")


def test_the_evaluation_splits_search_task_val_corpus(tmp_path, monkeypatch, tiny_tokenizer):
    """task.val_corpus is the evaluation splits' search corpus (a held-out world's documents); training searches
    task.corpus; unset, every split searches task.corpus."""
    corpus = lambda name, text: write_jsonl(tmp_path / f"{name}.jsonl", [{"id": "1", "title": "Velmora", "text": text}])  # noqa: E731
    train_corpus = corpus("train_docs", "Velmora was founded by Ada Korrin.")
    val_corpus = corpus("val_docs", "Velmora was founded by Bo Lind.")
    rows = write_jsonl(tmp_path / "q.jsonl", [{"question": "Who founded Velmora?", "answer": "Ada Korrin"}])
    overrides = {"task.name": "file", "task.train_files": [rows], "task.val_files": [rows], "task.corpus": train_corpus,
                 "model.cache_dir": str(tmp_path / "cache")}
    task = get_task(load_config(overrides={**overrides, "task.val_corpus": val_corpus}))
    assert "Ada Korrin" in task.split_tools("train")["search"].run("Velmora") == task.tools()["search"].run("Velmora")
    for split in ("dev", "test", "val"):
        assert "Bo Lind" in task.split_tools(split)["search"].run("Velmora")
    assert task.split_tools("test")["python"] is task.tools()["python"]

    class Rolled(Exception):
        pass

    def rollout(engine, prompts, tools, *args, **kwargs):
        raise Rolled(tools)

    monkeypatch.setattr("aepo_rl.evaluate.run_rollout", rollout)
    cfg = load_config(overrides={**overrides, "task.val_corpus": val_corpus})
    with pytest.raises(Rolled) as rolled:  # aepo eval, the SFT and RL evaluations: the split's tools
        evaluate(SimpleNamespace(tokenizer=tiny_tokenizer), task, task.examples("test"), cfg, "test")
    assert rolled.value.args[0] is task.split_tools("test")
    same = get_task(load_config(overrides=overrides))
    assert "Ada Korrin" in same.split_tools("test")["search"].run("Velmora")
    with pytest.raises(ConfigError, match="task.val_corpus.*task.search_url"):
        load_config(overrides={**overrides, "task.val_corpus": val_corpus, "task.search_url": "http://127.0.0.1:8000"})
    with pytest.raises(ConfigError, match="task 'synthetic' does not read it"):
        get_task(load_config(overrides={"task.val_corpus": val_corpus}))


def test_the_before_after_table_calls_an_evaluation_held_out_only_when_it_is(tmp_path):
    """val_files drawn from the training questions (a train-fit check) or from the demonstrations' are named so."""
    from aepo_rl.train.pipeline import evaluation_title
    from aepo_rl.train.sft_data import SFTData

    train = write_jsonl(tmp_path / "train.jsonl",
                        [{"question": f"Who founded town {i}?", "answer": "Ada"} for i in range(4)])
    fit = write_jsonl(tmp_path / "fit.jsonl", [{"question": "Who founded  town 1?", "answer": "Ada"},
                                               {"question": "Who founded town 9?", "answer": "Bo"}])
    cfg = load_config(overrides={"task.name": "file", "task.train_files": [train], "task.val_files": [fit]})
    assert evaluation_title(cfg, get_task(cfg)) == ("evaluation on test, not held out: 1 of its 2 questions are "
                                                    "training questions: cold-start SFT → RL")
    held_out = write_jsonl(tmp_path / "held_out.jsonl", [{"question": "Who founded town 9?", "answer": "Bo"}])
    cfg = load_config(overrides={"task.name": "file", "task.train_files": [train], "task.val_files": [held_out]})
    assert evaluation_title(cfg, get_task(cfg)) == "held-out evaluation (test): cold-start SFT → RL"
    demos = SFTData.from_rows([("demos row 1", {"prompt": "Who founded town 9?",
                                                "completion": "<answer>\\boxed{Bo}</answer>"})],
                              "demos")
    assert "1 of its 1 questions are training questions" in evaluation_title(cfg, get_task(cfg), demos)
