"""examples/study/study_rules.py: the study's gate, calibration rule and AEPO mechanism check decide as
docs/preregistration.md states, on metrics written the way the trainer and `aepo eval` write them."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("study_rules", Path(__file__).parents[1] / "examples" / "study" / "study_rules.py")
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
        out[s] = {"step": s, "actor/pg_clipfrac": clip if s >= 6 else 0.0, "actor/pg_loss": None if s == nan_loss_at else 0.1,
                  "actor/grad_norm": 1.0, "critic/score/mean": early if s <= 5 else late, "actor/grad_preserved_frac": 0.01}
        if s == skip_at:
            out[s]["actor/skipped_nonfinite_grad"] = 0.125
    return out


def test_calibration_rule():
    assert rules.calibration(steps())["meets"]
    assert rules.calibration(steps(late=0.3))["meets"]  # equal score is not a fall
    for bad in (dict(clip=0.009), dict(clip=0.11), dict(late=0.29), dict(skip_at=7), dict(nan_loss_at=3), dict(last=19)):
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
    assert json.loads((tmp_path / "rule.json").read_text())["figures"]["grad_preserved_frac_mean"] == pytest.approx(0.01)
