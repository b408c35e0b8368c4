"""lab/equivalence: the equivalence study's rules (rules.py) decide as its preregistration.md states, on files
written the way `aepo compare` writes them, and its runner (run.sh) issues the registered commands and refuses
to read outcomes early."""

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import frozen_study

ROOT = Path(__file__).parents[1]
HERE = ROOT / "lab" / "equivalence"
SPEC = importlib.util.spec_from_file_location("equivalence_rules", HERE / "rules.py")
rules = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rules)


def write_run(run, final, kl=0.005, clip=0.001, steps=100):
    run.mkdir(parents=True)
    (run / "eval.json").write_text(json.dumps({"rl": {"synthetic/dev": {"pass@1": final, "k": 8}}}))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "actor/ppo_kl": kl if s != 50 else kl * 1.5, rules.CLIP_KEY: clip}) + "\n"
        for s in range(1, steps + 1)))


def phase_a(tmp_path, finals, kl=None, clip=None, sft=0.30, steps=None):
    """A phase-A folder: SFT dev pass@1 ``sft`` and, per candidate, three seeds' finals (and kl/clip/steps)."""
    out = tmp_path / "phaseA"
    (out / "sft").mkdir(parents=True)
    (out / "sft" / "eval.json").write_text(json.dumps({"sft": {"synthetic/dev": {"pass@1": sft, "k": 8}}}))
    for name in rules.CANDIDATES:
        for i, final in enumerate(finals[name]):
            write_run(out / f"{name}-seed{i}", final, kl=(kl or {}).get(name, 0.005),
                      clip=(clip or {}).get(name, 0.001), steps=(steps or {}).get(name, 100))
    return out


GOOD = {"R0": [0.40, 0.42, 0.41], "R1": [0.38, 0.40, 0.39], "R2": [0.41, 0.43, 0.42], "R3": [0.39, 0.40, 0.41]}


def test_the_largest_upper_clip_fraction_among_qualifying_candidates_is_chosen(tmp_path):
    out = phase_a(tmp_path, GOOD, clip={"R0": 0.0002, "R1": 0.004, "R2": 0.002, "R3": 0.001})
    result = rules.decide(out)
    assert result["qualifying"] == ["R0", "R1", "R2", "R3"] and result["chosen"] == "R1" and result["stop"] is None
    assert result["seed_sd"] == pytest.approx(0.01) and result["paired_sd"] == pytest.approx(0.01 * 2 ** 0.5)
    assert result["n"] == rules.N_MIN


def test_each_criterion_disqualifies_alone(tmp_path):
    finals = {**GOOD, "R1": [0.38, 0.34, 0.39]}  # seed 1 gains 4 points, not 5
    out = phase_a(tmp_path / "gain", finals, kl={"R2": 0.015}, clip={"R1": 0.01, "R2": 0.02, "R3": 0.005},
                  steps={"R3": 99})
    result = rules.decide(out)
    assert result["candidates"]["R2"]["qualifies"] is False  # a step at 0.0225 > 0.02
    assert result["candidates"]["R3"]["qualifies"] is False  # 99 steps
    assert result["candidates"]["R1"]["qualifies"] is False
    assert result["qualifying"] == ["R0"] and result["chosen"] == "R0"


def test_a_tie_goes_to_the_earlier_candidate_and_no_qualifier_stops(tmp_path):
    result = rules.decide(phase_a(tmp_path / "tie", GOOD, clip={name: 0.003 for name in rules.CANDIDATES}))
    assert result["chosen"] == "R0"
    low = {name: [0.31, 0.33, 0.32] for name in rules.CANDIDATES}
    result = rules.decide(phase_a(tmp_path / "none", low))
    assert result["chosen"] is None and "fallback" in result["stop"]


def test_a_paired_sd_above_five_points_stops_before_phase_b(tmp_path):
    wide = {name: [0.36, 0.50, 0.42] for name in rules.CANDIDATES}  # seed SD 0.07, paired 0.099
    result = rules.decide(phase_a(tmp_path, wide))
    assert result["chosen"] == "R0" and result["paired_sd"] > rules.PAIRED_SD_MAX and "no phase B" in result["stop"]


def test_a_missing_dev_entry_names_the_file(tmp_path):
    out = phase_a(tmp_path, GOOD)
    (out / "R2-seed1" / "eval.json").write_text(json.dumps({"rl": {"synthetic/test": {"pass@1": 0.4}}}))
    with pytest.raises(ValueError, match="R2-seed1.*synthetic/dev|R2-seed1.*<task>/dev"):
        rules.decide(out)


def test_the_power_functions_match_a_simulation():
    rng = np.random.default_rng(0)
    n, sd, reps = 14, 0.03, 20000
    d = rng.normal(rules.DELTA, sd, size=(reps, n))
    t = d.mean(1) / (d.std(1, ddof=1) / np.sqrt(n))
    crit = rules.stats.t.ppf(1 - 0.025 / 2, n - 1)
    assert rules.power_paired(n, sd) == pytest.approx(np.mean(np.abs(t) > crit), abs=0.015)
    d0 = rng.normal(0.0, sd, size=(reps, n))
    se = d0.std(1, ddof=1) / np.sqrt(n)
    half = rules.stats.t.ppf(0.95, n - 1) * se
    tost = np.mean((d0.mean(1) - half > -rules.DELTA) & (d0.mean(1) + half < rules.DELTA))
    assert rules.power_tost(n, sd) == pytest.approx(tost, abs=0.03)


