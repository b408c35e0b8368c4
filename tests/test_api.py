"""The Python API (aepo_rl.AEPOTrainer): a datasets.Dataset, reward functions of TRL's convention with weights,
callbacks; the same run as `aepo train` on the same rows; reward and dataset errors that name what is wrong."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file

from aepo_rl import AEPOTrainer, TrainerCallback
from aepo_rl.registry import REWARDS, register_reward
from aepo_rl.rewards import RewardFunctionError, WeightedRewards, f1_reward, reward_function
from aepo_rl.tasks.dataset import DatasetTask, FunctionTool, dataset_rows
from aepo_rl.tasks.loaders import DatasetError
from aepo_rl.tools.base import ToolError

datasets = pytest.importorskip("datasets", reason="the [dev] extra installs datasets")

TRAIN = [{"question": q, "answer": a} for q, a in (
    ("Who founded Velmora?", "Ada Korrin"), ("When was Velmora founded?", "1874"),
    ("Where is Drotoun Institute?", "Riltha"), ("Who founded Drotoun Institute?", "Kresbrou Voku"))]
TEST = [{"question": "Who founded Velmora?", "answer": ["Ada Korrin", "A. Korrin"]},
        {"question": "How old was Velmora in 2024?", "answer": ["150"]}]
CORPUS = [{"id": "1", "title": "Velmora", "text": "Velmora was founded in 1874 by Ada Korrin."},
          {"id": "2", "title": "Drotoun Institute",
           "text": "Drotoun Institute is based in Riltha, founded by Kresbrou Voku."}]
TINY = {
    "model.tiny_init": "random", "model.tiny_hidden_size": 32, "model.tiny_num_layers": 1,
    "model.tiny_intermediate_size": 64,
    "model.tiny_vocab_size": 400, "model.tiny_num_heads": 2, "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 16,
    "model.tiny_copy_steps": 2, "sft.epochs": 0, "rollout.n": 2, "rollout.max_response_length": 24,
    "rollout.max_tokens_per_round": 10, "rollout.premonitor_probe_tokens": 4, "trainer.batch_size": 2,
    "trainer.mini_batch_size": 1, "trainer.micro_batch_size": 2, "trainer.steps": 2, "trainer.tensorboard": False,
    "eval.samples": 2, "rollout.repetition_penalty": 1.1, "rollout.min_p": 0.01,
}
WEIGHTS = (0.7, 0.3)
UNTIMED = ("timing_s/", "train/tokens_per_s", "rewards/")


def f1_to_gold(prompts, completions, answer, **columns):
    """A user's reward: token F1 of the boxed answer against the row's `answer` column."""
    return [f1_reward(c, a if isinstance(a, list) else [a]) for c, a in zip(completions, answer)]


async def brevity(prompts, completions, completion_ids, **columns):
    """An async user's reward: shorter responses score higher."""
    await asyncio.sleep(0)
    return [1.0 / (1 + len(c)) for c in completions]


def mixed(response, answers, question=""):
    """The two rewards above in the registry's per-response form, for the command line."""
    return WEIGHTS[0] * f1_reward(response, answers) + WEIGHTS[1] * (1.0 / (1 + len(response)))


class Recorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, trainer):
        self.events.append(("begin", trainer.model.training is not None))

    def on_step_end(self, trainer, step, metrics):
        self.events.append(("step", step, metrics))

    def on_evaluate(self, trainer, step, results):
        self.events.append(("evaluate", step, results))

    def on_save(self, trainer, step, path):
        self.events.append(("save", step, path, (path / "model" / "model.safetensors").is_file()))

    def on_train_end(self, trainer, results):
        self.events.append(("end", results))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same config, rows and rewards twice: `aepo train` on files with the registered mixed reward, and
    AEPOTrainer on datasets.Dataset objects with the two weighted reward functions and a callback."""
    from aepo_rl.cli import main

    tmp = tmp_path_factory.mktemp("api")
    common = {**TINY, "model.cache_dir": str(tmp / "cache"), "task.corpus": write_jsonl(tmp / "corpus.jsonl", CORPUS)}
    register_reward("api_test_mixed")(mixed)
    try:
        cli_args = {**common, "task.name": "file", "task.reward": "api_test_mixed",
                    "task.train_files": f"[{write_jsonl(tmp / 'train.jsonl', TRAIN)}]",
                    "task.val_files": f"[{write_jsonl(tmp / 'test.jsonl', TEST)}]",
                    "trainer.run_dir": str(tmp / "runs"), "trainer.run_name": "cli"}
        assert main(["train", *[f"{key}={value}" for key, value in cli_args.items()]]) == 0
    finally:
        del REWARDS["api_test_mixed"]
    recorder = Recorder()
    trainer = AEPOTrainer(overrides=common, train_dataset=datasets.Dataset.from_list(TRAIN),
                          eval_dataset=datasets.Dataset.from_list(TEST), reward_funcs=[f1_to_gold, brevity],
                          reward_weights=list(WEIGHTS), callbacks=[recorder], output_dir=tmp / "runs" / "api")
    results = trainer.train()
    return tmp / "runs" / "cli", trainer, results, recorder


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_api_and_the_command_line_give_the_same_run(runs):
    cli_dir, trainer, results, _ = runs
    api_dir = trainer.run_dir
    cli, api = metrics(cli_dir), metrics(api_dir)
    assert [r["step"] for r in api] == [1, 2]
    untimed = [[{k: v for k, v in r.items() if not k.startswith(UNTIMED)} for r in records] for records in (cli, api)]
    assert untimed[0] == untimed[1]
    assert any(r["critic/score/mean"] != 0 for r in api)  # the rewards scored something
    for step in ("step_000001", "step_000002"):
        cli_weights = load_file(cli_dir / "checkpoints" / step / "model" / "model.safetensors")
        api_weights = load_file(api_dir / "checkpoints" / step / "model" / "model.safetensors")
        assert cli_weights.keys() == api_weights.keys()
        assert all(torch.equal(cli_weights[k], api_weights[k]) for k in cli_weights)
    cli_results = json.loads((cli_dir / "eval.json").read_text())
    assert results == json.loads((api_dir / "eval.json").read_text())
    for stage in ("sft", "rl"):
        assert results[stage]["dataset/test"] == cli_results[stage]["file/test"]
        assert results[stage]["dataset/test"]["num_questions"] == 2


def test_each_reward_function_is_logged_under_trls_names(runs):
    _, trainer, _, _ = runs
    for record in metrics(trainer.run_dir):
        for name in ("f1_to_gold", "brevity"):
            assert f"rewards/{name}/mean" in record and f"rewards/{name}/std" in record
        expected = WEIGHTS[0] * record["rewards/f1_to_gold/mean"] + WEIGHTS[1] * record["rewards/brevity/mean"]
        assert record["critic/score/mean"] == pytest.approx(expected)


def test_callbacks_hear_every_step_evaluation_and_checkpoint(runs):
    _, trainer, results, recorder = runs
    kinds = [event[0] for event in recorder.events]
    assert kinds == ["evaluate", "begin", "step", "save", "step", "save", "evaluate", "end"]
    steps = [event for event in recorder.events if event[0] == "step"]
    assert [s[1] for s in steps] == [1, 2] and [s[2] for s in steps] == metrics(trainer.run_dir)
    saves = [event for event in recorder.events if event[0] == "save"]
    assert [(s[1], s[2].name, s[3]) for s in saves] == [(1, "step_000001", True), (2, "step_000002", True)]
    evaluations = [event for event in recorder.events if event[0] == "evaluate"]
    assert [(e[1], e[2]) for e in evaluations] == [(0, results["sft"]), (2, results["rl"])]
    assert recorder.events[-1] == ("end", results)


def test_evaluate_and_save_model_use_the_trained_policy(runs, tmp_path):
    _, trainer, results, recorder = runs
    again = trainer.evaluate()
    assert again.keys() == {"dataset/test"} and again["dataset/test"]["num_questions"] == 2
    assert recorder.events[-1][:2] == ("evaluate", 2)
    saved = trainer.save_model(tmp_path / "saved")
    final = load_file(trainer.run_dir / "checkpoints" / "step_000002" / "model" / "model.safetensors")
    assert all(torch.equal(load_file(saved / "model.safetensors")[k], final[k]) for k in final)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(saved).config.vocab_size == trainer.model.config.vocab_size


def test_a_bad_reward_function_stops_the_run_naming_it(runs, tmp_path):
    cli_dir, _, _, _ = runs

    def one_short(prompts, completions, **columns):
        return [1.0] * (len(completions) - 1)

    trainer = AEPOTrainer(overrides={**TINY, "model.cache_dir": str(cli_dir.parent.parent / "cache"),
                                     "task.corpus": str(cli_dir.parent.parent / "corpus.jsonl")},
                          train_dataset=TRAIN, eval_dataset=TEST, reward_funcs=[one_short],
                          output_dir=tmp_path / "bad")
    with pytest.raises(RewardFunctionError, match=r"reward function 'one_short' returned 0 values for 1 completions"):
        trainer.train()  # the first evaluation scores each sample
    run = tmp_path / "bad"  # the run started with its (here untrained) SFT model; the evaluation is not written
    assert (run / "checkpoints" / "sft" / "config.json").is_file() and not (run / "eval.json").exists()


# ---------------------------------------------------------------- reward functions (no model)


def _score(funcs, weights=None, completions=("a", "b", "c"), **columns):
    rewards = WeightedRewards(funcs, weights)
    return rewards(["q"] * len(completions), list(completions), [[1]] * len(completions),
                   {"answer": ["x"] * len(completions), **columns})


def test_weighted_rewards_by_hand_with_async_and_none():
    def ones(prompts, completions, **kw):
        return [1.0, 1.0, 1.0]

    async def halves(prompts, completions, answer, **kw):
        return [0.5, None, 2]  # None: this function does not score the second completion

    scores, logged = _score([ones, halves], [2.0, -1.0])
    assert scores == [2.0 - 0.5, 2.0, 2.0 - 2.0]
    assert logged == {"rewards/ones/mean": 1.0, "rewards/ones/std": 0.0, "rewards/halves/mean": 1.25,
                      "rewards/halves/std": 0.75}


def test_reward_errors_name_the_function_and_the_completion():
    def short(prompts, completions, **kw):
        return [1.0]

    def text(prompts, completions, **kw):
        return [1.0, "good", 0.0]

    def nothing(prompts, completions, **kw):
        return [None, None, None]

    def nan(prompts, completions, **kw):
        return torch.tensor([0.0, float("nan"), 1.0])

    with pytest.raises(RewardFunctionError, match=r"'short' returned 1 values for 3 completions; return one float"):
        _score([short])
    with pytest.raises(RewardFunctionError, match=r"'text' returned 'good' \(str\) for completion 1; return a float"):
        _score([text])
    with pytest.raises(RewardFunctionError, match=r"'text' returned a str"):
        _score([_named("text", "1.0")])
    with pytest.raises(RewardFunctionError, match=r"every reward function \(nothing\) returned None for completion 0"):
        _score([nothing])
    with pytest.raises(RewardFunctionError, match=r"'nan' returned nan for completion 1; return a finite float"):
        _score([nan])
    with pytest.raises(RewardFunctionError, match=r"'short' returned a bool"):
        _score([_named("short", True)])
    with pytest.raises(ValueError, match=r"reward_weights has 1 entries for 2 reward functions \(short, text\)"):
        WeightedRewards([short, text], [1.0])
    with pytest.raises(ValueError, match=r"reward_funcs\[0\] is a int, not a function"):
        WeightedRewards([3])
    with pytest.raises(KeyError, match="unknown reward 'nope'; valid names"):
        WeightedRewards(["nope"])


def _named(name, value):
    def fn(prompts, completions, **kw):
        return value

    fn.__name__ = name
    return fn


def test_builtin_rewards_are_batched_functions_reading_the_rows_answers():
    exact = reward_function("exact_match")
    completions = [r"<answer>\boxed{Ada Korrin}</answer>", r"<answer>\boxed{Riltha}</answer>"]
    assert exact(["q1", "q2"], completions, answer=["Ada Korrin", ["Ritha", "riltha"]]) == [1.0, 1.0]
    verl = [{"ground_truth": ["nobody"]}, {"ground_truth": {"target": ["Riltha"]}}]
    conversational = [[{"role": "assistant", "content": c}] for c in completions]
    assert exact([[{"role": "user", "content": "q"}]] * 2, conversational, reward_model=verl) == [0.0, 1.0]
    assert exact.__name__ == "exact_match" and exact.binary and not reward_function("f1").binary
    with pytest.raises(ValueError, match=r"reward 'f1' needs the gold answers of completion 0: give the dataset an "
                                         r"'answer' column"):
        reward_function("f1")(["q"], ["text"], question=["q"])


# ---------------------------------------------------------------- datasets, tools


def test_dataset_task_passes_trls_arguments_to_the_reward_functions():
    seen = {}

    def capture(prompts, completions, completion_ids, **columns):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, columns=columns)
        return [0.0] * len(completions)

    rows = [{"prompt": [{"role": "user", "content": "Who founded Velmora?"}], "answer": "Ada Korrin", "level": 1},
            {"prompt": "Where is Drotoun?", "answer": "Riltha", "level": 2}]
    task = DatasetTask("mine", dataset_rows(datasets.Dataset.from_list(rows[:1]), "train_dataset")
                       + dataset_rows(rows[1:], "more"), [], WeightedRewards([capture]), tools=["python"])
    examples = task.examples("train")
    assert examples[0].messages[0]["role"] == "system" and "<python>" in examples[0].messages[0]["content"]
    assert examples[1].messages[-1] == {"role": "user", "content": "Where is Drotoun?"}
    task.score(examples, ["one", "two"], [[1, 2], [3]])
    assert seen["prompts"] == [rows[0]["prompt"], "Where is Drotoun?"]
    assert seen["completions"] == [[{"role": "assistant", "content": "one"}], "two"]  # as the prompt's format
    assert seen["completion_ids"] == [[1, 2], [3]]
    assert seen["columns"] == {"answer": ["Ada Korrin", "Riltha"], "level": [1, 2]}


def test_dataset_errors_name_the_row_and_the_fix():
    with pytest.raises(DatasetError, match=r"train_dataset row 2: missing field 'answer'"):
        DatasetTask("d", dataset_rows([TRAIN[0], {"question": "no answer"}], "train_dataset"), [],
                    WeightedRewards(["f1"]))
    with pytest.raises(DatasetError, match=r"train_dataset row 1: expected a mapping of columns"):
        dataset_rows(["just a string"], "train_dataset")
    with pytest.raises(DatasetError, match=r"a dict of columns\? use datasets.Dataset.from_dict"):
        dataset_rows({"question": ["q"], "answer": ["a"]}, "train_dataset")
    with pytest.raises(DatasetError, match=r"eval_dataset has no rows"):
        dataset_rows(datasets.Dataset.from_list([]), "eval_dataset")
    with pytest.raises(ValueError, match="reward_funcs, reward_weights and tools go with train_dataset"):
        AEPOTrainer(reward_funcs=[f1_to_gold])
    with pytest.raises(TypeError, match=r"callbacks\[0\] \(str\) has none of the methods"):
        AEPOTrainer(callbacks=["on_step_end"])
    with pytest.raises(ValueError, match=r"the search tool needs documents: set task.corpus"):
        AEPOTrainer(train_dataset=TRAIN, reward_funcs=["f1"])  # the default tools are search and python
    assert list(AEPOTrainer(train_dataset=TRAIN, reward_funcs=["f1"], tools=["python"]).task.tool_specs) == ["python"]


def test_a_function_is_a_tool():
    def word_count(text):
        """<word_count>text</word_count> counts the words of the text"""
        return len(text.split())

    def broken(text):
        raise RuntimeError("no")

    tool = FunctionTool(word_count)
    assert (tool.name, tool.tag, tool.argument) == ("word_count", "word_count", "text")
    assert tool.description == "<word_count>text</word_count> counts the words of the text"
    assert tool.run("a b c") == "3"
    failed = FunctionTool(broken).run("x")
    assert isinstance(failed, ToolError) and failed == "RuntimeError: no"
    task = DatasetTask("d", dataset_rows(TRAIN, "rows"), [], WeightedRewards(["f1"]), tools=[word_count])
    assert list(task.tools()) == ["word_count"] and task.tools()["word_count"].run("x y") == "2"
    assert "<word_count>" in task.examples("train")[0].messages[0]["content"]
    with pytest.raises(TypeError, match="takes exactly one required argument"):
        FunctionTool(lambda a, b: a)
