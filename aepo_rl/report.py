"""Plots and tables from run folders (`aepo report runs/X [runs/Y …]`).

Reads each run's ``metrics.jsonl`` (one JSON object per step, verl metric names and the AEPO
rollout metrics of §7) and draws one PNG per panel, every run overlaid and named in the
legend. A panel whose metrics no run logged is skipped, with a line saying so.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aepo_rl.errors import UserError
from aepo_rl.jsonl import JsonlError, read_jsonl


class MetricsError(UserError, ValueError):
    """A run folder or its metrics.jsonl is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class Panel:
    """One PNG: one subplot per metric, every run overlaid."""

    file: str
    title: str
    metrics: tuple[str, ...]
    """Metric names; a name with ``*`` matches any text (``eval/*/pass@1`` → every task/split)."""


PANELS = (
    Panel("reward.png", "Reward (critic/score/mean)", ("critic/score/mean",)),
    Panel("pass_at_1.png", "Evaluation pass@1", ("eval/*/pass@1",)),
    Panel("pass_at_1_by_level.png", "Evaluation pass@1 per level (by_hops, by_difficulty …)", ("eval_level/*/pass@1",)),
    Panel("entropy.png", "Policy entropy (actor/entropy)", ("actor/entropy",)),
    Panel("clip_fraction.png", "Clip fractions", ("actor/pg_clipfrac", "actor/pg_clipfrac_lower")),
    Panel("branching.png", "Tree rollout (§1.4)", ("rollout/branches_per_prompt", "rollout/largest_subtree_share")),
    Panel("tool_calls.png", "Tool calls per trajectory", ("tool_call_counts/mean",)),
    Panel("response_length.png", "Response length (tokens)", ("response_length/mean",)),
)

EVAL_LINE_MIN_POINTS = 4
"""Evaluations (pass@1 with its interval) are joined by a line from this many points on; fewer are drawn as
points only, so two evaluations do not read as steady progress between them (``trainer.eval_every`` adds
points between the ends)."""
SMOOTH_MIN_POINTS, SMOOTH_WINDOW = 30, 10
"""A series of at least this many steps (a noisy per-step metric) is drawn faint, with its trailing
mean over this many steps on top."""

FINAL_VALUE_COLUMNS = ("critic/score/mean", "eval/*/pass@1", "actor/entropy", "tool_call_counts/mean",
                       "response_length/mean", "rollout/branches_per_prompt")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The step records of ``run_dir/metrics.jsonl``, sorted by step.

    A step logged twice (a resumed run re-logs the step it was interrupted in) keeps its last
    record. Blank lines are skipped; anything else that is not a JSON object with an integer
    ``step`` raises :class:`MetricsError` naming the file and line.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise MetricsError(f"run folder {run} does not exist")
    path = run / "metrics.jsonl"
    if not path.is_file():
        if any((run / name).is_file() for name in ("eval.json", "sft_metrics.json")):
            return []  # no RL step yet: an `aepo sft` folder, or a run stopped before RL
        raise MetricsError(f"{path} does not exist: is {run} a run folder (of aepo train, aepo sft or aepo compare)?")
    try:
        lines = list(read_jsonl(path))
    except JsonlError as err:
        raise MetricsError(str(err)) from None
    by_step: dict[int, dict] = {}
    for lineno, record in lines:
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise MetricsError(f"{path}:{lineno}: missing integer 'step' field (got {step!r})")
        by_step[step] = {**by_step.get(step, {}), **record}
    return [by_step[s] for s in sorted(by_step)]


def read_eval_points(run_dir: str | Path, last_step: int) -> dict[int, dict[str, float]]:
    """pass@1 from the run's ``eval.json`` (``{"sft": {...}, "rl": {...}}``) as points on the step axis,
    and per level of each ``by_<field>`` breakdown (``eval_level/<task>/<split>/<field>=<level>/pass@1``).

    The SFT model's evaluation sits at step 0, the final RL evaluation at ``last_step``; a run
    without ``eval.json`` has none.
    """
    path = Path(run_dir) / "eval.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MetricsError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    points: dict[int, dict[str, float]] = {}
    for stage, step in (("sft", 0), ("rl", last_step)):
        results = data.get(stage, {}) if isinstance(data, dict) else None
        if not isinstance(results, dict):
            raise MetricsError(f"{path}: expected {{\"{stage}\": {{\"<task>/<split>\": {{\"pass@1\": …}}}}}}")
        for key, result in results.items():
            if isinstance(result, dict) and _is_number(result.get("pass@1")):
                points.setdefault(step, {})[f"eval/{key}/pass@1"] = float(result["pass@1"])
                if _is_number(result.get("num_questions")):
                    points[step][f"eval/{key}/num_questions"] = int(result["num_questions"])
                for field_key, levels in result.items():
                    if field_key.startswith("by_") and isinstance(levels, dict):
                        for level, level_result in levels.items():
                            if isinstance(level_result, dict) and _is_number(level_result.get("pass@1")):
                                name = f"eval_level/{key}/{field_key.removeprefix('by_')}={level}/"
                                points[step][name + "pass@1"] = float(level_result["pass@1"])
                                if _is_number(level_result.get("num_questions")):
                                    points[step][name + "num_questions"] = int(level_result["num_questions"])
    return points


