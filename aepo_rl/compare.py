"""`aepo compare`: several algorithms from one SFT checkpoint, several seeds, one table.

An *arm* is a name, a preset and the arm's own overrides (:class:`Arm`; ``--presets grpo`` is the
arm ``grpo=grpo``). Every arm starts from the same cold-start SFT model (§5: "all RL methods start
from the same SFT model") with the same rollout budget (``rollout.n``, ``trainer.batch_size``,
``trainer.steps``; an arm may set its own ``rollout.n`` for a budget-matched comparison) and, for a
given seed index, the same data order and sampling seed; only the algorithm (what the preset and
the arm's overrides set) changes. Each metric is reported as the mean over seeds ± the half-width
of a 95% Student-t confidence interval, below an ``sft`` row: the shared SFT checkpoint evaluated
once like the runs' final policies. Every run folder gets its ``config.yaml``. Several processes
may run disjoint arms of one output folder: the SFT stage runs under a file lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from scipy import stats

import yaml

from aepo_rl.config import (PRESETS, Config, ConfigError, from_dict, load_config, parse_overrides, to_dict,
                             to_yaml)
from aepo_rl.progress import PhaseProgress, get_console
from aepo_rl.report import _pattern_regex, mean_records, plot_records, plot_runs, read_metrics, read_run, series
from aepo_rl.tasks import get_task
from aepo_rl.train.checkpoint import atomic_write_text
from aepo_rl.train.pipeline import evaluate_model, run_rl_stage, run_sft_stage



@dataclasses.dataclass(frozen=True)
class Column:
    """A compared number: its name in the tables and compare.json, what it is, the table it is printed in."""

    name: str
    doc: str
    table: str


COLUMNS = (
    Column("pass@1", "pass@1 on the evaluation split after RL", "outcomes"),
    Column("pass@k", "pass@k (k = eval.samples) after RL", "outcomes"),
    Column("f1", "mean answer-list F1 over the evaluated samples after RL (a task that reports it: phantomwiki)",
           "outcomes"),
    Column("tool_calls", "tool calls per evaluated answer (tool_calls/mean)", "outcomes"),
    Column("eval_entropy", "mean token entropy of the evaluated answers' own tokens (entropy/token_mean; tool "
                           "results excluded): the same measurement for every arm, tree or chain", "outcomes"),
    Column("calls_per_correct", "tool calls of all evaluated answers / correct answers", "tool efficiency"),
    Column("tool_productivity", "correct answers / tool calls (OTC-PO's tool productivity)", "tool efficiency"),
    Column("excess_calls", "tool calls of a correct answer minus its question's minimum (excess_calls/mean)",
           "tool efficiency"),
    Column("train_tool_calls", "tool calls executed in the training rollouts, all steps (Σ rollout/tool_calls; "
                               "a fork does not re-run its parent's calls)", "training compute"),
    Column("train_decode_tokens", "tokens decoded in the training rollouts, all steps (Σ rollout/decode_tokens)",
           "training compute"),
    Column("entropy_drift", "actor/entropy: mean of the last 20 steps − mean of the first 10 (shorter runs: "
                            "the first third, at least one step, against the rest, at most 20)", "rollouts and entropy"),
    Column("entropy_unique_drift", "the same windowed drift of actor/entropy_unique (a forked prefix counted once)",
           "rollouts and entropy"),
    Column("distinct_per_group", "distinct trajectories per rollout group (rollout/distinct_per_group, mean over "
                                 "steps)", "rollouts and entropy"),
    Column("branches", "branches per prompt (rollout/branches_per_prompt, mean over steps; 0 without a tree)",
           "rollouts and entropy"),
    Column("largest_subtree", "share of a prompt's trajectories descending from its most-branched global sample "
                              "(rollout/largest_subtree_share, mean over steps)", "rollouts and entropy"),
)
TABLES = ("outcomes", "per level", "tool efficiency", "training compute", "rollouts and entropy")
"""The tables the columns are printed in, in order (a table without a column with a value is left out)."""
EVAL_COLUMNS = {"pass@1": "pass@1", "pass@k": "pass@k", "f1": "answer/f1/mean", "tool_calls": "tool_calls/mean",
                "eval_entropy": "entropy/token_mean", "calls_per_correct": "calls_per_correct",
                "tool_productivity": "tool_productivity", "excess_calls": "excess_calls/mean"}
"""Columns taken from the final evaluation (eval.json's entry): column → its key there."""
HOP_METRICS = {"pass@1": "pass@1", "pass@k": "pass@k", "f1": "answer/f1/mean", "tool_calls": "tool_calls/mean"}
"""Per level h of the task's level field (eval.json's ``by_<field>``: ``by_hops``, phantomwiki's ``by_difficulty``),
the columns ``<prefix><h>:<name>`` (:data:`LEVEL_PREFIXES`)."""
LEVEL_PREFIXES = {"hops": "hop", "difficulty": "difficulty"}
"""Level field → the prefix of its columns (``hop2:pass@1``, ``difficulty3:f1``); another field is its own prefix."""
_LEVEL_COLUMN = re.compile(r"([a-z_]+?)(\d+):(.+)")
STEP_MEANS = {"distinct_per_group": "rollout/distinct_per_group", "branches": "rollout/branches_per_prompt",
              "largest_subtree": "rollout/largest_subtree_share"}
"""Columns that average a per-step rollout metric over the run's steps (None when it was never logged)."""
STEP_SUMS = {"train_tool_calls": "rollout/tool_calls", "train_decode_tokens": "rollout/decode_tokens"}
"""Columns that add up a per-step metric over the run's steps (None when it was never logged)."""
DRIFTS = {"entropy_drift": "actor/entropy", "entropy_unique_drift": "actor/entropy_unique"}
"""Columns that are the windowed drift (:func:`windowed_drift`) of a per-step metric."""
LOGGED_MEANS = ("actor/pg_clipfrac", "actor/pg_clipfrac_*", "actor/grad_preserved_frac", "actor/grad_preserved_frac_*",
                "rollout/consecutive_branch_mean", "rollout/consecutive_branch_share/*", "rollout/entropy_leverage",
                "rollout/informative_group_frac")
"""Metrics of metrics.jsonl (patterns as in ``aepo report``: ``*`` matches any non-empty text) that become a
column of their own name in "rollouts and entropy", the mean over the run's steps, when some run logged
them: extend this tuple to compare a new training metric."""
TREE_ONLY = ("branches", "largest_subtree", "rollout/consecutive_branch_mean", "rollout/consecutive_branch_share/*")
"""Columns that only a tree rollout can move: an arm with ``rollout.mode=independent`` (GRPO) never branches, so
its value is 0 by construction and a paired difference with it tests nothing ("separated" says so)."""
DRIFT_WINDOWS = (10, 20)
"""entropy_drift: mean of the last 20 steps − mean of the first 10."""
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


@dataclasses.dataclass(frozen=True)
class Arm:
    """One compared algorithm: ``name`` (its rows and run folders ``<name>-seed<i>``), the ``preset`` it
    starts from, its own dotted ``overrides`` (applied to this arm only, after the common ones and the
    budget: ``rollout.n`` here makes a budget-matched arm) and its number of ``seeds``."""

    name: str
    preset: str
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    seeds: int = 1


ARM_NAME = re.compile(r"[A-Za-z0-9_.-]+")
SEEDING_KEYS = ("trainer.seed", "rollout.seed")


def parse_arm(text: str, seeds: int) -> Arm:
    """``"NAME=PRESET[:SEEDS] [KEY=VALUE ...]"`` (whitespace-separated) → :class:`Arm`; e.g.
    ``"arpo_random=arpo rollout.entropy_weight=0"`` or ``"grpo_n6=grpo:5 rollout.n=6"``."""
    head, *items = text.split() or [""]
    name, sep, preset = head.partition("=")
    usage = "give NAME=PRESET[:SEEDS] [KEY=VALUE ...], e.g. --arm 'arpo_random=arpo rollout.entropy_weight=0'"
    if not sep or not ARM_NAME.fullmatch(name) or name == "sft":
        raise ConfigError(f"--arm {text!r}: {usage} (NAME: letters, digits, _ . -; not 'sft')")
    preset, _, count = preset.partition(":")
    if preset not in PRESETS:
        raise ConfigError(f"--arm {text!r}: unknown preset '{preset}'; presets: {', '.join(PRESETS)}")
    try:
        runs = int(count) if count else seeds
    except ValueError:
        raise ConfigError(f"--arm {text!r}: '{count}' is not a number of seeds; {usage}") from None
    if runs < 1:
        raise ConfigError(f"--arm {text!r} asks for {runs} seeds; at least 1")
    overrides = parse_overrides(items)
    if seeding := [k for k in overrides if k in SEEDING_KEYS]:
        raise ConfigError(f"--arm {text!r} sets {', '.join(seeding)}: the seeds are the comparison's "
                          "(--seeds and the common trainer.seed / rollout.seed), the same for every arm")
    try:
        load_config(preset, overrides=overrides)
    except ConfigError as err:
        raise ConfigError(f"--arm {text!r}: {err}") from None
    return Arm(name, preset, overrides, runs)


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


def as_arms(arms: list[Arm | str] | dict[str, int], seeds: int) -> list[Arm]:
    """Arms from :class:`Arm` objects, preset names (``seeds`` runs each) or ``{preset: runs}``; names unique."""
    if isinstance(arms, dict):
        arms = [Arm(name, name, {}, runs) for name, runs in arms.items()]
    out = [arm if isinstance(arm, Arm) else Arm(arm, arm, {}, seeds) for arm in arms]
    if not out:
        raise ConfigError("--presets is empty; e.g. --presets grpo,arpo,aepo")
    if min(arm.seeds for arm in out) < 1:
        raise ConfigError(f"--seeds must be >= 1, got {min(arm.seeds for arm in out)}")
    for arm in out:
        if arm.preset not in PRESETS:
            raise ConfigError(f"arm {arm.name}: unknown preset '{arm.preset}'; presets: {', '.join(PRESETS)}")
    names = [arm.name for arm in out]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"arm name(s) {', '.join(twice)} given twice (in --presets and/or --arm); names must differ")
    return out


