"""pass@k estimator and evaluation on a scripted policy with known success rates."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from types import SimpleNamespace

import pytest
from fakes import EchoSearch

import aepo_rl.evaluate
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines.base import Segment
from aepo_rl.evaluate import eval_main, evaluate, pass_at_k, score_groups
from aepo_rl.rollout.trajectory import Round, ToolCall, Trajectory
from aepo_rl.tasks.base import Example


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (c correct) that contain a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_equals_enumeration_over_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_exact_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 − C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(6, 3, 4) == 1.0  # n − c < k: every 4-subset holds a correct sample
    # stable for large n, where C(n, k) overflows a float
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    assert pass_at_k(2000, 0, 1000) == 0.0


@pytest.mark.parametrize("n, c, k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_input(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


class FakeTask:
    """Answers are right when they box the gold answer; reward 1 / 0."""

    name = "fake"

    def __init__(self, num_questions: int):
        self._examples = [Example(id=f"q{i}", question=f"question {i}", answers=[f"gold{i}"], data_source="fake",
                                  messages=[{"role": "user", "content": f"question {i}"}])
                          for i in range(num_questions)]

    def examples(self, split):
        if split == "val":
            raise KeyError(f"task 'fake' has no split '{split}'; splits: ['test', 'dev']")
        return self._examples if split == "test" else []

    def tools(self):
        return {"search": "the search tool"}

    def correct(self, example, response_text):
        return f"\\boxed{{{example.answers[0]}}}" in response_text

    def reward(self, example, response_text):
        return 1.0 if self.correct(example, response_text) else 0.0


class ScriptedRollout:
    """Stands in for run_rollout: question i gets ``num_correct[i]`` right answers first, then wrong ones.

    A right answer makes 2 tool calls in 10 response tokens; a wrong one 1 call in 4 tokens.
    """

    def __init__(self, num_correct: list[int]):
        self.num_correct = num_correct
        self.calls = []

    def __call__(self, engine, prompts, tools, cfg, *, validation=False, sampling=None, seed=None):
        self.calls.append(SimpleNamespace(prompts=prompts, tools=tools, cfg=cfg, validation=validation,
                                          sampling=sampling, seed=seed))
        n = 1 if validation else cfg.n
        groups = []
        for prompt_id, prompt_ids in prompts:
            question = int(prompt_id[1:])
            groups.append([self._trajectory(prompt_id, j, prompt_ids, j < self.num_correct[question], question)
                           for j in range(n)])
        return SimpleNamespace(groups=groups, metrics={})

    @staticmethod
    def _trajectory(prompt_id, traj_id, prompt_ids, right, question):
        calls = 2 if right else 1
        rounds = [Round(start=i, end=i + 1, step_entropy=0.0, tool_call=ToolCall("search", "q", "r"))
                  for i in range(calls)]
        text = f"<answer>\\boxed{{gold{question}}}</answer>" if right else "<answer>\\boxed{nope}</answer>"
        return Trajectory(prompt_id=prompt_id, traj_id=traj_id, parent_id=None, fork_token_index=None,
                          prompt_token_ids=prompt_ids, response_token_ids=[7] * (10 if right else 4),
                          rounds=rounds, finish_reason="answer", response_text=text)


@pytest.fixture
def scripted_rollout(monkeypatch):
    def install(num_correct):
        rollout = ScriptedRollout(num_correct)
        monkeypatch.setattr(aepo_rl.evaluate, "run_rollout", rollout)
        return rollout
    return install


def test_evaluate_known_success_rates(scripted_rollout, tiny_tokenizer):
    rollout = scripted_rollout([0, 1, 2, 4, 3])
    cfg = load_config(overrides=["eval.samples=4", "eval.batch_size=2", "rollout.n=12", "rollout.seed=5"])
    task = FakeTask(5)
    engine = SimpleNamespace(tokenizer=tiny_tokenizer)
    result = evaluate(engine, task, task.examples("test"), cfg, "test", with_records=True)

    m = result["fake/test"]
    assert m["pass@1"] == pytest.approx((0 + 0.25 + 0.5 + 1 + 0.75) / 5)
    assert m["pass@k"] == pytest.approx(4 / 5)  # k = n = 4: any right answer
    assert (m["k"], m["num_questions"]) == (4, 5)
    right, total = 10, 20
    assert m["tool_calls/mean"] == pytest.approx((2 * right + 1 * (total - right)) / total)
    assert m["response_length/mean"] == pytest.approx((10 * right + 4 * (total - right)) / total)
    assert m["reward/mean"] == pytest.approx(right / total)
    assert [r["num_correct"] for r in m["records"]] == [0, 1, 2, 4, 3]
    assert m["records"][1]["samples"][0]["correct"] and not m["records"][1]["samples"][1]["correct"]

    # batches of eval.batch_size questions, independent sampling with K samples and §5 sampling
    assert [len(c.prompts) for c in rollout.calls] == [2, 2, 1]
    assert [c.seed for c in rollout.calls] == [5, 7, 9]
    call = rollout.calls[0]
    assert (call.cfg.mode, call.cfg.n, call.validation) == ("independent", 4, False)
    assert ((call.sampling.temperature, call.sampling.top_p, call.sampling.top_k, call.sampling.greedy)
            == (0.6, 0.95, 20, False))
    assert call.tools == {"search": "the search tool"}
    assert call.prompts[0][1] == tiny_tokenizer.apply_chat_template(
        task.examples("test")[0].messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert cfg.rollout.n == 12 and cfg.rollout.mode == "aepo"  # the caller's config is untouched


def test_evaluate_greedy_takes_one_sample(scripted_rollout, tiny_tokenizer):
    rollout = scripted_rollout([1, 0, 3])
    cfg = load_config(overrides=["eval.samples=4", "eval.greedy=true"])
    task = FakeTask(3)
    m = evaluate(SimpleNamespace(tokenizer=tiny_tokenizer), task, task.examples("test"), cfg, "test")["fake/test"]
    assert (m["pass@1"], m["pass@k"], m["k"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3), 1)
    assert "records" not in m
    call = rollout.calls[0]
    assert call.validation and call.cfg.n == 1 and call.sampling.greedy


def test_evaluate_rejects_empty_question_list(tiny_tokenizer):
    with pytest.raises(ValueError, match="no questions to evaluate in fake/dev"):
        evaluate(SimpleNamespace(tokenizer=tiny_tokenizer), FakeTask(1), [], load_config(), "dev")


def test_score_groups_rejects_a_group_of_the_wrong_size():
    task = FakeTask(2)
    group = [ScriptedRollout._trajectory("q0", j, [1], True, 0) for j in range(3)]
    with pytest.raises(ValueError, match="question q1: the rollout returned 2 samples, expected 3"):
        score_groups(task, task.examples("test"), [group, group[:2]], k=3)
    with pytest.raises(ValueError, match="returned 1 groups for 2 questions"):
        score_groups(task, task.examples("test"), [group], k=3)


@pytest.fixture
def fake_policy_stack(monkeypatch, scripted_rollout, tiny_tokenizer):
    """get_task / load_policy / build_engine replaced by fakes (where `aepo eval` uses them); returns what they
    were called with."""
    import aepo_rl.evaluate

    seen = {}
    scripted_rollout([2, 0, 1])
    monkeypatch.setattr(aepo_rl.evaluate, "get_task", lambda cfg: FakeTask(3))

    def load_policy(cfg, task):
        seen["cfg"] = cfg
        return "model", tiny_tokenizer

    monkeypatch.setattr(aepo_rl.evaluate, "load_policy", load_policy)
    monkeypatch.setattr(aepo_rl.evaluate, "build_engine",
                        lambda cfg, model, tok: seen.setdefault("engine", SimpleNamespace(tokenizer=tok, model=model)))
    return seen


def test_eval_main_writes_json_and_records(fake_policy_stack, tmp_path, capsys):
    cfg = load_config(overrides=["eval.samples=2", "eval.num_questions=2"])
    out = tmp_path / "out" / "eval.json"
    assert eval_main(cfg, out_file=str(out)) == 0
    assert fake_policy_stack["engine"].model == "model"
    data = json.loads(out.read_text())
    assert list(data) == ["fake/test"]
    assert data["fake/test"]["pass@1"] == pytest.approx((1.0 + 0.0) / 2)
    assert data["fake/test"]["num_questions"] == 2 and "records" not in data["fake/test"]
    records = [json.loads(line) for line in (tmp_path / "out" / "eval.records.jsonl").read_text().splitlines()]
    assert [(r["task"], r["id"], r["num_correct"]) for r in records] == [("fake/test", "q0", 2), ("fake/test", "q1", 0)]
    printed = capsys.readouterr().out
    assert "fake/test" in printed and "0.500" in printed


def test_aepo_eval_command_puts_its_options_into_the_config(fake_policy_stack, tmp_path):
    from aepo_rl.cli import main

    out = tmp_path / "e.json"
    assert main(["eval", "--model", "some/dir", "--greedy", "--samples", "3", "--out", str(out), "task.seed=7"]) == 0
    cfg = fake_policy_stack["cfg"]
    assert (cfg.model.path, cfg.eval.greedy, cfg.eval.samples, cfg.task.seed) == ("some/dir", True, 3, 7)
    assert json.loads(out.read_text())["fake/test"]["k"] == 1


def test_eval_main_on_an_openai_compatible_endpoint(fake_policy_stack, monkeypatch, tiny_tokenizer):
    import transformers

    import aepo_rl.evaluate

    built = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda path: tiny_tokenizer if path == "Qwen/Qwen3-8B" else None)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setattr(aepo_rl.evaluate, "OpenAIEngine",
                        lambda url, model, tok, api_key, seed: built.append((url, model, tok, api_key, seed))
                        or SimpleNamespace(tokenizer=tok))
    cfg = load_config(overrides=["model.path=Qwen/Qwen3-8B", "rollout.seed=3"])
    assert eval_main(cfg, endpoint="http://h:8000/v1", endpoint_model="qwen3") == 0
    assert built == [("http://h:8000/v1", "qwen3", tiny_tokenizer, "sk-test", 3)]
    assert "load_policy" not in fake_policy_stack and "cfg" not in fake_policy_stack


def test_eval_main_errors_name_the_problem(fake_policy_stack):
    with pytest.raises(ConfigError, match="eval.split='dev'.*no questions"):
        eval_main(load_config(overrides=["eval.split=dev"]))
    with pytest.raises(ConfigError, match="eval.split='val': task 'fake' has no split 'val'"):
        eval_main(load_config(overrides=["eval.split=val"]))
    with pytest.raises(ConfigError, match="--endpoint-model"):
        eval_main(load_config(), endpoint="http://localhost:1/v1")
    with pytest.raises(ConfigError, match="--model TOKENIZER"):
        eval_main(load_config(), endpoint="http://localhost:1/v1", endpoint_model="qwen")


def test_pass_at_k_mean_matches_known_rate_over_many_questions():
    """Questions with success rate p, n samples each: mean pass@k → 1 − (1 − p)^k in expectation."""
    n, k, p = 10, 3, 0.3
    # expectation of the unbiased estimator over c ~ Binomial(n, p)
    expected = sum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k(n, c, k) for c in range(n + 1))
    assert expected == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


class AnswerScriptEngine:
    """A GenerationEngine whose j-th sequence for question i answers right iff j < num_correct[i].

    A right answer searches once, then boxes the gold answer; a wrong one boxes "nope" at once.
    """

    def __init__(self, tokenizer, num_correct):
        self.tokenizer, self.vocab_size, self.num_correct = tokenizer, len(tokenizer), num_correct
        self.seqs: dict[int, dict] = {}
        self.per_question = Counter()
        self.params = []

    def add_sequence(self, prompt_token_ids):
        question = int(re.search(r"question (\d+)", self.tokenizer.decode(prompt_token_ids)).group(1))
        right = self.per_question[question] < self.num_correct[question]
        self.per_question[question] += 1
        self.seqs[len(self.seqs)] = {"question": question, "right": right, "rounds": 0}
        return len(self.seqs) - 1

    def fork(self, seq_id):
        raise AssertionError("evaluation never branches")

    def append(self, seq_id, token_ids):
        pass

    def generate(self, seq_ids, params, max_new_tokens):
        self.params.append(params)
        out = []
        for sid in seq_ids:
            seq = self.seqs[sid]
            if seq["right"] and seq["rounds"] == 0:
                text, reason, stop = "<search>where</search>", "stop", "</search>"
            else:
                answer = f"gold{seq['question']}" if seq["right"] else "nope"
                text, reason, stop = f"<answer>\\boxed{{{answer}}}</answer><|im_end|>", "eos", None
            seq["rounds"] += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Segment(ids, [-0.1] * len(ids), [0.5] * len(ids), [0.5] * len(ids), reason, stop))
        return out

    def release(self, seq_id):
        pass

    def stats(self):
        return {"prefill_tokens": 0.0, "decode_tokens": 0.0}


def test_evaluate_through_the_real_rollout(tiny_tokenizer):
    task = FakeTask(4)
    task.tools = lambda: {"search": EchoSearch()}
    engine = AnswerScriptEngine(tiny_tokenizer, num_correct=[3, 0, 1, 2])
    cfg = load_config(overrides=["eval.samples=3", "rollout.max_response_length=200"])
    m = evaluate(engine, task, task.examples("test"), cfg, "test", with_records=True)["fake/test"]
    assert m["pass@1"] == pytest.approx((1 + 0 + 1 / 3 + 2 / 3) / 4)
    assert m["pass@k"] == pytest.approx(3 / 4)
    assert m["tool_calls/mean"] == pytest.approx(6 / 12)  # the 6 right answers searched once
    assert [r["num_correct"] for r in m["records"]] == [3, 0, 1, 2]
    assert all(s["finish_reason"] in ("answer", "eos") for r in m["records"] for s in r["samples"])
    assert {(p.temperature, p.top_p, p.top_k) for p in engine.params} == {(0.6, 0.95, 20)}


def _sample(question: int, right: bool, calls: int, entropies: list[float], mask: list[int]) -> Trajectory:
    """A trajectory with ``calls`` searches whose tokens have these entropies and loss mask."""
    rounds = [Round(start=i, end=i + 1, step_entropy=0.0, tool_call=ToolCall("search", "q", "r")) for i in range(calls)]
    text = f"\\boxed{{gold{question}}}" if right else "\\boxed{nope}"
    return Trajectory(prompt_id=f"q{question}", traj_id=0, parent_id=None, fork_token_index=None, prompt_token_ids=[1],
                      response_token_ids=[7] * len(mask), loss_mask=mask, entropies=entropies, rounds=rounds,
                      finish_reason="answer", response_text=text)


def test_score_groups_reports_hops_tool_efficiency_and_the_entropy_of_the_models_tokens():
    task = FakeTask(3)
    examples = task.examples("test")
    for example, hops, minimum in zip(examples, (1, 2, 2), (1, 2, 3)):
        example.extra_info.update(hops=hops, min_tool_calls=minimum)
    groups = [[_sample(0, True, 1, [1.0, 0.0, 3.0], [1, 0, 1]), _sample(0, False, 0, [2.0], [1])],
              [_sample(1, True, 3, [0.5, 9.0], [1, 0]), _sample(1, True, 2, [0.5], [1])],
              [_sample(2, False, 4, [1.0, 1.0], [1, 1]), _sample(2, False, 2, [4.0, 2.0], [0, 1])]]
    metrics, records = score_groups(task, examples, groups, k=2)

    assert metrics["by_hops"] == {
        "1": {"num_questions": 1, "pass@1": 0.5, "pass@k": 1.0, "tool_calls/mean": 0.5},
        "2": {"num_questions": 2, "pass@1": 0.5, "pass@k": 0.5, "tool_calls/mean": pytest.approx(11 / 4)}}
    # 12 calls for 3 right answers; the right ones call 1 − 1, 3 − 2 and 2 − 2 beyond their question's minimum
    assert metrics["calls_per_correct"] == pytest.approx(4.0) and metrics["tool_productivity"] == pytest.approx(0.25)
    assert metrics["excess_calls/mean"] == pytest.approx(1 / 3)
    # tool-result tokens (mask 0, here entropies 0, 9 and 4) are left out: (1 + 3 + 2 + 0.5 + 0.5 + 1 + 1 + 2) / 8
    assert metrics["entropy/token_mean"] == pytest.approx(11 / 8)
    assert [(r["hops"], r["min_tool_calls"]) for r in records] == [(1, 1), (2, 2), (2, 3)]
    assert records[0]["samples"][0]["model_tokens"] == 2


def test_tool_efficiency_without_hops_calls_or_right_answers_is_undefined_not_zero():
    task = FakeTask(1)
    metrics, _ = score_groups(task, task.examples("test"), [[_sample(0, False, 0, [], [])]], k=1)
    assert metrics["by_hops"] == {}
    assert {key: metrics[key] for key in ("calls_per_correct", "tool_productivity", "excess_calls/mean",
                                          "entropy/token_mean")} == dict.fromkeys(
        ("calls_per_correct", "tool_productivity", "excess_calls/mean", "entropy/token_mean"))


def test_synthetic_min_tool_calls_is_the_teachers_number_of_calls():
    from aepo_rl.config import TaskConfig
    from aepo_rl.tasks.synthetic import TEMPLATES, SyntheticTask

    task = SyntheticTask(TaskConfig(max_hops=3, arithmetic_fraction=0.5, num_train=64, num_dev=8, num_test=64))
    by_name = {t.name: t for t in TEMPLATES}
    examples = task.examples("test")
    for example in examples:
        plan = by_name[example.extra_info["template"]].solve(task.world, example.extra_info["roots"])
        assert example.extra_info["min_tool_calls"] == len(plan.queries) + (plan.python is not None)
    assert {e.extra_info["min_tool_calls"] for e in examples} == {1, 2, 3}  # 3: two searches and python


def test_print_results_shows_tool_efficiency_and_the_hop_levels(capsys):
    from aepo_rl.evaluate import print_results

    m = {"pass@1": 0.5, "pass@k": 0.75, "k": 2, "num_questions": 3, "tool_calls/mean": 2.0, "tool_errors/mean": 0.0,
         "response_length/mean": 10.0, "reward/mean": 0.5, "calls_per_correct": 4.0, "tool_productivity": 0.25,
         "excess_calls/mean": None, "entropy/token_mean": 1.375,
         "by_hops": {"1": {"num_questions": 1, "pass@1": 0.5, "pass@k": 1.0, "tool_calls/mean": 0.5}}}
    print_results({"synthetic/test": m})
    out = capsys.readouterr().out
    assert "calls_per_correct 4.000, tool_productivity 0.250, excess_calls/mean n/a, entropy/token_mean 1.375" in out
    assert "per hop level" in out and "│    1 │         1 │  0.500 │  1.000 │  0.50 │" in out
