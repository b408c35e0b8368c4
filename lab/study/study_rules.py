"""The study's mechanical rules (lab/study/preregistration.md): the phase-0 gate, the phase-1 calibration rule
and the AEPO mechanism check, applied to the files the frozen commit writes. No rule reads an ARPO or AEPO
score: ``preserved`` reads only ``actor/grad_preserved_frac`` of the AEPO run's metrics.jsonl.

    python study_rules.py gate EVAL_JSON OUT_JSON            # phase 0: exit 0 iff the gate is cleared
    python study_rules.py calibration RUN_DIR OUT_JSON       # phase 1: exit 0 iff the candidate meets the rule
    python study_rules.py preserved RUN_DIR OUT_JSON         # phase 1: exit 0 iff grad_preserved_frac >= 0.005
    python study_rules.py verdicts COMPARE_JSON OUT_JSON     # every hypothesis's verdict (and OUT.md, a table)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

GATE = {"pass@1_min": 0.15, "pass@1_max": 0.60, "gap_min": 0.08, "top_hop_pass@1_min": 0.05, "calls_min": 1.8}
"""lab/study/preregistration.md, test pass@1 in [0.15, 0.60], pass@k − pass@1 ≥ 0.08, pass@1 ≥ 0.05 on the hardest
hop level, ≥ 1.8 tool calls per answer."""
CALIBRATION = {"steps": 20, "clip_window": (6, 20), "clip_min": 0.01, "clip_max": 0.10,
               "early": (1, 5), "late": (16, 20)}
"""lab/study/preregistration.md, mean actor/pg_clipfrac over steps 6–20 in [0.01, 0.10]; no skipped non-finite step;
mean critic/score/mean (the step's mean trajectory score) of steps 16–20 ≥ that of steps 1–5."""
PRESERVED_MIN = 0.005
"""lab/study/preregistration.md, AEPO at the chosen setting keeps a gradient on ≥ 0.5% of tokens
(actor/grad_preserved_frac)."""
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
        f"pass@1 in [{GATE['pass@1_min']}, {GATE['pass@1_max']}]":
            GATE["pass@1_min"] <= m["pass@1"] <= GATE["pass@1_max"],
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
            "criteria": {f"mean actor/grad_preserved_frac >= {PRESERVED_MIN}":
                         mean is not None and mean >= PRESERVED_MIN},
            "meets": mean is not None and mean >= PRESERVED_MIN}


SESOI = 0.03
"""The smallest effect of interest: 3 points of test pass@1."""


def paired(runs: dict[str, list[dict]], arm: str, other: str, column: str) -> dict:
    """Per-seed (arm − other) of ``column`` over the seed indices both ran: mean, 95% Student-t interval,
    two-sided paired t-test p-value, n, and the per-seed differences (compare.json's ``runs``)."""
    from scipy import stats

    theirs = {row["seed_index"]: row.get(column) for row in runs.get(other, [])}
    diffs = [(row["seed_index"], row[column] - theirs[row["seed_index"]]) for row in runs.get(arm, [])
             if _finite(row.get(column)) and _finite(theirs.get(row["seed_index"]))]
    n = len(diffs)
    values = [d for _, d in diffs]
    out = {"arm": arm, "other": other, "column": column, "n": n, "per_seed": dict(diffs), "mean": None,
           "low": None, "high": None, "p": None}
    if n < 2:
        return out
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    p = (1.0 if sd == 0 and mean == 0 else 0.0 if sd == 0
         else float(2 * stats.t.sf(abs(mean / (sd / math.sqrt(n))), n - 1)))
    return {**out, "mean": mean, "low": mean - half, "high": mean + half, "p": p}


def arm_mean(runs: dict[str, list[dict]], arm: str, column: str) -> float | None:
    values = [row.get(column) for row in runs.get(arm, []) if _finite(row.get(column))]
    return math.fsum(values) / len(values) if values else None


def _ge(value: float | None, bound: float) -> bool:
    return value is not None and value >= bound