def user_overrides(cfg: Config) -> dict[str, Any]:
    """The dotted keys where ``cfg`` differs from its bare preset (its YAML file and command-line overrides)."""
    base, mine = _flatten(to_dict(load_config(cfg.preset))), _flatten(to_dict(cfg))
    return {key: value for key, value in mine.items() if key != "preset" and base.get(key) != value}


def common_overrides(cfg: Config, arms: list[Arm]) -> dict[str, Any]:
    """The user's overrides (YAML file and command line), applied to every arm.

    An override of a key that some compared arm's preset sets would change that arm's algorithm, or
    apply to some arms and not to others: it is an error naming the arms, before anything runs (set it
    in an arm's own overrides instead). The budget and seeding keys are handled by :func:`arm_configs`.
    """
    overrides = user_overrides(cfg)
    clashes = {key: [arm.name for arm in arms if key in PRESETS[arm.preset]] for key in overrides}
    if clashes := {key: names for key, names in clashes.items() if names}:
        listed = "; ".join(f"{key} (set by the preset of {', '.join(names)})" for key, names in clashes.items())
        raise ConfigError(f"compare: the common override(s) {listed} would change what an arm's preset sets. Give "
                          "them to the arms that should differ, e.g. --arm 'NAME=PRESET KEY=VALUE', or compare "
                          "presets that leave them alone")
    return overrides


