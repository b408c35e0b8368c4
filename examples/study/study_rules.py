"""The study's mechanical rules (docs/preregistration.md): the phase-0 gate, the phase-1 calibration rule
and the AEPO mechanism check, applied to the files the frozen commit writes. No rule reads an ARPO or AEPO
score: ``preserved`` reads only ``actor/grad_preserved_frac`` of the AEPO run's metrics.jsonl.

    python study_rules.py gate EVAL_JSON OUT_JSON            # phase 0: exit 0 iff the gate is cleared
    python study_rules.py calibration RUN_DIR OUT_JSON       # phase 1: exit 0 iff the candidate meets the rule
    python study_rules.py preserved RUN_DIR OUT_JSON         # phase 1: exit 0 iff grad_preserved_frac >= 0.005
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

GATE = {"pass@1_min": 0.15, "pass@1_max": 0.60, "gap_min": 0.08, "top_hop_pass@1_min": 0.05, "calls_min": 1.8}
"""docs/preregistration.md, test pass@1 in [0.15, 0.60], pass@k − pass@1 ≥ 0.08, pass@1 ≥ 0.05 on the hardest
hop level, ≥ 1.8 tool calls per answer."""
CALIBRATION = {"steps": 20, "clip_window": (6, 20), "clip_min": 0.01, "clip_max": 0.10,
               "early": (1, 5), "late": (16, 20)}
"""docs/preregistration.md, mean actor/pg_clipfrac over steps 6–20 in [0.01, 0.10]; no skipped non-finite step;
mean critic/score/mean (the step's mean trajectory score) of steps 16–20 ≥ that of steps 1–5."""
PRESERVED_MIN = 0.005
"""docs/preregistration.md, AEPO at the chosen setting keeps a gradient on ≥ 0.5% of tokens (actor/grad_preserved_frac)."""
SCORE = "critic/score/mean"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def gate(eval_result: dict) -> dict:
    """The phase-0 gate on an `aepo eval --out` file: ``{"figures", "criteria", "clears"}``."""
    (name, m), = [(k, v) for k, v in eval_result.items() if k.endswith("/test")]
    hops = m.get("by_hops") or {}
    if not hops:
        raise ValueError(f"{name}: no by_hops in the evaluation (made by an aepo-rl without per-hop results?)")
    top = max(hops, key=int)
    figures = {"evaluation": name, "k": m["k"], "num_questions": m["num_questions"], "pass@1": m["pass@1"],
               "pass@k": m["pass@k"], "gap": m["pass@k"] - m["pass@1"], "top_hop": int(top),
               "top_hop_pass@1": hops[top]["pass@1"], "calls_per_answer": m["tool_calls/mean"],
               "by_hops": hops, **{key: m.get(key) for key in ("calls_per_correct", "tool_productivity",
                                                                 "excess_calls/mean", "entropy/token_mean")}}
    criteria = {
        f"pass@1 in [{GATE['pass@1_min']}, {GATE['pass@1_max']}]": GATE["pass@1_min"] <= m["pass@1"] <= GATE["pass@1_max"],
        f"pass@{m['k']} - pass@1 >= {GATE['gap_min']}": figures["gap"] >= GATE["gap_min"],
        f"{top}-hop pass@1 >= {GATE['top_hop_pass@1_min']}": hops[top]["pass@1"] >= GATE["top_hop_pass@1_min"],
        f"tool calls per answer >= {GATE['calls_min']}": m["tool_calls/mean"] >= GATE["calls_min"],
    }
    return {"figures": figures, "criteria": criteria, "clears": all(criteria.values())}


def read_steps(run_dir: Path) -> dict[int, dict]:
    """``{step: record}`` of metrics.jsonl; a step logged twice (re-run after a resume) keeps its last record."""
    steps = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps[int(record["step"])] = record
    return steps


def _window_mean(steps: dict[int, dict], key: str, window: tuple[int, int]) -> float | None:
    values = [steps[s].get(key) for s in range(window[0], window[1] + 1)]
    return math.fsum(values) / len(values) if all(_finite(v) for v in values) else None


def calibration(steps: dict[int, dict]) -> dict:
    """The phase-1 calibration rule on a GRPO run's per-step metrics: ``{"figures", "criteria", "meets"}``."""
    rule = CALIBRATION
    missing = [s for s in range(1, rule["steps"] + 1) if s not in steps]
    nonfinite = [s for s, r in sorted(steps.items())
                 if (r.get("actor/skipped_nonfinite_grad") or 0) > 0
                 or not all(_finite(r.get(k)) for k in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac"))]
    clip = _window_mean(steps, "actor/pg_clipfrac", rule["clip_window"]) if not missing else None
    early = _window_mean(steps, SCORE, rule["early"]) if not missing else None
    late = _window_mean(steps, SCORE, rule["late"]) if not missing else None
    figures = {"steps_logged": len(steps), "missing_steps": missing, "nonfinite_steps": nonfinite,
               "pg_clipfrac_mean_6_20": clip, f"{SCORE}_mean_1_5": early, f"{SCORE}_mean_16_20": late,
               "pg_clipfrac_by_step": [steps[s].get("actor/pg_clipfrac") for s in sorted(steps)],
               "score_by_step": [steps[s].get(SCORE) for s in sorted(steps)]}
    criteria = {
        f"all {rule['steps']} steps logged": not missing,
        f"mean actor/pg_clipfrac over steps 6-20 in [{rule['clip_min']}, {rule['clip_max']}]":
            clip is not None and rule["clip_min"] <= clip <= rule["clip_max"],
        "no skipped non-finite step (actor/skipped_nonfinite_grad, finite pg_loss and grad_norm)": not nonfinite,
        f"mean {SCORE} of steps 16-20 >= that of steps 1-5": early is not None and late is not None and late >= early,
    }
    return {"figures": figures, "criteria": criteria, "meets": all(criteria.values())}


def preserved(steps: dict[int, dict]) -> dict:
    """The AEPO mechanism check: mean actor/grad_preserved_frac over all steps ≥ 0.5% (no score is read)."""
    values = [r.get("actor/grad_preserved_frac") for _, r in sorted(steps.items())]
    mean = math.fsum(values) / len(values) if values and all(_finite(v) for v in values) else None
    return {"figures": {"steps_logged": len(values), "grad_preserved_frac_mean": mean},
            "criteria": {f"mean actor/grad_preserved_frac >= {PRESERVED_MIN}": mean is not None and mean >= PRESERVED_MIN},
            "meets": mean is not None and mean >= PRESERVED_MIN}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("gate", "calibration", "preserved"):
        print(__doc__, file=sys.stderr)
        return 2
    what, source, out = argv[0], Path(argv[1]), Path(argv[2])
    if what == "gate":
        result = gate(json.loads(source.read_text()))
    else:
        result = (calibration if what == "calibration" else preserved)(read_steps(source))
    result = {"rule": what, "source": str(source), **result}
    out.write_text(json.dumps(result, indent=2) + "\n")
    verdict = result.get("clears", result.get("meets"))
    print(f"{what} {source}: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in result["criteria"].items())
          + f" -> {'PASS' if verdict else 'FAIL'}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
