"""User data and the paper's evaluation sets, read from parquet or JSONL files.

Two row layouts are accepted, detected per row:

- verl's RL schema (docs/architecture.md, Contracts): ``data_source``, ``prompt`` (list of
  {role, content}), ``ability``, ``reward_model`` = {style, ground_truth}, ``extra_info``;
- evaluation rows: ``question`` and ``answer`` (a string or a list of strings).

``task.name=file`` reads ``task.train_files`` (split "train") and ``task.val_files`` (splits
"dev", "test" and "val", which search ``task.val_corpus`` when it is set); ``task.name=<eval set>`` (e.g.
``hotpotqa``) does the same with the set's default reward and tools (§5 benchmarks). A prompt without a system
message gets the tool protocol's (§1.1).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from aepo_rl.config import TaskConfig
from aepo_rl.errors import import_extra
from aepo_rl.jsonl import JsonlError, read_jsonl
from aepo_rl.rewards import WeightedRewards
from aepo_rl.tasks.base import Example
from aepo_rl.tasks.common import ToolOptions, build_tools
from aepo_rl.tasks.dataset import DatasetError, DatasetTask, row_to_example
from aepo_rl.tools.base import Tool


@dataclass(frozen=True)
class EvalSet:
    reward: str
    tools: tuple[str, ...]


_MATH = EvalSet("math", ("python",))
_QA = EvalSet("deep_research", ("search", "python"))
EVAL_SETS: dict[str, EvalSet] = {
    "aime24": _MATH, "aime25": _MATH, "math500": _MATH, "math": _MATH, "gsm8k": _MATH,
    "hotpotqa": _QA, "2wiki": _QA, "musique": _QA, "bamboogle": _QA, "simpleqa": _QA,
    "gaia": _QA, "hle": _QA, "webwalkerqa": _QA, "xbench-deepsearch": _QA,
}
"""The paper's 14 benchmarks (§5) → default reward and the tools they allow."""


def eval_set_name(data_source: str) -> str | None:
    """The registry name of a data source ("HotpotQA", "hotpot_qa", "aime_2024" …), or None."""
    key = re.sub(r"[^a-z0-9]", "", data_source.lower().rsplit("/", 1)[-1])
    aliases = {"hotpot": "hotpotqa", "2wikimultihopqa": "2wiki", "aime2024": "aime24", "aime2025": "aime25",
               "xbench": "xbench-deepsearch", "xbenchdeepsearch": "xbench-deepsearch"}
    for name in EVAL_SETS:
        if key == re.sub(r"[^a-z0-9]", "", name):
            return name
    return aliases.get(key)


def default_reward(data_source: str) -> str:
    """The reward of a data source: its evaluation set's default, else deep_research (§3)."""
    name = eval_set_name(data_source)
    return EVAL_SETS[name].reward if name else "deep_research"


# ---------------------------------------------------------------- reading files

def read_rows(path: str | Path) -> list[tuple[str, dict]]:
    """``(where, row)`` for each row of a ``.parquet`` or ``.jsonl`` file; ``where`` names the file and
    the line (``data.jsonl:3``) or row (``data.parquet row 3``), counted from 1 as editors count.

    A missing or empty file, or a malformed JSONL line, is a DatasetError naming the file (and line).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"data file {path} does not exist")
    if path.suffix == ".parquet":
        pq = import_extra("pyarrow.parquet", "parquet", f"reading {path}")

        try:
            rows = [(f"{path} row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist(), start=1)]
        except Exception as err:  # pyarrow raises several error types for bad files
            raise DatasetError(f"{path}: not a readable parquet file: {err}") from None
    else:
        try:
            rows = [(f"{path}:{line}", row) for line, row in read_jsonl(path)]
        except JsonlError as err:
            raise DatasetError(str(err)) from None
    if not rows:
        raise DatasetError(f"data file {path} has no rows; give a file with one question per row "
                           "(JSONL: one JSON object per line)")
    return rows


def load_examples(paths: list[str], split: str, tools: tuple[str, ...] = ("search", "python"),
                  fmt: str = "xml") -> list[Example]:
    """Every row of ``paths`` as Examples, ids ``<file stem>-<split>-<row>``."""
    examples = []
    for path in paths:
        stem = Path(path).stem
        for i, (where, row) in enumerate(read_rows(path)):
            examples.append(row_to_example(row, where, f"{stem}-{split}-{i}", stem, tools, fmt))
    return examples


# ---------------------------------------------------------------- the task

class FileTask(DatasetTask):
    """A task read from files: ``task.name=file`` or an evaluation set name (``hotpotqa``, ``gsm8k`` …): a
    :class:`~aepo_rl.tasks.dataset.DatasetTask` over the files' rows, scored by the reward ``task.reward``.

    An evaluation set uses its registry reward and tools; ``task.reward`` overrides the reward
    when it is set to something other than the default ``deep_research``.
    """

    def __init__(self, task_cfg: TaskConfig, tool_options: ToolOptions | None = None):
        spec = EVAL_SETS.get(task_cfg.name) if task_cfg.name != "file" else None
        self.allowed_tools = spec.tools if spec else ("search", "python")
        self.reward_name = spec.reward if spec and task_cfg.reward == TaskConfig.reward else task_cfg.reward
        rewards = WeightedRewards([self.reward_name], judge_url=task_cfg.judge_url, judge_model=task_cfg.judge_model)
        if not task_cfg.train_files and not task_cfg.val_files:
            raise DatasetError(f"task '{task_cfg.name}' reads files: set "
                               "task.train_files=[...] and/or task.val_files=[...]")
        stems = {}

        def rows(paths: list[str]) -> list[tuple[str, dict]]:
            found = []
            for path in paths:
                for where, row in read_rows(path):
                    stems[where] = Path(path).stem
                    found.append((where, row))
            return found

        super().__init__(task_cfg.name, rows(task_cfg.train_files), rows(task_cfg.val_files), rewards,
                         tools=self.allowed_tools, task_cfg=task_cfg, tool_options=tool_options,
                         id_prefix=stems.__getitem__)
        self.cfg = task_cfg
        self._eval_tools: dict[str, Tool] | None = None

    def split_tools(self, split: str) -> dict[str, Tool]:
        """The tools of a rollout on ``split``: those of :meth:`tools`, with search over ``task.val_corpus`` in
        the evaluation splits (dev, test, val) when it is set, so held-out questions search their own documents."""
        if split == "train" or not self.cfg.val_corpus or "search" not in self.allowed_tools:
            return self.tools()
        if self._eval_tools is None:
            search = build_tools(dataclasses.replace(self.cfg, corpus=self.cfg.val_corpus), allowed=("search",),
                                 options=self.tool_options)
            self._eval_tools = {**self.tools(), **search}
        return self._eval_tools