def pass1_halfwidth(pass1: float, num_questions: int) -> float:
    """Half-width of the 95% interval drawn around a pass@1 over ``num_questions`` questions:
    1.96·sqrt(p(1 − p)/n). Each question's pass@1 lies in [0, 1] with mean p, so its variance is at most
    p(1 − p) (equal with one sample per question): the interval is exact for K = 1 and at most this wide
    for K > 1."""
    return 1.96 * math.sqrt(max(pass1 * (1 - pass1), 0.0) / num_questions) if num_questions > 0 else 0.0


def read_sft_loss(run_dir: str | Path) -> list[float]:
    """The cold-start SFT loss per optimizer step (``sft_metrics.json``'s ``loss_curve``); [] without one."""
    path = Path(run_dir) / "sft_metrics.json"
    if not path.is_file():
        return []
    try:
        curve = json.loads(path.read_text()).get("loss_curve", [])
    except (json.JSONDecodeError, AttributeError):
        raise MetricsError(f"{path}: expected a JSON object with a 'loss_curve' list") from None
    return [float(v) for v in curve if _is_number(v)]


def read_run(run_dir: str | Path) -> list[dict]:
    """:func:`read_metrics` with the before/after evaluations of ``eval.json`` merged in."""
    by_step = {record["step"]: record for record in read_metrics(run_dir)}
    for step, point in read_eval_points(run_dir, max(by_step, default=0)).items():
        by_step[step] = {"step": step, **by_step.get(step, {}), **point}
    return [by_step[s] for s in sorted(by_step)]


def mean_records(runs: list[list[dict]]) -> list[dict]:
    """One record per step: each numeric metric averaged over the runs that logged it at that step
    (the curve of a preset over its seeds)."""
    sums: dict[int, dict[str, list[float]]] = {}
    for records in runs:
        for record in records:
            step = sums.setdefault(record["step"], {})
            for name, value in record.items():
                if name != "step" and _is_number(value):
                    step.setdefault(name, []).append(float(value))
    return [{"step": step, **{name: math.fsum(v) / len(v) for name, v in sums[step].items()}} for step in sorted(sums)]


