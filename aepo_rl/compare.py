"""`aepo compare`: several algorithms from one SFT checkpoint, several seeds, one table.

Every preset starts from the same cold-start SFT model (§5: "all RL methods start from the
same SFT model") with the same rollout budget (``rollout.n``, ``trainer.batch_size``,
``trainer.steps``) and, for a given seed index, the same data order and sampling seed; only
the algorithm (what the presets set) changes. Each metric is reported as the mean over seeds
± the half-width of a 95% Student-t confidence interval, below an ``sft`` row: the shared SFT
checkpoint evaluated once like the runs' final policies. Every run folder gets its ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from scipy import stats

import yaml

from aepo_rl.config import PRESETS, Config, ConfigError, from_dict, load_config, to_dict, to_yaml
from aepo_rl.progress import PhaseProgress, get_console
from aepo_rl.report import mean_records, plot_records, plot_runs, read_metrics, read_run, series
from aepo_rl.tasks import get_task
from aepo_rl.train.checkpoint import atomic_write_text
from aepo_rl.train.pipeline import evaluate_model, run_rl_stage, run_sft_stage

COLUMNS = (
    ("pass@1", "pass@1 on the evaluation split after RL"),
    ("pass@k", "pass@k (k = eval.samples) after RL"),
    ("tool_calls", "tool calls per evaluated answer (tool_calls/mean)"),
    ("entropy_drift", "final − initial actor/entropy during RL"),
    ("distinct_per_group", "distinct trajectories per rollout group (rollout/distinct_per_group, mean over steps)"),
    ("branches", "branches per prompt (rollout/branches_per_prompt, mean over steps; 0 without a tree)"),
    ("largest_subtree", "share of a prompt's trajectories descending from its most-branched global sample "
                        "(rollout/largest_subtree_share, mean over steps)"),
)
STEP_MEANS = {"distinct_per_group": "rollout/distinct_per_group", "branches": "rollout/branches_per_prompt",
              "largest_subtree": "rollout/largest_subtree_share"}
"""Columns that average a per-step rollout metric over the run's steps (None when it was never logged)."""
SFT_ROW_NOTE = "**sft**: the shared SFT checkpoint before RL, evaluated once like the runs (–: an RL-only column)"


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


def algorithm_keys() -> set[str]:
    """Keys that define an algorithm: everything some preset sets, plus the whole algorithm section."""
    keys = {key for overrides in PRESETS.values() for key in overrides}
    return keys | {f"algorithm.{f.name}" for f in dataclasses.fields(Config().algorithm)}


def user_overrides(cfg: Config) -> dict[str, Any]:
    """The dotted keys where ``cfg`` differs from its bare preset (its YAML file and command-line overrides)."""
    base, mine = _flatten(to_dict(load_config(cfg.preset))), _flatten(to_dict(cfg))
    return {key: value for key, value in mine.items() if key != "preset" and base.get(key) != value}


def split_overrides(cfg: Config) -> tuple[dict[str, Any], list[str]]:
    """The user's overrides carried to every preset, and the algorithm keys that are not carried."""
    algorithmic = algorithm_keys()
    overrides = user_overrides(cfg)
    carried = {k: v for k, v in overrides.items() if k not in algorithmic}
    return carried, sorted(k for k in overrides if k in algorithmic)


def parse_presets(text: str, seeds: int) -> dict[str, int]:
    """``"grpo:5,arpo:5,dapo"`` → ``{"grpo": 5, "arpo": 5, "dapo": seeds}``: runs per preset, in order."""
    counts: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        name = name.strip()
        if name not in PRESETS:
            raise ConfigError(f"unknown preset '{name}' in --presets; presets: {', '.join(PRESETS)}")
        if name in counts:
            raise ConfigError(f"preset '{name}' appears twice in --presets")
        try:
            counts[name] = int(count) if count else seeds
        except ValueError:
            raise ConfigError(f"--presets: '{item}' is not <preset> or <preset>:<seeds> (e.g. grpo:5)") from None
        if counts[name] < 1:
            raise ConfigError(f"--presets: '{item}' asks for {counts[name]} seeds; at least 1")
    if not counts:
        raise ConfigError("--presets is empty; e.g. --presets grpo,arpo,aepo")
    return counts


