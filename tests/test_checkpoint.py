"""Atomic writes, checkpoint rotation, RNG state, and exact resume of the RL stage."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
from helpers import TINY_RL, VaryingRewardTask, build_tiny_model
from safetensors.torch import load_file

from aepo_rl.config import load_config
from aepo_rl.models import save_policy
from aepo_rl.train import checkpoint as ckpt
from aepo_rl.train.pipeline import run_rl_stage


def test_atomic_write_replaces_the_file_or_leaves_it_untouched(tmp_path, monkeypatch):
    target = tmp_path / "eval.json"
    ckpt.atomic_write_text(target, "first")
    ckpt.atomic_write_text(target, "second")
    assert target.read_text() == "second"

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.atomic_write_text(target, "third")
    assert target.read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # no temporary file left behind


def test_checkpoints_rotate_and_partial_ones_are_ignored(tmp_path, tiny_tokenizer, tiny_model):
    folder = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ckpt.save_checkpoint(folder, step, tiny_model, tiny_tokenizer, {"step": step}, keep=2)
    assert [p.name for p in ckpt.step_dirs(folder)] == ["step_000002", "step_000003"]
    (folder / ".tmp-step_000004-abc").mkdir()  # a save killed half-way
    assert ckpt.latest_checkpoint(folder).name == "step_000003"
    assert ckpt.load_trainer_state(folder / "step_000003") == {"step": 3}
    assert (folder / "step_000003" / "model" / "config.json").is_file()
    ckpt.remove_partial_checkpoints(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["step_000002", "step_000003"]


def test_an_older_checkpoint_with_the_slot_baselines_beside_the_trainer_state_loads(tmp_path):
    """Before the trainer owned its rollout state, the §1.4 release-quirk baselines sat at the top level."""
    torch.save({"trainer": {"global_step": 1}, "slot_baselines": {0: 2.0}}, tmp_path / "trainer_state.pt")
    assert ckpt.load_trainer_state(tmp_path) == {"trainer": {"global_step": 1, "rollout": {"slot_baselines": {0: 2.0}}}}


def test_rng_state_round_trip_covers_python_numpy_torch_and_the_engine():
    class Engine:
        generator = torch.Generator().manual_seed(5)

    engine = Engine()
    state = ckpt.rng_state(engine)
    expected = (random.random(), np.random.rand(), torch.rand(1).item(),
                torch.rand(1, generator=engine.generator).item())
    ckpt.set_rng_state(state, engine)
    assert (random.random(), np.random.rand(), torch.rand(1).item(),
            torch.rand(1, generator=engine.generator).item()) == expected


RESUME_CFG = {**TINY_RL, "trainer.steps": 3, "trainer.tensorboard": False, "eval.num_questions": 2,
              "eval.samples": 1, "trainer.rollouts_to_save": 2}


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "train/tokens_per_s"))} for r in records]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, tiny_tokenizer, lora_rank):
    """3 steps straight vs 2 steps, stop, resume for the third: same metrics and weights (also with LoRA)."""
    init_dir = str(save_policy(build_tiny_model(tiny_tokenizer, seed=1), tiny_tokenizer, tmp_path / "init"))
    task = VaryingRewardTask()
    cfg = {**RESUME_CFG, "model.lora_rank": lora_rank}
    straight = run_rl_stage(load_config("aepo", overrides=cfg), init_dir, tmp_path / "straight", task=task)
    run_rl_stage(load_config("aepo", overrides={**cfg, "trainer.steps": 2}), init_dir, tmp_path / "resumed", task=task)
    assert [p.name for p in ckpt.step_dirs(tmp_path / "resumed" / "checkpoints")] == ["step_000001", "step_000002"]
    resumed = run_rl_stage(load_config("aepo", overrides=cfg), init_dir, tmp_path / "resumed", task=task)

    def records(run):
        return [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert [r["step"] for r in records("resumed")] == [1, 2, 3]
    assert _without_timing(records("resumed")) == _without_timing(records("straight"))
    assert resumed == straight  # the final evaluation
    a, b = (load_file(tmp_path / run / "checkpoints" / "step_000003" / "model" / "model.safetensors")
            for run in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    states = [ckpt.load_trainer_state(tmp_path / run / "checkpoints" / "step_000003")
              for run in ("straight", "resumed")]
    assert states[0]["trainer"]["data_order"] == states[1]["trainer"]["data_order"]
    assert any(r["actor/grad_norm"] > 0 for r in records("straight"))  # the steps really trained


def _aepo_train(tmp_path):
    """The tiny 4-step `aepo train` overrides writing under ``tmp_path``, and a starter of `aepo train` subprocesses."""
    import subprocess
    import sys

    from helpers import TINY_PIPELINE

    overrides = [f"{k}={v}" for k, v in {**TINY_PIPELINE, "trainer.steps": 4, "trainer.tensorboard": False,
                                          "trainer.run_dir": str(tmp_path), "model.cache_dir": str(tmp_path / "cache")
                                          }.items() if k != "trainer.run_name"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def aepo(*args):
        return subprocess.Popen([sys.executable, "-m", "aepo_rl", "train", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    return overrides, aepo


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_matches_the_uninterrupted_run(tmp_path):
    """`aepo train` killed with SIGKILL after its 2nd checkpoint, then `--resume`: same metrics and evaluation."""
    import signal

    overrides, aepo = _aepo_train(tmp_path)
    assert aepo(*overrides, "trainer.run_name=straight").wait(timeout=600) == 0
    victim = aepo(*overrides, "trainer.run_name=killed")
    _wait_for(tmp_path / "killed" / "checkpoints" / "step_000002", victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert ckpt.latest_checkpoint(tmp_path / "killed" / "checkpoints").name == "step_000002"
    resumed = aepo("--resume", str(tmp_path / "killed"))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()

    def records(run):
        return _records(tmp_path / run)

    assert [r["step"] for r in records("killed")] == [1, 2, 3, 4]
    assert records("killed") == records("straight")
    assert json.loads((tmp_path / "killed" / "eval.json").read_text()) == \
        json.loads((tmp_path / "straight" / "eval.json").read_text())


def _records(run_dir):
    """The run's metrics.jsonl records without their timing fields."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return _without_timing([json.loads(line) for line in lines])


