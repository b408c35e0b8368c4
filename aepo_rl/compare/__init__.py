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

The package, one module per purpose: :mod:`~aepo_rl.compare.arms` (``--arm``/``--presets``, a config per arm
and seed), :mod:`~aepo_rl.compare.columns` (what is compared, read from one run),
:mod:`~aepo_rl.compare.stats` (Student-t intervals, paired differences), :mod:`~aepo_rl.compare.tables`,
:mod:`~aepo_rl.compare.plots` and :mod:`~aepo_rl.compare.runner` (the SFT stage under a file lock, the runs,
the files written).
"""

from __future__ import annotations

from aepo_rl.compare.arms import (
                                  ARM_NAME,
                                  SEEDING_KEYS,
                                  Arm,
                                  arm_configs,
                                  as_arms,
                                  common_overrides,
                                  parse_arm,
                                  parse_presets,
                                  preset_configs,
                                  user_overrides,
)
from aepo_rl.compare.columns import (
                                  COLUMNS,
                                  DRIFT_WINDOWS,
                                  DRIFTS,
                                  EVAL_COLUMNS,
                                  HOP_METRICS,
                                  LEVEL_PREFIXES,
                                  LOGGED_MEANS,
                                  STEP_MEANS,
                                  STEP_SUMS,
                                  TABLES,
                                  TREE_ONLY,
                                  Column,
                                  columns_of,
                                  eval_metrics,
                                  run_metrics,
                                  split_entry,
                                  windowed_drift,
)
from aepo_rl.compare.plots import plot_preset_means
from aepo_rl.compare.runner import compare_main
from aepo_rl.compare.stats import mean_ci95, paired_differences, separates, sft_row, student_t_critical, summarize
from aepo_rl.compare.tables import SFT_ROW_NOTE, format_cell, markdown_table, paired_table, seed_table, time_table

__all__ = ["ARM_NAME", "COLUMNS", "DRIFTS", "DRIFT_WINDOWS", "EVAL_COLUMNS", "HOP_METRICS", "LEVEL_PREFIXES",
           "LOGGED_MEANS", "SEEDING_KEYS", "SFT_ROW_NOTE", "STEP_MEANS", "STEP_SUMS", "TABLES", "TREE_ONLY", "Arm",
           "Column", "arm_configs", "as_arms", "columns_of", "common_overrides", "compare_main", "eval_metrics",
           "format_cell", "markdown_table", "mean_ci95", "paired_differences", "paired_table", "parse_arm",
           "parse_presets", "plot_preset_means", "preset_configs", "run_metrics", "seed_table", "separates",
           "sft_row", "split_entry", "student_t_critical", "summarize", "time_table", "user_overrides",
           "windowed_drift"]
