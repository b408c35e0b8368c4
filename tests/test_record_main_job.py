"""lab/recorders/record_main_job.py: the main job per seed from an empty cache, the unseen-world evaluation, a
resumable record and its table against the targets (a tiny job here, so the targets' verdicts are arbitrary)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import TINY_PIPELINE

RECORDERS = Path(__file__).parents[1] / "lab" / "recorders"
sys.path.insert(0, str(RECORDERS))
SPEC = importlib.util.spec_from_file_location("record_main_job", RECORDERS / "record_main_job.py")
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


def _entry(seed, wall, sft_stage, rl_stage):
    return {"seed": seed, "wall_s": wall,
            "stages_s": {"task+model+SFT": sft_stage, "SFT eval": 10.0, "RL+eval": rl_stage}}


def test_ratio_avx2_over_default_per_seed_and_in_all():
    avx2 = {"kernels": "avx2", "overrides": [], "seeds": [_entry(0, 300, 120, 170), _entry(1, 200, 100, 90)]}
    default = {"kernels": "default", "overrides": [], "seeds": [_entry(0, 250, 100, 140), _entry(2, 1, 1, 1)]}
    for a, b in ((avx2, default), (default, avx2)):  # either record may be the one being run
        rows = [line for line in record_main_job.ratio_table(a, b).splitlines() if line.startswith("| ")]
        assert rows[0].startswith("| seed | ratio avx2/default: wall")
        assert rows[1] == "| 0 | 1.20 (300 / 250 s) | 1.20 (120 / 100 s) | 1.00 (10 / 10 s) | 1.21 (170 / 140 s) |"
        assert rows[2].startswith("| all | 1.20 (300 / 250 s)") and len(rows) == 3  # seed 1 and 2: one record each
    assert "no seed in both" in record_main_job.ratio_table(avx2, {**default, "seeds": [_entry(5, 1, 1, 1)]})


def test_against_a_record_of_the_same_kernels_is_refused_before_any_seed(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "record.json").write_text(json.dumps({"kernels": "avx2", "overrides": [], "seeds": []}))
    with pytest.raises(SystemExit):
        record_main_job.main(["--out", str(tmp_path / "rec"), "--kernels", "avx2", "--against", str(other)])
    with pytest.raises(SystemExit):  # no record there at all
        record_main_job.main(["--out", str(tmp_path / "rec"), "--against", str(tmp_path / "missing")])
    assert not (tmp_path / "rec" / "seed0").exists()
