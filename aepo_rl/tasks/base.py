"""Task protocol: questions with gold answers, the tools they need, a reward, demonstrations.

A task hands the trainer chat-formatted prompts (``Example.messages``), the tools its agent
may call, and a verl-style reward; the synthetic task also hands cold-start SFT its teacher
demonstrations (docs/algorithm.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from aepo_rl.tools.base import Tool


@dataclass
class Example:
    """One question, in verl's RL data schema (docs/architecture.md, Contracts)."""

    id: str
    question: str
    answers: list[str]
    """Gold answers (any one counts)."""
    data_source: str
    messages: list[dict[str, str]]
    """The prompt as chat messages (system with the tool protocol, then the user question)."""
    ability: str = "agent"
    extra_info: dict = field(default_factory=dict)
    row: dict = field(default_factory=dict)
    """The data row it was read from (a file's or a dataset's; empty for generated tasks): reward functions of
    TRL's convention receive its columns."""


@dataclass
class Demonstration:
    """A teacher trajectory for SFT: alternating model text and tool results."""

    example: Example
    pieces: list[tuple[str, bool]]
    """(text, trained) in order: model-written text is trained, tool results are not."""
    has_error: bool = False


@runtime_checkable
class Task(Protocol):
    name: str

    def examples(self, split: str) -> list[Example]:
        """Questions of a split ("train", "dev", "test")."""

    def tools(self) -> dict[str, Tool]:
        """Tools by tag, e.g. {"search": ..., "python": ...}."""

    def reward(self, example: Example, response_text: str) -> float:
        """Score of a decoded response (model text and <result> blocks), §3. A task may also score a whole
        batch at once with ``score(examples, texts, token_ids) -> (scores, metrics)``; the RL trainer then
        calls that once per rollout (:class:`aepo_rl.tasks.dataset.DatasetTask` does)."""

    def correct(self, example: Example, response_text: str) -> bool:
        """The response's final answer is right (used for pass@k)."""

    def demonstrations(self) -> list[Demonstration]:
        """Teacher trajectories for cold-start SFT (empty if the task has none)."""

    def texts(self) -> list[str]:
        """Representative text (corpus, prompts, demonstrations) to train a tokenizer on."""


def split_tools(task: Task, split: str) -> dict[str, Tool]:
    """The tools of a rollout on ``split``: ``task.split_tools(split)`` when the task has one (the file task searches
    ``task.val_corpus`` in its evaluation splits), else ``task.tools()``."""
    tools_of = getattr(task, "split_tools", None)
    return tools_of(split) if tools_of is not None else task.tools()
