"""lab/gpu/gpu_probe.py, the memory probe of docs/gpu.md, run dry on the CPU with a small registered shape."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "lab" / "gpu" / "gpu_probe.py"


@pytest.fixture(scope="module")
def gpu_probe():
    spec = importlib.util.spec_from_file_location("gpu_probe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plans_are_parsed_or_named_in_the_error(gpu_probe):
    assert gpu_probe.parse_plan("qwen3-8b:full") == ("qwen3-8b", 0)
    assert gpu_probe.parse_plan("qwen3-8b:lora64") == ("qwen3-8b", 64)
    for bad in ("qwen3-8b", "qwen3-8b:lora", "qwen3-8b:lora0", "qwen3-8b:half"):
        with pytest.raises(SystemExit, match=f"'{bad}' must be <architecture>:full or <architecture>:lora<rank>"):
            gpu_probe.parse_plan(bad)


def test_a_dry_run_trains_every_weight_or_only_the_adapters(gpu_probe, mini_architecture, tmp_path, capsys):
    name = mini_architecture.removeprefix("random:")
    out = tmp_path / "probe.json"
    assert gpu_probe.main(["--device", "cpu", "--plans", f"{name}:full", f"{name}:lora4", "--tokens", "32",
                           "--vocab", "300", "--out", str(out)]) == 0
    full, lora = json.loads(out.read_text())
    assert full["trainable"] == full["parameters"] > 0
    # rank-4 adapters on q, k, v, o of 2 layers (hidden 64; q and o are 4 heads x 16, k and v 2 x 16)
    assert lora["trainable"] == 2 * 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64))
    assert lora["parameters"] == full["parameters"] + lora["trainable"]
    assert all(torch.isfinite(torch.tensor(r["loss"])) and r["seconds"] >= 0 and r["peak_gib"] is None
               for r in (full, lora))
    assert f"{name}:lora4" in capsys.readouterr().out