def preset_configs(cfg: Config, presets: list[str] | dict[str, int], seeds: int,
                   steps: int | None) -> dict[tuple[str, int], Config]:
    """One config per (preset, seed index): the preset plus the user's non-algorithm overrides.

    ``presets`` is a list (``seeds`` runs each) or ``{preset: runs}``. Seed index i sets
    ``trainer.seed`` and ``rollout.seed`` to the user's value + i for every preset, so runs with
    the same index see the same data order; the rollout budget is the user's.
    """
    counts = presets if isinstance(presets, dict) else dict.fromkeys(presets, seeds)
    carried, _ = split_overrides(cfg)
    budget = {"rollout.n": cfg.rollout.n, "trainer.batch_size": cfg.trainer.batch_size,
              "trainer.steps": cfg.trainer.steps if steps is None else steps}
    configs = {}
    for preset, runs in counts.items():
        for index in range(runs):
            seeding = {"trainer.seed": cfg.trainer.seed + index, "rollout.seed": cfg.rollout.seed + index}
            configs[(preset, index)] = load_config(preset, overrides={**carried, **budget, **seeding})
    return configs


def eval_metrics(eval_result: dict[str, dict], split: str, where: Path) -> dict[str, float]:
    """pass@1, pass@k and tool calls of the one ``<task>/<split>`` entry of an evaluation of ``where``."""
    entries = [m for name, m in eval_result.items() if name.endswith(f"/{split}")]
    if len(entries) != 1:
        raise ValueError(f"{where}: expected one '<task>/{split}' evaluation, got keys {sorted(eval_result)}")
    return {"pass@1": entries[0]["pass@1"], "pass@k": entries[0]["pass@k"], "tool_calls": entries[0]["tool_calls/mean"]}


def run_metrics(eval_result: dict[str, dict], split: str, run_dir: Path) -> dict[str, float | None]:
    """The compared numbers of one run: its final evaluation and its metrics.jsonl."""
    records = read_metrics(run_dir)

    def values(metric: str) -> list[float]:
        return series(records, metric).get(metric, ([], []))[1]

    entropy = values("actor/entropy")
    means = {col: math.fsum(v) / len(v) if (v := values(metric)) else None for col, metric in STEP_MEANS.items()}
    return {**eval_metrics(eval_result, split, run_dir),
            "entropy_drift": entropy[-1] - entropy[0] if entropy else None, **means,
            "rl_time_s": math.fsum(values("timing_s/step"))}