def arm_configs(cfg: Config, arms: list[Arm], steps: int | None) -> dict[tuple[str, int], Config]:
    """One config per (arm name, seed index): preset, common overrides, budget, the arm's overrides, seeding.

    Seed index i sets ``trainer.seed`` and ``rollout.seed`` to the user's value + i for every arm, so runs
    with the same index see the same data order; the rollout budget (``rollout.n``,
    ``trainer.batch_size``, ``trainer.steps``) is the user's unless the arm sets its own.
    """
    arms = as_arms(arms, 1)
    common = common_overrides(cfg, arms)
    budget = {"rollout.n": cfg.rollout.n, "trainer.batch_size": cfg.trainer.batch_size,
              "trainer.steps": cfg.trainer.steps if steps is None else steps}
    configs = {}
    for arm in arms:
        for index in range(arm.seeds):
            seeding = {"trainer.seed": cfg.trainer.seed + index, "rollout.seed": cfg.rollout.seed + index}
            try:
                configs[(arm.name, index)] = load_config(arm.preset, overrides={**common, **budget, **arm.overrides,
                                                                                **seeding})
            except ConfigError as err:
                raise ConfigError(f"arm {arm.name} (preset {arm.preset} with the common and its own overrides): "
                                  f"{err}") from None
    return configs


