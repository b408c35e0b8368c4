"""Tasks: the built-in synthetic world, user data, reasoning-gym, evaluation sets.

A task is registered by name with ``@register_task(name)`` on a factory ``(cfg: Config) -> Task``
(an entry of :data:`aepo_rl.registry.TASKS`); ``task.name`` picks it.
"""

from __future__ import annotations

from aepo_rl.config import Config, ConfigError
from aepo_rl.registry import TASKS, register_task
from aepo_rl.tasks.base import Demonstration, Example, Task
from aepo_rl.tasks.common import ToolOptions
from aepo_rl.tasks.loaders import EVAL_SETS, FileTask
from aepo_rl.tasks.phantomwiki import PhantomWikiTask
from aepo_rl.tasks.reasoning_gym import ReasoningGymTask
from aepo_rl.tasks.synthetic import SyntheticTask


def get_task(cfg: Config) -> Task:
    """The task registered as ``cfg.task.name``: ``synthetic``, ``reasoning_gym:<generator>``, ``file``
    (``task.train_files`` / ``task.val_files``), an evaluation set name (``hotpotqa``, ``gsm8k`` …) or
    one of yours. Its search tool queries ``task.search_url`` when set, else an in-process index of its
    corpus (cached under ``model.cache_dir``); its tools follow ``rollout.tool_timeout`` / ``tool_workers``."""
    task = TASKS.lookup(cfg.task.name)(cfg)
    if cfg.task.val_corpus and not hasattr(task, "split_tools"):
        raise ConfigError(f"task.val_corpus={cfg.task.val_corpus}: task '{cfg.task.name}' does not read it (its "
                          "evaluation splits search the task's own corpus); it is for task.name=file and the "
                          "evaluation sets: unset it")
    return task


@register_task("synthetic")
def synthetic_task(cfg: Config) -> SyntheticTask:
    """The built-in tool-necessary synthetic world (``task.seed``, ``num_train`` …)."""
    return SyntheticTask(cfg.task, tool_options=ToolOptions.from_config(cfg))


@register_task("reasoning_gym:<generator>")
def reasoning_gym_task(cfg: Config) -> ReasoningGymTask:
    """A reasoning-gym generator, ``task.name=reasoning_gym:<generator>``."""
    return ReasoningGymTask(cfg.task, cfg.task.name.split(":", 1)[1], tool_options=ToolOptions.from_config(cfg))


@register_task("phantomwiki")
def phantomwiki_task(cfg: Config) -> PhantomWikiTask:
    """PhantomWiki universes (``task.phantomwiki_*``; the ``[phantomwiki]`` extra), one per split."""
    return PhantomWikiTask(cfg.task, tool_options=ToolOptions.from_config(cfg))


@register_task("file", *EVAL_SETS)
def file_task(cfg: Config) -> FileTask:
    """User files (``file``) or an evaluation set: ``task.train_files`` / ``task.val_files``."""
    return FileTask(cfg.task, tool_options=ToolOptions.from_config(cfg))


__all__ = ["Demonstration", "Example", "Task", "get_task", "register_task"]
