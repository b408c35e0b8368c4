"""Two `aepo compare` processes on disjoint arms of one output folder, on a tiny real run (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_PIPELINE

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_two_processes_share_one_sft_model_and_the_union_tabulates_every_arm(tmp_path):
    out = tmp_path / "cmp"
    common = ["--seeds", "1", "--steps", "2", "--out", str(out),
              *(f"{k}={v}" for k, v in {**TINY_PIPELINE, "model.cache_dir": tmp_path / "cache"}.items())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    arms = {"first": ["--presets", "grpo"],
            "second": ["--presets", "arpo", "--arm", "arpo_w0=arpo rollout.entropy_weight=0 rollout.n=3"]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "aepo_rl", "compare", *given, *common], env=env,
                                    cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, given in arms.items()}
    logs = {name: proc.communicate(timeout=900)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, logs[name][-3000:]
    # one process trained the SFT model, the other waited for it and reused it
    assert sorted("cold-start SFT" in log for log in logs.values()) == [False, True]
    assert sum("SFT model found" in log for log in logs.values()) == 1
    for run in ("grpo-seed0", "arpo-seed0", "arpo_w0-seed0"):
        assert "rl" in json.loads((out / run / "eval.json").read_text())

    union = subprocess.run([sys.executable, "-m", "aepo_rl", "compare", "--table-only", "--presets", "grpo,arpo",
                            "--arm", "arpo_w0=arpo rollout.entropy_weight=0 rollout.n=3", *common],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert union.returncode == 0, union.stdout[-3000:] + union.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    assert list(data["arms"]) == ["grpo", "arpo", "arpo_w0"] and data["unfinished"] == []
    assert data["arms"]["arpo_w0"] == {"name": "arpo_w0", "preset": "arpo", "seeds": 1,
                                       "overrides": {"rollout.entropy_weight": 0, "rollout.n": 3}}
    assert data["reference"] == "grpo" and set(data["paired_differences"]) == {"arpo", "arpo_w0"}
    assert {c["name"] for c in data["columns"]} >= {"pass@1", "eval_entropy", "train_tool_calls", "train_decode_tokens",
                                                    "entropy_drift"}
    assert all(run["train_decode_tokens"] > 0 for rows in data["runs"].values() for run in rows)
    md = (out / "compare.md").read_text()
    assert "- arm **arpo_w0**: preset arpo, rollout.entropy_weight=0, rollout.n=3" in md
