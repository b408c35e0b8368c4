"""The RL stage with ``rollout.engine=vllm`` (real vLLM, CPU build): the engine is built from the SFT
folder, gets the policy's weights after every update, and its log-probs stay those of the trained
policy (``rollout/logprob_abs_diff``). Marked ``vllm``; skipped, with the reason, without vLLM."""

from __future__ import annotations

import json
import math

import pytest
from helpers import VaryingRewardTask, build_qwen3

from aepo_rl.config import load_config
from aepo_rl.models import save_policy
from aepo_rl.train.pipeline import check_rl_engine, run_rl_stage

pytestmark = pytest.mark.vllm

TINY = {
    "task.num_train": 8, "task.num_dev": 2, "task.num_test": 2, "task.num_demonstrations": 8,
    "rollout.n": 2, "rollout.max_response_length": 32, "rollout.max_tokens_per_round": 12,
    "rollout.premonitor_probe_tokens": 4, "trainer.batch_size": 2, "trainer.mini_batch_size": 1,
    "trainer.micro_batch_size": 2, "trainer.steps": 3, "trainer.lr": 1e-2, "trainer.tensorboard": False,
    "eval.samples": 1, "eval.num_questions": 2, "rollout.engine": "vllm", "rollout.entropy_measure": "surprisal",
    "rollout.vllm_max_model_len": 1024, "rollout.vllm_enforce_eager": True,
}


def test_three_rl_steps_with_vllm_rollouts_track_the_trained_policy(tiny_tokenizer, tmp_path):
    cfg = load_config(overrides={**TINY, "trainer.run_dir": str(tmp_path / "runs"),
                                 "model.cache_dir": str(tmp_path / "cache")})
    check_rl_engine(cfg)
    sft_dir = save_policy(build_qwen3(tiny_tokenizer, seed=3), tiny_tokenizer, tmp_path / "sft")
    results = run_rl_stage(cfg, str(sft_dir), tmp_path / "run", task=VaryingRewardTask())
    assert results["fake/test"]["num_questions"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert math.isfinite(record["actor/pg_loss"]) and math.isfinite(record["actor/grad_norm"]), record
        assert record["rollout/logprob_abs_diff"] <= 1e-3, record["rollout/logprob_abs_diff"]
        assert record["timing_s/weight_sync"] >= 0
    assert all(r["actor/grad_norm"] > 0 for r in records)  # the policy moved: later rollouts need the synced weights
    print("rollout/logprob_abs_diff per step:", [f"{r['rollout/logprob_abs_diff']:.2e}" for r in records],
          "grad norms:", [f"{r['actor/grad_norm']:.3f}" for r in records])


def test_aepo_train_with_vllm_rollouts_end_to_end(tmp_path):
    """The whole pipeline (synthetic task with its bm25s search, tiny model, SFT, evaluation, RL) on vLLM:
    two engines in one process (the SFT evaluation's, then the RL stage's)."""
    from aepo_rl.cli import main

    overrides = {**TINY, "task.num_test": 2, "model.tiny_init": "random", "model.tiny_hidden_size": 64,
                 "model.tiny_num_layers": 1,
                 "model.tiny_intermediate_size": 64, "model.tiny_vocab_size": 400, "model.tiny_num_heads": 2,
                 "model.tiny_num_kv_heads": 1, "model.tiny_head_dim": 32, "model.tiny_copy_steps": 2,
                 "sft.epochs": 1, "sft.batch_size": 8, "trainer.run_name": "e2e",
                 "trainer.run_dir": str(tmp_path / "runs"), "model.cache_dir": str(tmp_path / "cache")}
    del overrides["trainer.tensorboard"]
    assert main(["train", *[f"{key}={value}" for key, value in overrides.items()]]) == 0
    run = tmp_path / "runs" / "e2e"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["actor/pg_loss"]) and r["rollout/logprob_abs_diff"] <= 1e-3 for r in records)
    assert sorted(json.loads((run / "eval.json").read_text())) == ["rl", "sft"]
