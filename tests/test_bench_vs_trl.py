"""benchmarks/bench_vs_trl.py at a tiny size: both steps run on TRL's real GRPOTrainer and ours, and the check
that they generated the same tokens holds, and fails when they did not (no wall-clock assertion)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None,
                                reason="trl is not installed (pip install trl): the benchmark compares against it")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vs_trl.py"
TINY = ["model.tiny_init=random", "model.tiny_hidden_size=32", "model.tiny_num_layers=1",
        "model.tiny_intermediate_size=64",
        "model.tiny_num_heads=2", "model.tiny_num_kv_heads=1", "model.tiny_head_dim=16", "model.tiny_vocab_size=400",
        "trainer.batch_size=2", "rollout.n=2", "trainer.micro_batch_size=2"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vs_trl", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through the module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def tiny(bench):
    cfg = bench.bench_config("grpo", [*TINY, "rollout.max_response_length=5"])
    model, tokenizer = bench.build_model(cfg)
    return cfg, model, tokenizer, bench.questions(cfg.trainer.batch_size)


def test_the_config_fixes_single_turn_exact_length_one_optimizer_step(tiny):
    cfg = tiny[0]
    assert cfg.rollout.mode == "independent" and cfg.rollout.ignore_eos
    assert cfg.rollout.min_tokens == cfg.rollout.max_tokens_per_round == cfg.rollout.max_response_length == 5
    assert cfg.trainer.mini_batch_size == cfg.trainer.batch_size


def test_one_round_of_both_steps_generates_the_same_tokens(bench, tiny):
    cfg, model, tokenizer, texts = tiny
    [(ours, trl)] = bench.run_rounds(cfg, model, tokenizer, texts, rounds=1)
    assert ours.completion_tokens == trl.completion_tokens == 2 * 2 * 5
    assert ours.prompt_tokens == trl.prompt_tokens > 0
    for step in (ours, trl):
        assert step.total > 0 and step.gen > 0 and step.update > 0


def test_steps_of_different_lengths_are_refused(bench, tiny):
    cfg, model, tokenizer, texts = tiny
    shorter = bench.bench_config("grpo", [*TINY, "rollout.max_response_length=4"])
    with pytest.raises(bench.TokenCountMismatch, match="generated tokens ours 20, TRL 16"):
        bench.run_rounds(cfg, model, tokenizer, texts, rounds=1, trl_cfg=shorter)


def test_the_token_check_compares_both_counts(bench):
    step = bench.StepTime(total=1.0, gen=0.5, update=0.5, completion_tokens=20, prompt_tokens=30)
    bench.check_tokens(step, step, expected=20)
    for other in (bench.StepTime(1.0, 0.5, 0.5, 19, 30), bench.StepTime(1.0, 0.5, 0.5, 20, 31)):
        with pytest.raises(bench.TokenCountMismatch):
            bench.check_tokens(step, other, expected=20)
    with pytest.raises(bench.TokenCountMismatch):
        bench.check_tokens(step, step, expected=21)