def _wait_for(path, process, timeout: float = 600):
    """Wait until ``path`` exists while ``process`` is still running (its stderr on failure)."""
    import time

    deadline = time.time() + timeout
    while not path.exists():
        assert process.poll() is None and time.time() < deadline, process.stderr.read().decode()
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_mid_rl_saves_and_the_resumed_run_matches_the_uninterrupted_run(tmp_path):
    """`aepo train` sent SIGTERM (a job scheduler's stop) during RL: it finishes the step, saves, exits 130;
    `--resume` then ends with the metrics, weights and evaluation of a run never stopped."""
    import signal

    overrides, aepo = _aepo_train(tmp_path)
    assert aepo(*overrides, "trainer.run_name=straight").wait(timeout=600) == 0
    stopped = aepo(*overrides, "trainer.run_name=stopped")
    _wait_for(tmp_path / "stopped" / "checkpoints" / "step_000001", stopped)
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=600) == 130, stopped.stderr.read().decode()
    done = [int(p.name.split("_")[1]) for p in ckpt.step_dirs(tmp_path / "stopped" / "checkpoints")]
    assert 1 <= max(done) < 4  # saved on the way out, before the end
    resumed = aepo("--resume", str(tmp_path / "stopped"))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()

    def records(run):
        return _records(tmp_path / run)

    assert [r["step"] for r in records("stopped")] == [1, 2, 3, 4]
    assert records("stopped") == records("straight")
    a, b = (load_file(tmp_path / run / "checkpoints" / "step_000004" / "model" / "model.safetensors")
            for run in ("straight", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "stopped" / "eval.json").read_text()) == \
        json.loads((tmp_path / "straight" / "eval.json").read_text())