def preset_configs(cfg: Config, presets: list[str] | dict[str, int], seeds: int,
                   steps: int | None) -> dict[tuple[str, int], Config]:
    """:func:`arm_configs` of arms named after their presets (a list, ``seeds`` runs each, or ``{preset: runs}``)."""
    return arm_configs(cfg, as_arms(presets, seeds), steps)


def windowed_drift(values: list[float], windows: tuple[int, int] = DRIFT_WINDOWS) -> float | None:
    """Mean of the last ``windows[1]`` values − mean of the first ``windows[0]`` (None for fewer than 2).

    A run shorter than the two windows together compares its first third (at least one step, at most
    ``windows[0]``) with the steps after it (at most ``windows[1]``), so the windows never overlap.
    """
    if len(values) < 2:
        return None
    first = min(windows[0], max(1, len(values) // 3))
    last = min(windows[1], len(values) - first)
    return math.fsum(values[-last:]) / last - math.fsum(values[:first]) / first


def split_entry(eval_result: dict[str, dict], split: str, where: Path | str) -> dict:
    """The metrics of the one ``<task>/<split>`` entry of an evaluation (``aepo eval --out``, a section of
    ``eval.json``); a ValueError naming ``where`` when there is not exactly one."""
    entries = [m for name, m in eval_result.items() if name.endswith(f"/{split}")]
    if len(entries) != 1:
        raise ValueError(f"{where}: expected one '<task>/{split}' evaluation, got keys {sorted(eval_result)}")
    return entries[0]


def eval_metrics(eval_result: dict[str, dict], split: str, where: Path) -> dict[str, float | None]:
    """The :data:`EVAL_COLUMNS` and per-hop columns of the one ``<task>/<split>`` entry of an evaluation."""
    entry = split_entry(eval_result, split, where)
    levels = {f"{LEVEL_PREFIXES.get(field, field)}{h}:{col}": level.get(key)
              for field_key, by_level in entry.items() if field_key.startswith("by_") and isinstance(by_level, dict)
              for field in [field_key.removeprefix("by_")] for h, level in by_level.items()
              for col, key in HOP_METRICS.items()}
    return {**{col: entry.get(key) for col, key in EVAL_COLUMNS.items()}, **levels}


def run_metrics(eval_result: dict[str, dict], split: str, run_dir: Path) -> dict[str, float | None]:
    """The compared numbers of one run: its final evaluation and its metrics.jsonl."""
    records = read_metrics(run_dir)

    def values(metric: str) -> list[float]:
        return series(records, metric).get(metric, ([], []))[1]

    means = {col: math.fsum(v) / len(v) if (v := values(metric)) else None for col, metric in STEP_MEANS.items()}
    sums = {col: math.fsum(v) if (v := values(metric)) else None for col, metric in STEP_SUMS.items()}
    logged = {name: math.fsum(v) / len(v) for pattern in LOGGED_MEANS
              for name, (_, v) in series(records, pattern).items()}
    return {**eval_metrics(eval_result, split, run_dir),
            **{col: windowed_drift(values(metric)) for col, metric in DRIFTS.items()}, **means, **sums, **logged,
            "rl_time_s": math.fsum(values("timing_s/step"))}


def columns_of(rows: list[dict[str, Any]]) -> list[Column]:
    """The columns of a comparison: :data:`COLUMNS`, ``hop<h>:…`` and :data:`LOGGED_MEANS` ones, each kept when
    some row has a value for it, in :data:`TABLES` order."""
    names = {key for row in rows for key, value in row.items() if value is not None}
    levels = {n: m.groups() for n in names if (m := _LEVEL_COLUMN.fullmatch(n)) and m.group(3) in HOP_METRICS}
    level_names = sorted(levels, key=lambda n: (levels[n][0], int(levels[n][1]), list(HOP_METRICS).index(levels[n][2])))
    logged = sorted(n for n in names if any(_pattern_regex(p).fullmatch(n) for p in LOGGED_MEANS))
    found = ([c for c in COLUMNS if c.name in names]
             + [Column(n, f"{HOP_METRICS[levels[n][2]]} over the questions of {levels[n][0]} {levels[n][1]} (eval.json "
                          f"by_<level field>{'; hop: the searches a question needs' if levels[n][0] == 'hop' else ''})",
                       "per level") for n in level_names]
             + [Column(n, f"{n} from metrics.jsonl, mean over steps", "rollouts and entropy") for n in logged])
    return sorted(found, key=lambda c: TABLES.index(c.table))


def summarize(runs: dict[str, list[dict[str, float | None]]], columns: list[Column]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{arm: {column: mean_ci95 over seeds}}``."""
    return {arm: {c.name: mean_ci95([r.get(c.name) for r in rows]) for c in columns} for arm, rows in runs.items()}


def sft_row(sft_metrics: dict[str, float | None], columns: list[Column]) -> dict[str, dict[str, Any] | None]:
    """The SFT checkpoint's row: its one evaluation (n = 1), None in the RL-only columns."""
    return {c.name: mean_ci95([sft_metrics[c.name]]) if c.name in sft_metrics else None for c in columns}


def format_cell(stat: dict[str, Any] | None) -> str:
    if stat is None:
        return "–"
    if stat["mean"] is None:
        return "n/a"
    if stat["ci95"] is None:
        return f"{stat['mean']:.3f}"
    return f"{stat['mean']:.3f} ± {stat['ci95']:.3f}"


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
    notes += [f"- arm **{arm.name}**: preset {arm.preset}" + (", " + ", ".join(f"{k}={v}" for k, v in arm.overrides.items())
                                                           if arm.overrides else "") for arm in arms or []
              if arm.overrides or arm.name != arm.preset]
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


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive ``flock`` on ``path`` (created) for the ``with`` block: another `aepo compare` process on
    the same folder waits here (the SFT stage, the tables)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def compare_main(cfg: Config, presets: list[Arm | str] | dict[str, int], seeds: int, steps: int | None = None,
                 out_dir: str | None = None, reference: str | None = None, table_only: bool = False) -> int:
    """`aepo compare`: SFT once, then RL for every arm × seed; table, JSON, markdown and plots.

    ``presets``: :class:`Arm` objects or preset names (``seeds`` runs each), or ``{preset: runs}``. Run again
    with the same ``out_dir``, it keeps what is done: the SFT model and its evaluation, every run whose
    ``eval.json`` holds its final evaluation under the same config, and an interrupted run resumes from
    its newest checkpoint. Another process may run other arms in the same ``out_dir`` at the same time:
    the first builds and evaluates the SFT model while the other waits (a file lock), and each writes
    the tables of its own arms (``table_only`` over the union tabulates them all). ``reference``
    (default ``aepo`` when compared, else the first arm): the arm the paired differences are taken
    against. ``table_only``: train nothing, tabulate the runs finished so far.
    """
    arms = as_arms(presets, seeds)
    names = [arm.name for arm in arms]
    seeds = max(arm.seeds for arm in arms)
    reference = reference or ("aepo" if "aepo" in names else names[0])
    if reference not in names:
        raise ConfigError(f"--reference {reference!r} is not among the compared arms ({', '.join(names)})")
    if table_only and not out_dir:
        raise ConfigError("--table-only needs --out: the folder of the comparison to tabulate")
    out = Path(out_dir) if out_dir else Path(cfg.trainer.run_dir) / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    configs = arm_configs(cfg, arms, steps)
    sft_model_dir = str(out / "sft" / "checkpoints" / "sft")
    if table_only:
        sft_eval = _finished(out / "sft", cfg, "sft")
        if sft_eval is None:
            raise ConfigError(f"{out}: no evaluated SFT model made with this config in {out / 'sft'}; run the "
                              "comparison (without --table-only) first, with the same common overrides")
    else:
        with _locked(out / "sft.lock"):  # a second process on this folder waits for the first one's SFT model
            sft_eval = _finished(out / "sft", cfg, "sft")
            if sft_eval is None:
                atomic_write_text(out / "sft" / "config.yaml", to_yaml(cfg))
            sft_model_dir = run_sft_stage(cfg, out / "sft")
            # cfg shares eval.*, model.*, task.* and rollout.seed with the seed-0 runs: their final evaluation's settings
            if sft_eval is None:
                sft_eval = evaluate_model(cfg, sft_model_dir, get_task(cfg))
                atomic_write_text(out / "sft" / "eval.json", json.dumps({"sft": sft_eval}, indent=2))
    runs: dict[str, list[dict]] = {name: [] for name in names}
    run_dirs, missing = [], []
    with PhaseProgress("compare", len(configs), unit="runs") as progress:
        for (name, index), run_cfg in configs.items():
            run_dir = out / f"{name}-seed{index}"
            eval_result = _finished(run_dir, run_cfg)
            if eval_result is None and table_only:
                missing.append(run_dir.name)
                progress.advance(info=f"{name} seed {index} not finished")
                continue
            if eval_result is None:
                atomic_write_text(run_dir / "config.yaml", to_yaml(run_cfg))
                eval_result = run_rl_stage(run_cfg, sft_model_dir, run_dir)
            runs[name].append({"seed": run_cfg.trainer.seed, "seed_index": index, "run_dir": str(run_dir),
                               "tree": run_cfg.rollout.mode != "independent",
                               **run_metrics(eval_result, run_cfg.eval.split, run_dir)})
            run_dirs.append(run_dir)
            progress.advance(info=f"{name} seed {index} done")
    num_steps = next(iter(configs.values())).trainer.steps
    sft_metrics = eval_metrics(sft_eval, cfg.eval.split, out / "sft")
    columns = columns_of([sft_metrics, *(row for rows in runs.values() for row in rows)])
    summary = {"sft": sft_row(sft_metrics, columns), **summarize(runs, columns)}
    diffs = paired_differences(runs, reference, columns)
    with _locked(out / "tables.lock"):  # another process on this folder may be writing its tables
        atomic_write_text(out / "compare.json", json.dumps(
            {"arms": {arm.name: dataclasses.asdict(arm) for arm in arms}, "seeds": {arm.name: arm.seeds for arm in arms},
             "steps": num_steps, "sft_model": str(sft_model_dir), "columns": [dataclasses.asdict(c) for c in columns],
             "summary": summary, "reference": reference, "paired_differences": diffs, "runs": runs,
             "unfinished": missing}, indent=2) + "\n")
        atomic_write_text(out / "compare.md", markdown_table(summary, seeds, num_steps, columns, arms)
                          + ("\n" + paired_table(diffs, reference, columns) if diffs else "")
                          + "\n" + seed_table(runs) + "\n" + time_table(runs)
                          + (f"\nNot finished yet (left out above): {', '.join(missing)}\n" if missing else ""))
        plot_preset_means({p: rows for p, rows in runs.items() if rows}, sft_eval, out / "plots")
        if run_dirs:
            plot_runs(run_dirs, out / "plots" / "runs")
    _console_tables(summary, columns, f"compare: {seeds} seed(s) × {num_steps} steps" + ("" if seeds > 1 else " (n=1: no CI)"))
    if diffs:
        print(paired_table(diffs, reference, columns))
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
