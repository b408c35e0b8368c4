"""The equivalence study's mechanical rules (lab/equivalence/preregistration.md), applied to the files the
frozen commit writes. Phase A's rule reads GRPO runs only; no rule reads an ARPO or AEPO score before the
verdicts.

    python rules.py decide PHASE_A_DIR OUT_JSON     # exit 0 iff a candidate qualifies and the seed count is set
    python rules.py verdicts COMPARE_JSON OUT_JSON  # H1, H2 (Holm), TOST at ±3 points, secondaries (and OUT.md)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from scipy import stats

CANDIDATES = ("R0", "R1", "R2", "R3")
"""Phase A's candidates in the order of preference on a tie (the fewest optimizer steps per RL step first)."""
SEEDS = 3
"""Calibration seeds per candidate (trainer.seed = rollout.seed = 100, 101, 102)."""
SPLIT = "dev"
GAIN_MIN = 0.05
"""Every seed's final dev pass@1 (K = 8) at least 5 points above the SFT model's."""
PPO_KL_MAX = 0.02
"""No logged RL step with actor/ppo_kl above this."""
CLIP_KEY = "actor/pg_clipfrac_upper_bound"
"""The selection metric: its mean over every step of the candidate's runs (the bound AEPO's clip changes)."""
DELTA = 0.03
"""The smallest effect of interest and the equivalence margin: 3 points of test pass@1."""
ALPHA = 0.05
POWER = 0.80
N_MIN, N_MAX = 12, 30
"""Seeds per arm in phase B: at least 12 (so a paired t interval rests on 11 degrees of freedom), at most 30
(the CPU budget: 90 runs); when the power rule asks for more than 30, 30 run and the achieved power is reported."""
PAIRED_SD_MAX = 0.05
"""Stop and report, with no phase B, when the implied paired SD exceeds 5 points."""


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _sd(values: list[float]) -> float:
    mean = _mean(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def split_score(eval_file: Path, stage: str) -> float:
    """pass@1 of the one ``<task>/dev`` entry of ``eval_file[stage]``; errors name the file."""
    data = json.loads(eval_file.read_text())
    entries = [m for name, m in data.get(stage, {}).items() if name.endswith(f"/{SPLIT}")]
    if len(entries) != 1 or not _finite(entries[0].get("pass@1")):
        raise ValueError(f"{eval_file}: expected one '<task>/{SPLIT}' entry with a finite pass@1 under '{stage}'")
    return float(entries[0]["pass@1"])


def read_steps(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records, one per step (a step logged twice after a resume keeps its last record)."""
    steps: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps[int(record["step"])] = record
    return [steps[k] for k in sorted(steps)]


def candidate(phase_a: Path, name: str, sft: float, steps_expected: int) -> dict:
    """One candidate's figures over its seeds and whether it qualifies (preregistration, phase A rule)."""
    seeds = []
    for index in range(SEEDS):
        run = phase_a / f"{name}-seed{index}"
        final = split_score(run / "eval.json", "rl")
        steps = read_steps(run)
        kls = [s.get("actor/ppo_kl") for s in steps]
        clips = [s.get(CLIP_KEY) for s in steps]
        seeds.append({"seed_index": index, "steps": len(steps), "final": final, "gain": final - sft,
                      "max_ppo_kl": max((k for k in kls if _finite(k)), default=None),
                      "nonfinite_ppo_kl": sum(not _finite(k) for k in kls),
                      "mean_clip_upper": _mean([c for c in clips if _finite(c)]) if any(map(_finite, clips)) else None})
    criteria = {
        f"every seed ran {steps_expected} steps": all(s["steps"] == steps_expected for s in seeds),
        f"every seed's final {SPLIT} pass@1 >= SFT + {GAIN_MIN}": all(s["gain"] >= GAIN_MIN - 1e-12 for s in seeds),
        f"no step's actor/ppo_kl > {PPO_KL_MAX} (and none non-finite)":
            all(s["max_ppo_kl"] is not None and s["max_ppo_kl"] <= PPO_KL_MAX and s["nonfinite_ppo_kl"] == 0
                for s in seeds),
    }
    clip = [s["mean_clip_upper"] for s in seeds if s["mean_clip_upper"] is not None]
    return {"seeds": seeds, "criteria": criteria, "qualifies": all(criteria.values()),
            "mean_clip_upper": _mean(clip) if clip else None, "final_sd": _sd([s["final"] for s in seeds])}


def power_paired(n: int, sd: float, delta: float = DELTA, alpha: float = ALPHA / 2) -> float:
    """Power of a two-sided paired t-test at level ``alpha`` (Holm's first step over H1, H2: 0.025) to reject
    0 when the true mean difference is ``delta`` (noncentral t, n − 1 degrees of freedom)."""
    df, nc = n - 1, delta * math.sqrt(n) / sd
    crit = stats.t.ppf(1 - alpha / 2, df)
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    return upper + (lower if math.isfinite(lower) else 0.0)  # scipy's far tail is nan at a large nc: it is ~0


def power_tost(n: int, sd: float, margin: float = DELTA, alpha: float = ALPHA) -> float:
    """Power of TOST at ±``margin`` (each one-sided test at ``alpha``) when the true difference is 0: the
    usual approximation 2·F_t(margin·√n/sd − t_(1−alpha), n − 1) − 1, floored at 0."""
    df = n - 1
    return max(0.0, float(2 * stats.t.cdf(margin * math.sqrt(n) / sd - stats.t.ppf(1 - alpha, df), df) - 1))


def seeds_needed(paired_sd: float) -> dict:
    """The power rule: the smallest n in [N_MIN, N_MAX] at which both the Holm-level paired t-test (3 points)
    and TOST (±3 points, true difference 0) reach 80% power; N_MAX with its achieved power otherwise."""
    for n in range(N_MIN, N_MAX + 1):
        if power_paired(n, paired_sd) >= POWER and power_tost(n, paired_sd) >= POWER:
            break
    return {"n": n, "power_paired": power_paired(n, paired_sd), "power_tost": power_tost(n, paired_sd),
            "capped": not (power_paired(n, paired_sd) >= POWER and power_tost(n, paired_sd) >= POWER)}


def decide(phase_a: Path, steps_expected: int = 100) -> dict:
    """Phase A's decision: the qualifying candidate with the largest mean upper-bound clip fraction (ties: the
    order of CANDIDATES), the pooled within-candidate seed SD of final dev pass@1 over every qualifying
    candidate, the paired SD √2 times it (no correlation between arms assumed), and the seeds per arm."""
    sft = split_score(phase_a / "sft" / "eval.json", "sft")
    figures = {name: candidate(phase_a, name, sft, steps_expected) for name in CANDIDATES}
    qualifying = [name for name in CANDIDATES if figures[name]["qualifies"]]
    out = {"sft_pass@1": sft, "candidates": figures, "qualifying": qualifying, "chosen": None}
    if not qualifying:
        return {**out, "stop": "no candidate qualifies: the next world of the fallback order (preregistration)"}
    chosen = max(qualifying, key=lambda name: (figures[name]["mean_clip_upper"] or 0.0, -CANDIDATES.index(name)))
    pooled = math.sqrt(_mean([figures[name]["final_sd"] ** 2 for name in qualifying]))
    paired_sd = math.sqrt(2) * pooled
    out = {**out, "chosen": chosen, "seed_sd": pooled, "seed_sd_df": len(qualifying) * (SEEDS - 1),
           "paired_sd": paired_sd}
    if paired_sd > PAIRED_SD_MAX:
        return {**out, "stop": f"implied paired SD {paired_sd:.4f} > {PAIRED_SD_MAX}: no phase B (preregistration)"}
    return {**out, **seeds_needed(paired_sd), "stop": None}


def paired(rows: dict[str, list[dict]], arm: str, other: str, column: str = "pass@1") -> dict:
    """Per-seed ``arm − other``: mean, 95% and 90% t intervals, two-sided paired t p-value, TOST p-value at
    ±DELTA, n and the differences, over the seed indices both arms finished."""
    theirs = {row["seed_index"]: row.get(column) for row in rows.get(other, [])}
    diffs = {row["seed_index"]: row[column] - theirs[row["seed_index"]] for row in rows.get(arm, [])
             if _finite(row.get(column)) and _finite(theirs.get(row["seed_index"]))}
    n = len(diffs)
    out = {"arm": arm, "other": other, "column": column, "n": n, "per_seed": diffs}
    if n < 2:
        return {**out, "mean": None, "ci95": None, "ci90": None, "p": None, "p_tost": None}
    values = list(diffs.values())
    mean, se = _mean(values), _sd(values) / math.sqrt(n)
    df = n - 1
    if se == 0:
        p, p_tost = (1.0 if mean == 0 else 0.0), (0.0 if abs(mean) < DELTA else 1.0)
    else:
        p = float(2 * stats.t.sf(abs(mean) / se, df))
        p_tost = float(max(stats.t.sf((mean + DELTA) / se, df), stats.t.cdf((mean - DELTA) / se, df)))
    half95, half90 = float(stats.t.ppf(0.975, df)) * se, float(stats.t.ppf(0.95, df)) * se
    return {**out, "mean": mean, "ci95": [mean - half95, mean + half95], "ci90": [mean - half90, mean + half90],
            "p": p, "p_tost": p_tost}


def holm(pvalues: dict[str, float | None], alpha: float = ALPHA) -> dict[str, bool]:
    """Holm's step-down rejections over ``pvalues`` (None: not rejected, counted in the family)."""
    order = sorted(pvalues, key=lambda k: (pvalues[k] is None, pvalues[k] if pvalues[k] is not None else 1.0))
    rejected, m = {}, len(pvalues)
    still = True
    for rank, key in enumerate(order):
        p = pvalues[key]
        still = still and p is not None and p <= alpha / (m - rank)
        rejected[key] = still
    return rejected


def verdict(test: dict, rejected: bool) -> str:
    """One comparison's verdict: better / worse (Holm), equivalent (TOST at ±DELTA), or inconclusive."""
    if test["mean"] is None:
        return "no data"
    if rejected:
        return "better" if test["mean"] > 0 else "worse"
    if test["p_tost"] is not None and test["p_tost"] < ALPHA:
        return f"equivalent within ±{DELTA * 100:.0f} points"
    return "inconclusive"


def verdicts(compare: dict) -> dict:
    """H1 (aepo − arpo) and H2 (arpo − grpo), Holm over both; every pair's TOST; aepo − grpo secondary."""
    rows: dict[str, list[dict]] = compare["runs"]  # compare.json: {arm: [{"seed_index", "pass@1", ...}]}
    tests = {"H1": paired(rows, "aepo", "arpo"), "H2": paired(rows, "arpo", "grpo"),
             "S1": paired(rows, "aepo", "grpo")}
    rejected = holm({"H1": tests["H1"]["p"], "H2": tests["H2"]["p"]})
    rejected["S1"] = tests["S1"]["p"] is not None and tests["S1"]["p"] <= ALPHA
    return {name: {**test, "holm_rejected": rejected[name], "verdict": verdict(test, rejected[name])}
            for name, test in tests.items()}


def verdict_table(results: dict) -> str:
    lines = ["| test | n | mean | 95% CI | 90% CI (TOST) | p | p TOST ±3 | verdict |",
             "|---|---|---|---|---|---|---|---|"]

    def fmt(v):
        return "n/a" if v is None else f"{v:+.4f}"

    def ci(c):
        return "n/a" if c is None else f"[{c[0]:+.4f}, {c[1]:+.4f}]"

    for name, t in results.items():
        lines.append(f"| {name}: {t['arm']} − {t['other']} | {t['n']} | {fmt(t['mean'])} | {ci(t['ci95'])} | "
                     f"{ci(t['ci90'])} | {fmt(t['p'])} | {fmt(t['p_tost'])} | {t['verdict']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("decide", "verdicts"):
        print(__doc__, file=sys.stderr)
        return 2
    command, source, target = argv[0], Path(argv[1]), Path(argv[2])
    if command == "decide":
        result = decide(source)
        target.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "candidates"}, indent=2))
        return 0 if result["stop"] is None else 1
    result = verdicts(json.loads(source.read_text()))
    target.write_text(json.dumps(result, indent=2) + "\n")
    target.with_suffix(".md").write_text(verdict_table(result))
    print(verdict_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
