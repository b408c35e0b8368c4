"""What every task shares: the tool-protocol system prompt (§1.1), chat messages, tool building."""

from __future__ import annotations

from dataclasses import dataclass

from aepo_rl.config import Config, TaskConfig
from aepo_rl.tasks.base import Example
from aepo_rl.tools.base import Tool, get_tool

_TOOL_LINES = {"search": "<search>query</search> searches", "python": "<python>code</python> runs Python"}


def system_prompt(tools: tuple[str, ...] = ("search", "python")) -> str:
    """The short system message describing the tag protocol for the given tools (§1.1)."""
    uses = ", ".join(_TOOL_LINES[t] for t in tools)
    return (f"Use tools to answer. {uses}; results come in <result></result>. "
            "Think in <think></think> if needed. Answer as <answer>\\boxed{answer}</answer>.")


SYSTEM_PROMPT = system_prompt()


def chat_messages(question: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The prompt of one question: the tool-protocol system message, then the user question (§1.1)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def split_examples(task_name: str, splits: dict[str, list[Example]], split: str) -> list[Example]:
    """``splits[split]``; an unknown split raises KeyError naming the task and the splits it has."""
    if split not in splits:
        raise KeyError(f"task '{task_name}' has no split '{split}'; splits: {list(splits)}")
    return splits[split]


def format_result(output: str) -> str:
    """A tool result block exactly as the rollout appends it after the closing tag (§1.1)."""
    return f" <result>\n{output}\n</result>"


SANDBOX_TIMEOUT_SHARE = 0.8
"""The python sandbox's timeout as a share of ``rollout.tool_timeout``: the sandbox kills the code and
reports the timeout itself before the rollout stops waiting for the call."""


@dataclass(frozen=True)
class ToolOptions:
    """Tool settings from outside ``TaskConfig``: where search indexes are cached, the sandbox's limits."""

    cache_dir: str
    python_timeout: float
    python_workers: int

    @classmethod
    def from_config(cls, cfg: Config) -> ToolOptions:
        """``model.cache_dir``; ``rollout.tool_timeout`` × SANDBOX_TIMEOUT_SHARE; ``rollout.tool_workers``."""
        return cls(cfg.model.cache_dir, SANDBOX_TIMEOUT_SHARE * cfg.rollout.tool_timeout, cfg.rollout.tool_workers)


def build_tools(task_cfg: TaskConfig, corpus: list[dict] | str | None = None,
                allowed: tuple[str, ...] = ("search", "python"), options: ToolOptions | None = None
                ) -> dict[str, Tool]:
    """Tools by tag. Search queries ``task_cfg.search_url`` when set, else an in-process BM25 index
    over ``task_cfg.corpus`` (a JSONL path or 'wiki') or, when that is unset, the task's own corpus.
    ``options`` default to those of the default :class:`Config`."""
    options = options or ToolOptions.from_config(Config())
    tools: dict[str, Tool] = {}
    if "search" in allowed:
        if task_cfg.search_url:
            tools["search"] = get_tool("search", url=task_cfg.search_url, topk=task_cfg.search_topk)
        else:
            source = task_cfg.corpus or corpus
            if source is None:
                raise ValueError(f"task '{task_cfg.name}' uses the search tool but has no corpus: "
                                 "set task.corpus=<corpus.jsonl | wiki> or task.search_url=<server URL>")
            tools["search"] = get_tool("search", corpus=source, topk=task_cfg.search_topk, cache_dir=options.cache_dir)
    if "python" in allowed:
        tools["python"] = get_tool("python", timeout=options.python_timeout, pool_size=options.python_workers)
    return tools