def summarize(runs: dict[str, list[dict[str, float | None]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{preset: {column: mean_ci95 over seeds}}``."""
    return {preset: {col: mean_ci95([r[col] for r in rows]) for col, _ in COLUMNS} for preset, rows in runs.items()}


def sft_row(eval_result: dict[str, dict], split: str, sft_dir: Path) -> dict[str, dict[str, Any] | None]:
    """The SFT checkpoint's row: its one evaluation (n = 1), None in the RL-only columns."""
    measured = eval_metrics(eval_result, split, sft_dir)
    return {col: mean_ci95([measured[col]]) if col in measured else None for col, _ in COLUMNS}


def format_cell(stat: dict[str, Any] | None) -> str:
    if stat is None:
        return "–"
    if stat["mean"] is None:
        return "n/a"
    if stat["ci95"] is None:
        return f"{stat['mean']:.3f}"
    return f"{stat['mean']:.3f} ± {stat['ci95']:.3f}"


OUTCOME_COLUMNS = ("pass@1", "pass@k", "tool_calls")
PAIRED_TABLES = ((OUTCOME_COLUMNS, "outcomes"),
                 (tuple(col for col, _ in COLUMNS if col not in OUTCOME_COLUMNS), "rollouts and entropy"))
"""The paired differences are printed as two tables: the final evaluation's columns, then every
other column of :data:`COLUMNS` (the JSON holds them all)."""


def paired_differences(runs: dict[str, list[dict[str, Any]]], reference: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``{preset: {column: mean_ci95 of (preset − reference) over the seed indices both ran}}``.

    Runs with the same seed index share the SFT model, the data order and the sampling seed, so the
    per-seed difference removes what they have in common: its interval is the test of "preset and
    reference differ" (an interval holding 0 does not separate them).
    """
    ref = {row["seed_index"]: row for row in runs[reference]}
    out = {}
    for preset, rows in runs.items():
        if preset == reference:
            continue
        pairs = [(row, ref[row["seed_index"]]) for row in rows if row["seed_index"] in ref]
        out[preset] = {col: mean_ci95([None if a.get(col) is None or b.get(col) is None else a[col] - b[col]
                                       for a, b in pairs])
                       for col, _ in COLUMNS}
    return out


def separates(stat: dict[str, Any] | None) -> str:
    """"yes" when the 95% interval excludes 0, "no" when it holds it, "–" without an interval."""
    if stat is None or stat["mean"] is None or stat["ci95"] is None:
        return "–"
    return "yes" if abs(stat["mean"]) > stat["ci95"] else "no"


def paired_table(diffs: dict[str, dict[str, dict[str, Any]]], reference: str) -> str:
    """Markdown: one table per :data:`PAIRED_TABLES` entry, a row per preset, Δ and "separated" per column."""
    lines = [f"Paired differences, preset − {reference}, over the seed indices both ran (same SFT model, data order "
             f"and sampling seed); 'separated': the 95% interval excludes 0."]
    for columns, title in PAIRED_TABLES:
        lines += ["", f"{title[0].upper()}{title[1:]}:", "",
                  "| preset | pairs | " + " | ".join(f"Δ{col} | separated" for col in columns) + " |",
                  "|" + "---|" * (2 + 2 * len(columns))]
        for preset, row in diffs.items():
            cells = " | ".join(f"{format_cell(row[col])} | {separates(row[col])}" for col in columns)
            lines.append(f"| {preset} | {row[columns[0]]['n']} | {cells} |")
    return "\n".join(lines) + "\n"


def plot_preset_means(runs: dict[str, list[dict[str, Any]]], sft_eval: dict[str, dict], out_dir: Path) -> None:
    """Every panel of ``aepo report`` with one curve per preset, the mean over its seeds (the SFT
    model's evaluation at step 0 of the pass@1 panel)."""
    sft_point = {f"eval/{key}/pass@1": result["pass@1"] for key, result in sft_eval.items()}
    curves = {}
    for preset, rows in runs.items():
        records = mean_records([read_run(row["run_dir"]) for row in rows])
        if records and records[0]["step"] == 0:
            records[0] = {**sft_point, **records[0]}
        else:
            records.insert(0, {"step": 0, **sft_point})
        curves[f"{preset} (n={len(rows)})"] = records
    plot_records(curves, out_dir)


def seed_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Every run's pass@1 / pass@k, by preset and seed (nothing selected, nothing left out)."""
    width = max((row["seed_index"] + 1 for rows in runs.values() for row in rows), default=0)
    lines = ["Every run: pass@1 / pass@k by seed index (trainer.seed and rollout.seed = yours + index):", "",
             "| preset | " + " | ".join(f"seed {i}" for i in range(width)) + " |", "|" + "---|" * (width + 1)]
    for preset, rows in runs.items():
        by_index = {row["seed_index"]: f"{row['pass@1']:.3f} / {row['pass@k']:.3f}" for row in rows}
        cells = [by_index.get(i, "–") for i in range(width)]
        lines.append(f"| {preset} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def time_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    """RL wall time per preset (sum of ``timing_s/step`` over each run's steps: evaluation excluded)."""
    lines = ["RL time per run (sum of timing_s/step; on a shared machine these move with its load):", "",
             "| preset | runs | mean s per run | total s |", "|---|---|---|---|"]
    for preset, rows in runs.items():
        times = [row["rl_time_s"] for row in rows]
        mean = f"{math.fsum(times) / len(times):.0f}" if times else "–"
        lines.append(f"| {preset} | {len(times)} | {mean} | {math.fsum(times):.0f} |")
    return "\n".join(lines) + "\n"


def _seeds_cell(row: dict[str, Any]) -> str:
    stat = row[COLUMNS[0][0]]
    return "–" if stat is None else str(stat["n"])


def markdown_table(summary: dict[str, dict[str, dict[str, Any]]], seeds: int, steps: int) -> str:
    """``seeds``: the most runs of any preset (a preset's own count is its ``seeds`` column)."""
    header = "| preset | seeds | " + " | ".join(col for col, _ in COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for preset, row in summary.items():
        lines.append(f"| {preset} | {_seeds_cell(row)} | " + " | ".join(format_cell(row[col]) for col, _ in COLUMNS) + " |")
    ci_note = ("mean ± 95% CI half-width (Student t over a preset's seeds)" if seeds > 1
               else "one seed: no confidence interval (use --seeds ≥ 2)")
    notes = [f"{steps} RL steps per run, same SFT checkpoint and rollout budget; {ci_note}.", ""]
    notes += [f"- {SFT_ROW_NOTE}"] + [f"- **{col}**: {doc}" for col, doc in COLUMNS]
    return "\n".join(lines + [""] + notes) + "\n"


def _finished(run_dir: Path, cfg: Config, key: str = "rl") -> dict | None:
    """The evaluation ``key`` of ``run_dir``'s eval.json when the run was completed with this config,
    else None. Its config.yaml is read as a Config, so a key added to aepo-rl since (at its default)
    does not make a finished run look different."""
    try:
        if from_dict(yaml.safe_load((run_dir / "config.yaml").read_text())) != cfg:
            return None
        return json.loads((run_dir / "eval.json").read_text()).get(key)
    except (OSError, ValueError, ConfigError, TypeError, AttributeError):
        return None


def compare_main(cfg: Config, presets: list[str] | dict[str, int], seeds: int, steps: int | None = None,
                 out_dir: str | None = None, reference: str | None = None, table_only: bool = False) -> int:
    """`aepo compare`: SFT once, then RL for every preset × seed; table, JSON, markdown and plots.

    ``presets``: a list (``seeds`` runs each) or ``{preset: runs}``. Run again with the same
    ``out_dir``, it keeps what is done: the SFT model and its evaluation, every run whose
    ``eval.json`` holds its final evaluation under the same config, and an interrupted run
    resumes from its newest checkpoint. ``reference`` (default ``aepo`` when compared, else the
    first preset): the preset the paired differences are taken against. ``table_only``: train
    nothing, tabulate the runs finished so far (another process may be running the rest).
    """
    from rich.table import Table

    counts = presets if isinstance(presets, dict) else dict.fromkeys(presets, seeds)
    if not counts:
        raise ConfigError("--presets is empty; e.g. --presets grpo,arpo,aepo")
    if min(counts.values()) < 1:
        raise ConfigError(f"--seeds must be >= 1, got {min(counts.values())}")
    seeds = max(counts.values())
    reference = reference or ("aepo" if "aepo" in counts else next(iter(counts)))
    if reference not in counts:
        raise ConfigError(f"--reference {reference!r} is not among --presets ({', '.join(counts)})")
    if table_only and not out_dir:
        raise ConfigError("--table-only needs --out: the folder of the comparison to tabulate")
    out = Path(out_dir) if out_dir else Path(cfg.trainer.run_dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    configs = preset_configs(cfg, counts, seeds, steps)
    _, dropped = split_overrides(cfg)
    if dropped:
        print(f"compare: not carried to the presets (algorithm settings): {', '.join(dropped)}")
    if table_only:
        sft_model_dir = str(out / "sft" / "checkpoints" / "sft")
        sft_eval = _finished(out / "sft", cfg, "sft")
        if sft_eval is None:
            raise ConfigError(f"{out}: no evaluated SFT model made with this config in {out / 'sft'}; run the "
                              "comparison (without --table-only) first, with the same presets and overrides")
    else:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "sft" / "config.yaml", to_yaml(cfg))
        sft_model_dir = run_sft_stage(cfg, out / "sft")
        # cfg shares eval.*, model.*, task.* and rollout.seed with the seed-0 runs: their final evaluation's settings
        sft_eval = _finished(out / "sft", cfg, "sft")
        if sft_eval is None:
            sft_eval = evaluate_model(cfg, sft_model_dir, get_task(cfg))
            atomic_write_text(out / "sft" / "eval.json", json.dumps({"sft": sft_eval}, indent=2))
    runs: dict[str, list[dict]] = {preset: [] for preset in counts}
    run_dirs, missing = [], []
    with PhaseProgress("compare", len(configs), unit="runs") as progress:
        for (preset, index), run_cfg in configs.items():
            run_dir = out / f"{preset}-seed{index}"
            eval_result = _finished(run_dir, run_cfg)
            if eval_result is None and table_only:
                missing.append(run_dir.name)
                progress.advance(info=f"{preset} seed {index} not finished")
                continue
            if eval_result is None:
                atomic_write_text(run_dir / "config.yaml", to_yaml(run_cfg))
                eval_result = run_rl_stage(run_cfg, sft_model_dir, run_dir)
            runs[preset].append({"seed": run_cfg.trainer.seed, "seed_index": index, "run_dir": str(run_dir),
                                 **run_metrics(eval_result, run_cfg.eval.split, run_dir)})
            run_dirs.append(run_dir)
            progress.advance(info=f"{preset} seed {index} done")
    num_steps = next(iter(configs.values())).trainer.steps
    summary = {"sft": sft_row(sft_eval, cfg.eval.split, out / "sft"), **summarize(runs)}
    diffs = paired_differences(runs, reference)
    (out / "compare.json").write_text(json.dumps(
        {"presets": list(counts), "seeds": counts, "steps": num_steps, "sft_model": str(sft_model_dir),
         "summary": summary, "reference": reference, "paired_differences": diffs, "runs": runs,
         "unfinished": missing}, indent=2) + "\n")
    (out / "compare.md").write_text(markdown_table(summary, seeds, num_steps)
                                    + ("\n" + paired_table(diffs, reference) if diffs else "")
                                    + "\n" + seed_table(runs) + "\n" + time_table(runs)
                                    + (f"\nNot finished yet (left out above): {', '.join(missing)}\n" if missing else ""))
    plot_preset_means({p: rows for p, rows in runs.items() if rows}, sft_eval, out / "plots")
    if run_dirs:
        plot_runs(run_dirs, out / "plots" / "runs")
    table = Table(title=f"compare: {seeds} seed(s) × {num_steps} steps" + ("" if seeds > 1 else " (n=1: no CI)"))
    table.add_column("preset")
    table.add_column("seeds", justify="right")
    for col, _ in COLUMNS:
        table.add_column(col, justify="right")
    for preset, row in summary.items():
        table.add_row(preset, _seeds_cell(row), *(format_cell(row[col]) for col, _ in COLUMNS), end_section=preset == "sft")
    get_console().print(table)
    if diffs:
        print(paired_table(diffs, reference))
    print(f"wrote {out / 'compare.json'}, {out / 'compare.md'} and {out / 'plots'}")
    return 0


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
