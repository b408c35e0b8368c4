"""benchmarks/record_main_job.py: the main job per seed from an empty cache, the unseen-world evaluation, a
resumable record and its table against the targets (a tiny job here, so the targets' verdicts are arbitrary)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from test_pipeline import TINY_PIPELINE

BENCH = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
SPEC = importlib.util.spec_from_file_location("record_main_job", BENCH / "record_main_job.py")
record_main_job = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(record_main_job)

OVERRIDES = [f"{key}={value}" for key, value in TINY_PIPELINE.items() if key != "trainer.run_name"]


def test_a_seed_recorded_then_resumed(tmp_path, capsys):
    out = tmp_path / "rec"
    assert record_main_job.main(["--out", str(out), "--seeds", "1", "--kernels", "default", *OVERRIDES]) == 0
    record = json.loads((out / "record.json").read_text())
    assert [e["seed"] for e in record["seeds"]] == [1] and record["kernels"] == "default"
    for entry in record["seeds"]:
        assert entry["wall_s"] > 0 and entry["peak_rss_gb"] > 0.05
        assert set(entry["stages_s"]) == {"task+model+SFT", "SFT eval", "RL+eval"}
        assert 0 <= entry["unseen"]["pass@1"] <= 1 and entry["unseen"]["task.seed"] == 7
        assert (out / f"seed{entry['seed']}" / "unseen.json").is_file()
        assert (out / f"cache-{entry['seed']}").is_dir()  # each seed built its own tiny model
    table = (out / "record.md").read_text()
    assert "\n| 1 | " in table and "Targets on every seed" in table
    capsys.readouterr()
    assert record_main_job.main(["--out", str(out), "--seeds", "1", "--kernels", "default", *OVERRIDES]) == 0
    assert "seed 1: recorded" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # another kernel set or other overrides need another folder
        record_main_job.main(["--out", str(out), "--seeds", "0", "--kernels", "avx2", *OVERRIDES])


def test_stage_times_parse_a_wrapped_last_line():
    text = "table\ndone in 330 s (task+model+SFT 212 s, SFT eval 9 s,\nRL+eval 108 s); results in runs/x\n"
    assert record_main_job.stage_seconds(text) == {"task+model+SFT": 212.0, "SFT eval": 9.0, "RL+eval": 108.0}


def test_targets_per_seed():
    entry = {"wall_s": 590, "sft": {"pass@1": 0.31}, "rl": {"pass@1": 0.42}, "unseen": {"pass@1": 0.34}}
    assert record_main_job.checks(entry) == {"sft": True, "gain": True, "unseen": True, "wall": True}
    entry = {"wall_s": 601, "sft": {"pass@1": 0.29}, "rl": {"pass@1": 0.38}, "unseen": {"pass@1": 0.30}}
    assert record_main_job.checks(entry) == {"sft": False, "gain": False, "unseen": False, "wall": False}


def test_an_unseen_world_among_the_seeds_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        record_main_job.main(["--out", str(tmp_path), "--seeds", "6,7", "--unseen-seed", "7"])
