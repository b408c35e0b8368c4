"""lab/study/study_rules.py: the study's gate, calibration rule and AEPO mechanism check decide as
lab/study/preregistration.md states, on metrics written the way the trainer and `aepo eval` write them."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("study_rules",
                                              Path(__file__).parents[1] / "lab" / "study" / "study_rules.py")
rules = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rules)


def evaluation(p1=0.35, pk=0.52, top=0.24, calls=1.87):
    return {"synthetic/test": {"pass@1": p1, "pass@k": pk, "k": 8, "num_questions": 256, "tool_calls/mean": calls,
                               "by_hops": {"1": {"pass@1": 0.49}, "2": {"pass@1": 0.26}, "3": {"pass@1": top}}}}


def test_gate_clears_and_each_criterion_can_fail():
    assert rules.gate(evaluation())["clears"]
    for bad in (dict(p1=0.10, pk=0.3), dict(p1=0.65, pk=0.8), dict(pk=0.40), dict(top=0.04), dict(calls=1.79)):
        result = rules.gate(evaluation(**bad))
        assert not result["clears"] and sum(not v for v in result["criteria"].values()) == 1, bad


def test_gate_refuses_an_evaluation_without_hop_levels():
    ev = evaluation()
    del ev["synthetic/test"]["by_hops"]
    with pytest.raises(ValueError, match="by_hops"):
        rules.gate(ev)


def steps(clip=0.05, early=0.3, late=0.35, skip_at=None, nan_loss_at=None, last=20):
    out = {}
    for s in range(1, last + 1):
        out[s] = {"step": s, "actor/pg_clipfrac": clip if s >= 6 else 0.0,
                  "actor/pg_loss": None if s == nan_loss_at else 0.1, "actor/grad_norm": 1.0,
                  "critic/score/mean": early if s <= 5 else late, "actor/grad_preserved_frac": 0.01}
        if s == skip_at:
            out[s]["actor/skipped_nonfinite_grad"] = 0.125
    return out


def test_calibration_rule():
    assert rules.calibration(steps())["meets"]
    assert rules.calibration(steps(late=0.3))["meets"]  # equal score is not a fall
    for bad in (dict(clip=0.009), dict(clip=0.11), dict(late=0.29), dict(skip_at=7), dict(nan_loss_at=3),
                dict(last=19)):
        assert not rules.calibration(steps(**bad))["meets"], bad


def test_read_steps_keeps_the_last_record_of_a_step(tmp_path):
    records = [{"step": 1, "critic/score/mean": 0.0}, {"step": 2, "critic/score/mean": 0.0},
               {"step": 2, "critic/score/mean": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert rules.read_steps(tmp_path)[2]["critic/score/mean"] == 1.0


def test_preserved_check_reads_only_the_mechanism_metric(tmp_path):
    good = steps()
    assert rules.preserved(good)["meets"]
    for record in good.values():
        record["actor/grad_preserved_frac"] = 0.004
    assert not rules.preserved(good)["meets"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps().values()))
    assert rules.main(["preserved", str(tmp_path), str(tmp_path / "rule.json")]) == 0
    figures = json.loads((tmp_path / "rule.json").read_text())["figures"]
    assert figures["grad_preserved_frac_mean"] == pytest.approx(0.01)


def study_runs(aepo_gain=0.0, arpo_gain=0.0, noise=0.01, extra=None):
    extra = extra or {}
    """compare.json-like ``runs``: every arm's per-seed values, grpo at 0.30 pass@1 plus a per-seed term."""
    gains = {"grpo": 0.0, "arpo": arpo_gain, "aepo": arpo_gain + aepo_gain, "gppo": 0.0, "aepo_no_sg_clip": arpo_gain,
             "aepo_no_branch_penalty": arpo_gain + aepo_gain, "arpo_random": arpo_gain}
    seeds = {"grpo": 8, "arpo": 8, "aepo": 8, "gppo": 5, "aepo_no_sg_clip": 5, "aepo_no_branch_penalty": 5,
             "arpo_random": 5}
    wiggle = [0.0, 1.0, -1.0, 0.5, -0.5, 0.8, -0.8, 0.0]
    runs = {}
    for arm, n in seeds.items():
        runs[arm] = [{"seed_index": i, "pass@1": 0.30 + gains[arm] + noise * wiggle[i] * (arm == "aepo"),
                      "pass@k": 0.50, "eval_entropy": 0.2, "excess_calls": 0.1, "largest_subtree": 0.5,
                      "rollout/consecutive_branch_share/l2": 0.1, "rollout/consecutive_branch_share/l3plus": 0.05,
                      "actor/pg_clipfrac": 0.02, "actor/pg_clipfrac_high_entropy": 0.08,
                      "rollout/entropy_leverage": 0.2,
                      **extra.get(arm, {})} for i in range(n)]
    return runs


def by_claim(results, claim, arm, other):
    (row,) = [r for r in results if r["claim"] == claim and r["arm"] == arm and r["other"] == other]
    return row


def test_primary_verdicts_follow_holm_and_the_sesoi():
    big = rules.verdicts(study_runs(aepo_gain=0.06, arpo_gain=0.05))
    assert by_claim(big, "H1", "aepo", "arpo")["verdict"] == "confirmed"
    none = rules.verdicts(study_runs())
    assert by_claim(none, "H1", "aepo", "arpo")["verdict"] == "refuted"  # CI within ±1 point: below the SESOI
    noisy = rules.verdicts(study_runs(aepo_gain=0.02, noise=0.2))
    assert by_claim(noisy, "H1", "aepo", "arpo")["verdict"] == "inconclusive"


def test_paired_differences_per_seed():
    t = rules.paired(study_runs(aepo_gain=0.05), "aepo", "arpo", "pass@1")
    assert t["n"] == 8 and t["mean"] == pytest.approx(0.05) and t["low"] < 0.05 < t["high"] and t["p"] < 0.001
    assert rules.paired(study_runs(), "gppo", "aepo", "pass@1")["n"] == 5  # only the seed indices both ran


def test_secondary_verdicts():
    runs = study_runs(extra={"aepo": {"eval_entropy": 0.3, "largest_subtree": 0.3, "excess_calls": -0.2,
                                      "rollout/consecutive_branch_share/l2": 0.02}})
    for row in runs["aepo"]:
        row["eval_entropy"] += 0.01 * row["seed_index"]  # spread, so the interval has a width
        row["largest_subtree"] += 0.01 * row["seed_index"]
        row["excess_calls"] += 0.01 * row["seed_index"]
        row["rollout/consecutive_branch_share/l2"] += 0.001 * row["seed_index"]
    results = rules.verdicts(runs)
    assert by_claim(results, "E", "aepo", "arpo")["verdict"] == "confirmed"
    assert by_claim(results, "B", "aepo", "arpo")["verdict"] == "confirmed"
    assert by_claim(results, "T2", "aepo", "grpo")["verdict"] == "confirmed"
    assert by_claim(results, "G", "arpo", "arpo_random")["verdict"] == "refuted"  # equal arms, clipping present
    # identical pass@8: the interval is [0, 0]
    assert by_claim(results, "X", "aepo", "grpo")["verdict"] == "inconclusive"
    table = rules.verdict_table(results)
    assert table.count("\n") == len(results) + 2 and "| H1 | aepo − arpo | pass@1 |" in table
