"""``aepo verl-data`` and the verl ``compute_score``: the parquet rows (no verl needed), and, marked
``verl``, their round trip through verl 0.9.1's own RLHFDataset and reward-function loader."""

from __future__ import annotations

import json

import pytest

from aepo_rl.cli import main

SMALL = ["task.num_train=6", "task.num_dev=3", "task.num_test=4"]
CORRECT = "<think>look it up</think> <search>q</search> <result>\nx\n</result> <answer>\\boxed{{{}}}</answer>"


def _rows(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl-data")
    assert main(["verl-data", "--task", "synthetic", "--out", str(out), *SMALL]) == 0
    return out


def test_verl_data_writes_the_synthetic_splits(synthetic_dir, capsys):
    from aepo_rl.config import load_config
    from aepo_rl.tasks import get_task

    task = get_task(load_config("aepo", None, SMALL))
    train, val = _rows(synthetic_dir / "train.parquet"), _rows(synthetic_dir / "val.parquet")
    assert [r["extra_info"]["question"] for r in train] == [e.question for e in task.examples("train")]
    assert [r["reward_model"]["ground_truth"] for r in val] == [e.answers for e in task.examples("dev")]
    assert {r["agent_name"] for r in train} == {"aepo_tree"} and {r["agent_name"] for r in val} == {"aepo_chain"}
    assert [r["extra_info"]["index"] for r in train] == list(range(6))
    assert train[0]["prompt"][0]["role"] == "system" and "<search>" in train[0]["prompt"][0]["content"]
    assert {r["extra_info"]["reward"] for r in train + val} == {"deep_research"}


def test_a_train_file_with_a_per_row_rollout_n_is_refused_for_aepo_tree(synthetic_dir, tmp_path):
    """verl pops a row's ``__rollout_n__`` before the agent loop sees it (review L4): the plugin's start-up check
    reads the local train files' schema and refuses the column, naming the file; verl-data never writes it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aepo_rl.integrations.verl.checks import refusals

    train = str(synthetic_dir / "train.parquet")
    config = {"data": {"train_files": [train]},
              "actor_rollout_ref": {"rollout": {"agent": {"default_agent_loop": "aepo_tree"}}}}
    assert "__rollout_n__" not in pq.read_schema(train).names and refusals(config) == []
    table = pq.read_table(train)
    bad = tmp_path / "train_n.parquet"
    pq.write_table(table.append_column("__rollout_n__", pa.array([4] * table.num_rows)), bad)
    config["data"]["train_files"] = str(bad)
    (problem,) = refusals(config)
    assert problem.startswith(f"data.train_files: {bad} has a __rollout_n__ column") and "Drop the column" in problem
    config["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] = "tool_agent"
    assert refusals(config) == []  # not the plugin's loops: verl's own business


def test_verl_data_prints_the_task_overrides_the_agent_loop_needs(tmp_path, capsys):
    assert main(["verl-data", "--out", str(tmp_path), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "+actor_rollout_ref.rollout.custom.aepo.task.name=synthetic" in out
    assert "+actor_rollout_ref.rollout.custom.aepo.task.num_train=6" in out
    assert "num_demonstrations" not in out  # defaults are not repeated


def test_verl_data_from_user_files_and_compute_score(tmp_path):
    from aepo_rl.integrations.verl.reward import compute_score

    train = tmp_path / "mine.jsonl"
    train.write_text("\n".join(json.dumps({"question": f"q{i}?", "answer": [f"Ada {i}", "A."]}) for i in range(3)))
    val = tmp_path / "held.jsonl"
    val.write_text(json.dumps({"question": "2+2?", "answer": "4"}))
    out = tmp_path / "out"
    assert main(["verl-data", "--task", "file", "--out", str(out), f"task.train_files=[{train}]",
                 f"task.val_files=[{val}]"]) == 0
    rows = _rows(out / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in rows] == [[f"Ada {i}", "A."] for i in range(3)]
    assert rows[1]["data_source"] == "mine"
    row = rows[1]
    right = compute_score(row["data_source"], CORRECT.format("Ada 1"), row["reward_model"]["ground_truth"],
                          row["extra_info"])
    wrong = compute_score(row["data_source"], CORRECT.format("Bob"), row["reward_model"]["ground_truth"],
                          row["extra_info"])
    assert right == 1.0 and wrong == 0.0
    assert compute_score(row["data_source"], "no format", row["reward_model"]["ground_truth"],
                         row["extra_info"]) == -1.0
    # the files read back as an aepo task: the round trip keeps questions and answers
    from aepo_rl.config import load_config
    from aepo_rl.tasks import get_task

    again = get_task(load_config("aepo", None, ["task.name=file", f"task.train_files=[{out / 'train.parquet'}]"]))
    assert ([(e.question, e.answers) for e in again.examples("train")]
            == [(f"q{i}?", [f"Ada {i}", "A."]) for i in range(3)])


def test_verl_data_refuses_a_missing_split(tmp_path, capsys):
    train = tmp_path / "only.jsonl"
    train.write_text(json.dumps({"question": "q?", "answer": "a"}))
    assert main(["verl-data", "--task", "file", "--out", str(tmp_path / "o"), f"task.train_files=[{train}]"]) == 2
    assert "task.val_files" in capsys.readouterr().err


@pytest.mark.verl
def test_verl_reads_the_parquet_and_loads_compute_score(synthetic_dir, tiny_tokenizer):
    pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl (.ci/run)")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from aepo_rl.integrations.verl import reward

    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 1024, "filter_overlong_prompts": False,
                               "return_raw_chat": True, "truncation": "error"})
    rows = _rows(synthetic_dir / "train.parquet")
    dataset = RLHFDataset(str(synthetic_dir / "train.parquet"), tiny_tokenizer, config)
    assert len(dataset) == len(rows)
    item = dataset[2]
    assert item["raw_prompt"] == rows[2]["prompt"]
    assert item["index"] == 2 and item["agent_name"] == "aepo_tree" and item["data_source"] == "synthetic"
    # verl's own loader of reward.custom_reward_function, scoring the dataset item's fields
    fn = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {
        "path": reward.__file__, "name": "compute_score", "reward_kwargs": {}}}}))
    gold = item["reward_model"]["ground_truth"]
    answer = gold[0] if not isinstance(gold, str) else gold
    assert fn(item["data_source"], CORRECT.format(answer), gold, item["extra_info"]) == 1.0
    assert fn(item["data_source"], CORRECT.format("certainly not it"), gold, item["extra_info"]) == 0.0


def test_verl_data_of_user_files_names_its_own_folder_not_this_machine(tmp_path, capsys, monkeypatch):
    """The printed task overrides name files inside the output folder as $DATA/..., so the folder moves (or is
    mounted on every node) whole; read back with $DATA set, they give the agent loop the same tools and rows."""
    from pathlib import Path

    from aepo_rl.config import load_config
    from aepo_rl.tasks import get_task

    examples = Path(__file__).resolve().parents[1] / "examples" / "sft"
    out = tmp_path / "data"
    assert main(["verl-data", "--task", "file", "--out", str(out), f"task.train_files=[{examples / 'questions.jsonl'}]",
                 f"task.val_files=[{examples / 'test.jsonl'}]", f"task.corpus={examples / 'corpus.jsonl'}"]) == 0
    printed = capsys.readouterr().out
    lines = [line.strip() for line in printed.splitlines() if line.strip().startswith("+actor_rollout_ref")]
    assert "+actor_rollout_ref.rollout.custom.aepo.task.train_files=[$DATA/train.parquet]" in lines
    assert "+actor_rollout_ref.rollout.custom.aepo.task.val_files=[$DATA/val.parquet]" in lines
    assert "+actor_rollout_ref.rollout.custom.aepo.task.corpus=$DATA/corpus.jsonl" in lines
    assert str(tmp_path) not in "".join(lines) and str(examples) not in "".join(lines)
    assert f"with $DATA={out}" in printed
    moved = tmp_path / "elsewhere"
    out.rename(moved)
    overrides = [line.split("custom.aepo.", 1)[1].replace("$DATA", str(moved)) for line in lines]
    task = get_task(load_config("aepo", None, overrides))
    original = get_task(load_config("aepo", None, ["task.name=file",
                                                   f"task.train_files=[{examples / 'questions.jsonl'}]",
                                                   f"task.corpus={examples / 'corpus.jsonl'}"]))
    assert sorted(task.tools()) == sorted(original.tools())
    assert task.tools()["search"].run("Velmora founder") == original.tools()["search"].run("Velmora founder")
    assert [e.question for e in task.examples("train")] == [e.question for e in original.examples("train")]
