"""What `aepo compare` compares: the columns (:class:`Column`, the tables they are printed in) and how one
run's numbers are read from its final evaluation and its metrics.jsonl (means, sums, the windowed entropy drift)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from aepo_rl.report import _pattern_regex, read_metrics, series


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
                            "the first third, at least one step, against the rest, at most 20)",
           "rollouts and entropy"),
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