def series(records: list[dict], pattern: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric name: (steps, values)}`` for every logged name matching ``pattern`` (finite numbers only)."""
    regex = _pattern_regex(pattern)
    out: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        for name, value in record.items():
            if regex.fullmatch(name) and _is_number(value):
                steps, values = out.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(float(value))
    return dict(sorted(out.items()))


def plot_runs(run_dirs: list[str | Path], out_dir: str | Path) -> list[Path]:
    """Write one PNG per panel of :data:`PANELS` into ``out_dir``; returns the files written.

    Runs are overlaid, labelled by folder name. A panel no run has data for is skipped and
    reported on stdout.
    """
    written = plot_records(_read_runs(run_dirs), out_dir)
    sft = plot_sft_loss(run_dirs, out_dir)
    return written + ([sft] if sft else [])


def plot_sft_loss(run_dirs: list, out_dir: str | Path) -> Path | None:
    """``sft_loss.png``: the cold-start SFT loss per optimizer step of every run that has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {_run_label(Path(d), run_dirs): read_sft_loss(d) for d in run_dirs}
    curves = {run: curve for run, curve in curves.items() if curve}
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for run, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, label=run)
    ax.set_xlabel("SFT optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Cold-start SFT loss")
    fig.tight_layout()
    path = Path(out_dir) / "sft_loss.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_records(runs: dict[str, list[dict]], out_dir: str | Path) -> list[Path]:
    """:func:`plot_runs` over already-read records, ``{run label: records}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in PANELS:
        per_metric = {m: {run: series(recs, m) for run, recs in runs.items()} for m in panel.metrics}
        present = [m for m in panel.metrics if any(per_metric[m].values())]
        if not present:
            print(f"report: skipped {panel.file}: no run logged {' or '.join(panel.metrics)}")
            continue
        fig, axes = plt.subplots(1, len(present), figsize=(5.5 * len(present), 3.8), squeeze=False)
        for ax, metric in zip(axes[0], present):
            for run, lines in per_metric[metric].items():
                for name, (steps, values) in lines.items():
                    label = run if name == metric else f"{run}: {name}"
                    count = _question_count(runs[run], name)
                    if count:
                        joined = len(steps) >= EVAL_LINE_MIN_POINTS
                        ax.errorbar(steps, values, yerr=[pass1_halfwidth(v, count) for v in values], marker="o",
                                    markersize=3 if joined else 5, capsize=3, linestyle="-" if joined else "none",
                                    label=f"{label} ({count} questions, 95% interval; {len(steps)} evaluation"
                                          f"{'s' if len(steps) > 1 else ''})")
                        continue
                    if len(steps) < SMOOTH_MIN_POINTS:
                        ax.plot(steps, values, marker="o", markersize=3, label=label)
                        continue
                    (raw,) = ax.plot(steps, values, alpha=0.3, linewidth=1)
                    ax.plot(steps, trailing_mean(values, SMOOTH_WINDOW), color=raw.get_color(),
                            label=f"{label} (mean of {SMOOTH_WINDOW} steps)")
            ax.set_title(metric, fontsize=10)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(panel.title)
        fig.tight_layout()
        path = out / panel.file
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Each value averaged with up to ``window`` − 1 values before it."""
    if not values:
        return []
    sums = np.convolve(values, np.ones(window))[:len(values)]  # sum over each trailing window
    return (sums / np.minimum(np.arange(1, len(values) + 1), window)).tolist()


def final_values(records: list[dict], pattern: str) -> dict[str, float]:
    """The last logged value of every metric matching ``pattern``."""
    return {name: values[-1] for name, (_, values) in series(records, pattern).items()}


def report_main(runs: list[str], out_dir: str | None = None) -> int:
    """`aepo report`: plots into ``out_dir`` (default ``<first run>/plots``) and a table of final values."""
    from rich.console import Console
    from rich.table import Table

    try:
        records = _read_runs(runs)
        out = out_dir or Path(runs[0]) / "plots"
        written = plot_records(records, out)
        sft = plot_sft_loss(runs, out)
        written += [sft] if sft else []
    except MetricsError as err:
        print(f"aepo report: error: {err}")
        return 2
    finals = {run: {name: v for col in FINAL_VALUE_COLUMNS for name, v in final_values(recs, col).items()}
              for run, recs in records.items()}
    table = Table(title="final values")
    table.add_column("metric")
    for run in records:
        table.add_column(run, justify="right")
    table.add_row("last step", *(str(recs[-1]["step"]) if recs else "-" for recs in records.values()))
    for name in dict.fromkeys(name for f in finals.values() for name in f):
        table.add_row(name, *(f"{f[name]:.4g}" if name in f else "-" for f in finals.values()))
    Console().print(table)
    for path in written:
        print(f"wrote {path}")
    return 0


def _question_count(records: list[dict], name: str) -> int | None:
    """The question count of an evaluation metric ``eval/<task>/<split>/pass@1`` or its per-level
    ``eval_level/…/pass@1`` (from eval.json), else None."""
    if not (name.startswith(("eval/", "eval_level/")) and name.endswith("/pass@1")):
        return None
    counts = [r[name.removesuffix("pass@1") + "num_questions"] for r in records
              if _is_number(r.get(name.removesuffix("pass@1") + "num_questions"))]
    return int(counts[-1]) if counts else None


def _read_runs(run_dirs: list) -> dict[str, list[dict]]:
    return {_run_label(Path(d), run_dirs): read_run(d) for d in run_dirs}


def _run_label(run: Path, all_runs: list) -> str:
    """The folder name, or the whole path when two runs share a folder name."""
    names = [Path(r).name for r in all_runs]
    return run.name if names.count(run.name) == 1 else str(run)


def _pattern_regex(pattern: str) -> re.Pattern:
    """``*`` in a metric pattern matches any non-empty text; everything else literally."""
    return re.compile(re.escape(pattern).replace(r"\*", ".+"))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