def test_the_seed_count_grows_with_the_spread_and_is_capped():
    counts = [rules.seeds_needed(sd)["n"] for sd in (0.01, 0.025, 0.035, 0.045, 0.05)]
    assert counts == sorted(counts) and counts[0] == rules.N_MIN and counts[-1] <= rules.N_MAX
    assert counts[2] == 16  # the preregistration's example: paired SD 3.5 points → 16 seeds
    capped = rules.seeds_needed(0.08)
    assert capped["n"] == rules.N_MAX and capped["capped"] and capped["power_paired"] < rules.POWER


def compare_json(diffs_h1, diffs_h2, base=0.40):
    runs = {"grpo": [], "arpo": [], "aepo": []}
    for i, (d1, d2) in enumerate(zip(diffs_h1, diffs_h2)):
        arpo = base + 0.01 * (i % 3)
        runs["grpo"].append({"seed_index": i, "pass@1": arpo - d2})
        runs["arpo"].append({"seed_index": i, "pass@1": arpo})
        runs["aepo"].append({"seed_index": i, "pass@1": arpo + d1})
    return {"runs": runs}


def test_verdicts_better_equivalent_and_inconclusive():
    rng = np.random.default_rng(1)
    small = list(rng.normal(0.0, 0.01, 16))
    big = list(rng.normal(0.06, 0.01, 16))
    noisy = list(rng.normal(0.0, 0.08, 16))
    result = rules.verdicts(compare_json(big, small))
    assert result["H1"]["verdict"] == "better" and result["H2"]["verdict"].startswith("equivalent")
    result = rules.verdicts(compare_json(noisy, [-x for x in big]))
    assert result["H1"]["verdict"] == "inconclusive" and result["H2"]["verdict"] == "worse"
    assert "| H1: aepo − arpo | 16 |" in rules.verdict_table(result)


def test_holm_steps_down():
    assert rules.holm({"H1": 0.02, "H2": 0.04}) == {"H1": True, "H2": True}
    assert rules.holm({"H1": 0.03, "H2": 0.04}) == {"H1": False, "H2": False}
    assert rules.holm({"H1": 0.001, "H2": 0.2}) == {"H1": True, "H2": False}
    assert rules.holm({"H1": None, "H2": 0.01}) == {"H1": False, "H2": True}


def test_the_preregistration_states_the_rules_constants():
    text = (HERE / "preregistration.md").read_text()
    runner = (HERE / "run.sh").read_text()
    for name in rules.CANDIDATES:
        assert f"| {name} |" in text and f"[{name}]=" in runner
    assert "100, 101, 102" in text and "trainer.seed=100 rollout.seed=100 eval.split=dev" in runner
    assert "0.02" in text and "5 points" in text and "[12, 30]" in text and "±3 points" in text
    assert (rules.PPO_KL_MAX, rules.GAIN_MIN, rules.DELTA, rules.N_MIN, rules.N_MAX) == (0.02, 0.05, 0.03, 12, 30)


@pytest.fixture
def study(tmp_path):
    """A frozen one-commit checkout, a study folder, and a PYTHON recording `-m aepo_rl ARGS`."""
    src, _, fake, calls = frozen_study(tmp_path, {"lab/equivalence/preregistration.md": "x"})
    out = tmp_path / "study"
    env = {**os.environ, "SRC": str(src), "STUDY": str(out), "PYTHON": str(fake)}
    return {"src": src, "out": out, "calls": calls, "env": env}


def run(study, *args):
    return subprocess.run(["bash", str(HERE / "run.sh"), *args], env=study["env"], capture_output=True, text=True,
                          timeout=120)


def test_phase_a_runs_the_registered_arms_on_dev(study):
    (study["out"] / "g4" / "phase0" / "checkpoints" / "sft").mkdir(parents=True)
    assert run(study, "phaseA", "a").returncode == 0
    assert run(study, "phaseA", "b").returncode == 0
    a, b = study["calls"].read_text().splitlines()
    assert a.startswith("compare --arm R0=grpo:3  --arm R1=grpo:3 trainer.mini_batch_size=1 "
                        "algorithm.clip_ratio_low=0.1")
    assert "--arm R2=grpo:3 trainer.batch_size=16 trainer.mini_batch_size=2 --arm R3=grpo:3" in b
    for line in (a, b):
        assert f"--steps 100 --out {study['out']}/g4/phaseA task.max_hops=3" in line
        assert line.endswith("trainer.eval_every=0 trainer.seed=100 rollout.seed=100 eval.split=dev")


def test_phase_b_needs_registration_and_tables_refuse_unfinished_runs(study):
    w = study["out"] / "g4"
    (w / "phase0" / "checkpoints" / "sft").mkdir(parents=True)
    (w / "phaseA").mkdir()
    (w / "phaseA" / "decision.json").write_text(json.dumps({"chosen": "R1", "n": 2}))
    (w / "phaseA" / "optimizer.txt").write_text("trainer.mini_batch_size=1\n")
    refused = run(study, "phaseB")
    assert refused.returncode != 0 and "register" in refused.stderr
    assert run(study, "register", "HEAD").returncode == 0
    assert run(study, "phaseB").returncode == 0
    issued = sorted(study["calls"].read_text().splitlines())
    assert [re.search(r"--presets (\S+)", line).group(1) for line in issued] == ["aepo:2", "arpo:1", "arpo:2", "grpo:2"]
    assert all(line.endswith("trainer.eval_every=0 trainer.mini_batch_size=1") for line in issued)
    early = run(study, "tables")
    assert early.returncode != 0 and "6 of 6 phase-B runs are not finished" in early.stderr
