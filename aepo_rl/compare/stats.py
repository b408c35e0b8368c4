"""The statistics of `aepo compare`: Student-t intervals over seeds, the per-arm summary and the paired
differences against the reference arm, and whether an interval separates an arm from it."""

from __future__ import annotations

import math
from typing import Any

from scipy import stats

from aepo_rl.compare.columns import TREE_ONLY, Column
from aepo_rl.report import _pattern_regex


def student_t_critical(df: int, confidence: float = 0.95) -> float:
    """t such that P(|T| ≤ t) = confidence for Student's t with ``df`` degrees of freedom (scipy's quantile)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(stats.t.ppf(0.5 + confidence / 2, df))


def mean_ci95(values: list[float]) -> dict[str, Any]:
    """Mean and the 95% CI half-width t_{0.975, n−1}·s/√n (s: sample std); ``ci95`` None when n < 2."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = math.fsum(finite) / n
    if n == 1:
        return {"mean": mean, "ci95": None, "n": 1}
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1))
    return {"mean": mean, "ci95": student_t_critical(n - 1) * std / math.sqrt(n), "n": n}


def mean_interval(values: list[float]) -> dict[str, Any]:
    """:func:`mean_ci95` with the interval's ends, ``low`` and ``high`` (None when n < 2)."""
    out = mean_ci95(values)
    half = out["ci95"]
    out.update(low=None if half is None else out["mean"] - half, high=None if half is None else out["mean"] + half)
    return out


def summarize(runs: dict[str, list[dict[str, float | None]]],
              columns: list[Column]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{arm: {column: mean_ci95 over seeds}}``."""
    return {arm: {c.name: mean_ci95([r.get(c.name) for r in rows]) for c in columns} for arm, rows in runs.items()}


def sft_row(sft_metrics: dict[str, float | None], columns: list[Column]) -> dict[str, dict[str, Any] | None]:
    """The SFT checkpoint's row: its one evaluation (n = 1), None in the RL-only columns."""
    return {c.name: mean_ci95([sft_metrics[c.name]]) if c.name in sft_metrics else None for c in columns}


def paired_differences(runs: dict[str, list[dict[str, Any]]], reference: str,
                       columns: list[Column]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{arm: {column: mean_ci95 of (arm − reference) over the seed indices both ran}}``.

    Runs with the same seed index share the SFT model, the data order and the sampling seed, so the
    per-seed difference removes what they have in common: its interval is the test of "arm and
    reference differ" (an interval holding 0 does not separate them).
    """
    ref = {row["seed_index"]: row for row in runs[reference]}
    chains = {arm for arm, rows in runs.items() if any(row.get("tree") is False for row in rows)}
    out = {}
    for arm, rows in runs.items():
        if arm == reference:
            continue
        pairs = [(row, ref[row["seed_index"]]) for row in rows if row["seed_index"] in ref]
        out[arm] = {c.name: mean_ci95([None if a.get(c.name) is None or b.get(c.name) is None else a[c.name] - b[c.name]
                                       for a, b in pairs])
                    for c in columns}
        cannot = [name for name in (arm, reference) if name in chains]
        for c in columns:
            if cannot and any(_pattern_regex(p).fullmatch(c.name) for p in TREE_ONLY):
                out[arm][c.name] = {**out[arm][c.name], "ci95": None,
                                    "undefined": f"{' and '.join(cannot)} never branches (rollout.mode=independent)"}
    return out


def separates(stat: dict[str, Any] | None) -> str:
    """"yes" when the 95% interval excludes 0, "no" when it holds it, "–" without an interval, "n/a (no tree)" for a
    tree-only column (:data:`TREE_ONLY`) against an arm that never branches."""
    if stat is not None and stat.get("undefined"):
        return "n/a (no tree)"
    if stat is None or stat["mean"] is None or stat["ci95"] is None:
        return "–"
    return "yes" if abs(stat["mean"]) > stat["ci95"] else "no"