def with_branch_share(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Each run with ``branch_share_l2plus``: the share of its branch events at l ≥ 2 (l2 + l3plus)."""
    keys = ("rollout/consecutive_branch_share/l2", "rollout/consecutive_branch_share/l3plus")
    return {arm: [{**row, "branch_share_l2plus": row[keys[0]] + row[keys[1]]}
                  if all(_finite(row.get(k)) for k in keys) else row for row in rows] for arm, rows in runs.items()}


def verdicts(runs: dict[str, list[dict]]) -> list[dict]:
    """Every pre-registered comparison and its verdict (confirmed / refuted / inconclusive), from the
    per-seed values of `aepo compare`'s compare.json (``runs``). lab/study/preregistration.md, section 4–5."""
    runs = with_branch_share(runs)
    out = []

    def add(claim, test, verdict, **figures):
        out.append({"claim": claim, **test, "verdict": verdict, **figures})

    # H1, H2: Holm over the two primary tests; "refuted" (CI upper bound below the SESOI) comes first
    primary = {"H1": paired(runs, "aepo", "arpo", "pass@1"), "H2": paired(runs, "arpo", "grpo", "pass@1")}
    order = sorted((t["p"] if t["p"] is not None else 1.0, name) for name, t in primary.items())
    rejected, still = set(), True
    for level, (p, name) in zip((0.025, 0.05), order):
        still = still and p <= level
        if still:
            rejected.add(name)
    for name, t in primary.items():
        if t["high"] is not None and t["high"] < SESOI:
            verdict = "refuted"
        elif name in rejected and t["mean"] > 0:
            verdict = "confirmed"
        else:
            verdict = "inconclusive"
        add(name, t, verdict, holm_rejected=name in rejected)
    # E: evaluation entropy after RL (the SFT term is shared)
    for arm, other in (("aepo", "arpo"), ("aepo", "grpo"), ("aepo", "aepo_no_sg_clip")):
        t, acc = paired(runs, arm, other, "eval_entropy"), paired(runs, arm, other, "pass@1")
        clipping = all(_ge(arm_mean(runs, a, "actor/pg_clipfrac"), 0.01) for a in (arm, other))
        if t["low"] is None:
            verdict = "inconclusive"
        elif t["low"] > 0 and acc["low"] is not None and acc["low"] > -SESOI:
            verdict = "confirmed"
        elif t["high"] < 0 or (clipping and -0.02 < t["low"] and t["high"] < 0.02):
            verdict = "refuted"
        else:
            verdict = "inconclusive"
        add("E", t, verdict, pass1_low=acc["low"], both_clip_at_least_1pct=clipping)
    # C: the hard upper clip on high-entropy tokens costs accuracy
    for arm, other in (("gppo", "grpo"), ("aepo", "aepo_no_sg_clip")):
        t = paired(runs, arm, other, "pass@1")
        clip_high = arm_mean(runs, other, "actor/pg_clipfrac_high_entropy")
        if t["low"] is not None and t["low"] > 0:
            verdict = "confirmed"
        elif t["high"] is not None and t["high"] < SESOI and _ge(clip_high, 0.05):
            verdict = "refuted"
        else:
            verdict = "inconclusive"
        add("C", t, verdict, hard_clip_arm_high_entropy_clipfrac=clip_high)
    # B: less over-branching
    for arm, other in (("aepo", "arpo"), ("aepo", "aepo_no_branch_penalty")):
        t, share = paired(runs, arm, other, "largest_subtree"), paired(runs, arm, other, "branch_share_l2plus")
        reach = arm_mean(runs, other, "branch_share_l2plus")
        separated = [x["high"] is not None and x["high"] < 0 for x in (t, share)]
        if all(separated):
            verdict = "confirmed"
        elif not any(x["low"] is not None and (x["high"] < 0 or x["low"] > 0) for x in (t, share)) and _ge(reach, 0.10):
            verdict = "refuted"
        else:
            verdict = "inconclusive"
        add("B", t, verdict, branch_share_l2plus=share, other_arm_branch_share_l2plus=reach)
    # G: entropy guides branching usefully
    t = paired(runs, "arpo", "arpo_random", "pass@1")
    leverage = arm_mean(runs, "arpo", "rollout/entropy_leverage")
    verdict = ("confirmed" if t["low"] is not None and t["low"] > 0
               else "refuted" if t["high"] is not None and t["high"] < SESOI else "inconclusive")
    add("G", t, verdict, arpo_entropy_leverage=leverage,
        note=("entropy leverage < 0.05: a finding about the entropy scale"
              if leverage is not None and leverage < 0.05 else None))
    # T2: fewer excess calls at inference, at no loss of accuracy
    for arm, other in (("aepo", "arpo"), ("aepo", "grpo")):
        t, acc = paired(runs, arm, other, "excess_calls"), paired(runs, arm, other, "pass@1")
        if t["high"] is None:
            verdict = "inconclusive"
        elif t["high"] < 0 and acc["low"] is not None and acc["low"] > -SESOI:
            verdict = "confirmed"
        elif t["low"] > 0 or (-0.05 < t["low"] and t["high"] < 0.05):
            verdict = "refuted"
        else:
            verdict = "inconclusive"
        add("T2", t, verdict, pass1_low=acc["low"])
    # X: exploration (pass@8; the SFT model is shared, so arm − other = their changes from it)
    t = paired(runs, "aepo", "grpo", "pass@k")
    verdict = ("confirmed" if t["low"] is not None and t["low"] > 0
               else "refuted" if t["high"] is not None and t["high"] < 0 else "inconclusive")
    add("X", t, verdict)
    return out


def verdict_table(results: list[dict]) -> str:
    def fmt(v):
        return "–" if v is None else f"{v:+.4f}"

    lines = ["| claim | comparison | metric | seeds | mean | 95% CI | p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['claim']} | {r['arm']} − {r['other']} | {r['column']} | {r['n']} | {fmt(r['mean'])} | "
                     f"[{fmt(r['low'])}, {fmt(r['high'])}] | {'–' if r['p'] is None else format(r['p'], '.4f')} | "
                     f"{r['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "verdicts":  # verdicts COMPARE_JSON OUT_JSON (and OUT.md beside it)
        results = verdicts(json.loads(Path(argv[1]).read_text())["runs"])
        out = Path(argv[2])
        out.write_text(json.dumps(results, indent=2) + "\n")
        out.with_suffix(".md").write_text(verdict_table(results))
        print(verdict_table(results), end="")
        return 0
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
