"""Tasks: the built-in synthetic world, user data, reasoning-gym, evaluation sets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aepo_rl.tasks.base import Demonstration, Example, Task

if TYPE_CHECKING:
    from aepo_rl.config import Config


def get_task(cfg: Config) -> Task:
    """The task named by ``cfg.task.name``: ``synthetic``, ``reasoning_gym:<generator>``, ``file``
    (``task.train_files`` / ``task.val_files``) or an evaluation set name (``hotpotqa``, ``gsm8k`` …).
    Its search tool queries ``task.search_url`` when set, else an in-process index of its corpus
    (cached under ``model.cache_dir``); its tools follow ``rollout.tool_timeout`` / ``tool_workers``."""
    from aepo_rl.config import ConfigError
    from aepo_rl.tasks.common import ToolOptions
    from aepo_rl.tasks.loaders import EVAL_SETS, FileTask

    name = cfg.task.name
    options = ToolOptions.from_config(cfg)
    if name == "synthetic":
        from aepo_rl.tasks.synthetic import SyntheticTask

        return SyntheticTask(cfg.task, tool_options=options)
    if name.startswith("reasoning_gym:"):
        from aepo_rl.tasks.reasoning_gym import ReasoningGymTask

        return ReasoningGymTask(cfg.task, name.split(":", 1)[1], tool_options=options)
    if name == "file" or name in EVAL_SETS:
        return FileTask(cfg.task, tool_options=options)
    known = ["synthetic", "reasoning_gym:<generator>", "file", *EVAL_SETS]
    raise ConfigError(f"unknown task.name '{name}'; choose one of {known}")


__all__ = ["Demonstration", "Example", "Task", "get_task"]
