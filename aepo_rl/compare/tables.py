"""The tables of `aepo compare`: markdown (compare.md) and the console's rich tables."""

from __future__ import annotations

import math
from typing import Any

from aepo_rl.compare.arms import Arm
from aepo_rl.compare.columns import TABLES, Column
from aepo_rl.compare.stats import separates
from aepo_rl.progress import get_console

SFT_ROW_NOTE = "**sft**: the shared SFT checkpoint before RL, evaluated once like the runs (–: an RL-only column)"


def format_cell(stat: dict[str, Any] | None) -> str:
    if stat is None:
        return "–"
    if stat["mean"] is None:
        return "n/a"
    if stat["ci95"] is None:
        return f"{stat['mean']:.3f}"
    return f"{stat['mean']:.3f} ± {stat['ci95']:.3f}"


def _tables(columns: list[Column]) -> list[tuple[str, list[Column]]]:
    """``columns`` grouped by :data:`TABLES`, empty tables left out."""
    return [(t, cols) for t in TABLES if (cols := [c for c in columns if c.table == t])]


def paired_table(diffs: dict[str, dict[str, dict[str, Any]]], reference: str, columns: list[Column]) -> str:
    """Markdown: one table per :data:`TABLES` entry, a row per arm, Δ and "separated" per column."""
    lines = [f"Paired differences, arm − {reference}, over the seed indices both ran (same SFT model, data order "
             f"and sampling seed); 'separated': the 95% interval excludes 0; 'n/a (no tree)': a branching metric "
             "against an arm that never branches (rollout.mode=independent), 0 by construction, so nothing to test."]
    for title, cols in _tables(columns):
        lines += ["", f"{title[0].upper()}{title[1:]}:", "",
                  "| arm | pairs | " + " | ".join(f"Δ{c.name} | separated" for c in cols) + " |",
                  "|" + "---|" * (2 + 2 * len(cols))]
        for arm, row in diffs.items():
            cells = " | ".join(f"{format_cell(row[c.name])} | {separates(row[c.name])}" for c in cols)
            lines.append(f"| {arm} | {row[cols[0].name]['n']} | {cells} |")
    return "\n".join(lines) + "\n"


def seed_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Every run's pass@1 / pass@k, by arm and seed (nothing selected, nothing left out)."""
    width = max((row["seed_index"] + 1 for rows in runs.values() for row in rows), default=0)
    lines = ["Every run: pass@1 / pass@k by seed index (trainer.seed and rollout.seed = yours + index):", "",
             "| arm | " + " | ".join(f"seed {i}" for i in range(width)) + " |", "|" + "---|" * (width + 1)]
    for preset, rows in runs.items():
        by_index = {row["seed_index"]: f"{row['pass@1']:.3f} / {row['pass@k']:.3f}" for row in rows}
        cells = [by_index.get(i, "–") for i in range(width)]
        lines.append(f"| {preset} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def time_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """RL wall time per arm (sum of ``timing_s/step`` over each run's steps: evaluation excluded)."""
    lines = ["RL time per run (sum of timing_s/step; on a shared machine these move with its load):", "",
             "| arm | runs | mean s per run | total s |", "|---|---|---|---|"]
    for preset, rows in runs.items():
        times = [row["rl_time_s"] for row in rows]
        mean = f"{math.fsum(times) / len(times):.0f}" if times else "–"
        lines.append(f"| {preset} | {len(times)} | {mean} | {math.fsum(times):.0f} |")
    return "\n".join(lines) + "\n"


def _seeds_cell(row: dict[str, Any]) -> str:
    stat = row["pass@1"]
    return "–" if stat is None else str(stat["n"])


def markdown_table(summary: dict[str, dict[str, dict[str, Any]]], seeds: int, steps: int, columns: list[Column],
                   arms: list[Arm] | None = None) -> str:
    """``seeds``: the most runs of any arm (an arm's own count is its ``seeds`` column); one table per
    :data:`TABLES` entry, then the notes: what each arm is and what each column means."""
    lines = []
    for title, cols in _tables(columns):
        lines += [f"{title[0].upper()}{title[1:]}:", "", "| arm | seeds | " + " | ".join(c.name for c in cols) + " |",
                  "|" + "---|" * (len(cols) + 2)]
        lines += [f"| {arm} | {_seeds_cell(row)} | " + " | ".join(format_cell(row[c.name]) for c in cols) + " |"
                  for arm, row in summary.items()]
        lines.append("")
    ci_note = ("mean ± 95% CI half-width (Student t over an arm's seeds)" if seeds > 1
               else "one seed: no confidence interval (use --seeds ≥ 2)")
    notes = [f"{steps} RL steps per run, same SFT checkpoint and rollout budget; {ci_note}.", ""]
    notes += [f"- arm **{arm.name}**: preset {arm.preset}"
              + (", " + ", ".join(f"{k}={v}" for k, v in arm.overrides.items()) if arm.overrides else "")
              for arm in arms or [] if arm.overrides or arm.name != arm.preset]
    notes += [f"- {SFT_ROW_NOTE}"] + [f"- **{c.name}**: {c.doc}" for c in columns]
    return "\n".join(lines + notes) + "\n"


def _console_tables(summary: dict[str, dict[str, dict[str, Any]]], columns: list[Column], title: str) -> None:
    """The summary as rich tables, one per :data:`TABLES` entry."""
    from rich.table import Table

    for name, cols in _tables(columns):
        table = Table(title=f"{title}: {name}")
        table.add_column("arm")
        table.add_column("seeds", justify="right")
        for c in cols:
            table.add_column(c.name, justify="right")
        for arm, row in summary.items():
            table.add_row(arm, _seeds_cell(row), *(format_cell(row[c.name]) for c in cols), end_section=arm == "sft")
        get_console().print(table)
