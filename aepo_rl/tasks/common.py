"""What every task shares: the tool-protocol system prompt (§1.1), chat messages, tool building."""

from __future__ import annotations

from dataclasses import dataclass

from aepo_rl.config import Config, ConfigError, TaskConfig
from aepo_rl.protocol import Protocol
from aepo_rl.tasks.base import Example
from aepo_rl.tools.base import Tool, get_tool, tool_factory


def system_prompt(tools: tuple[str | Tool, ...] = ("search", "python"), fmt: str = "xml") -> str:
    """The short system message describing the protocol (§1.1) for ``tools`` (registered tool names,
    or tools or their classes) in format ``fmt`` ("xml" | "hermes"); see :class:`Protocol`."""
    specs = [tool_factory(t) if isinstance(t, str) else t for t in tools]
    for tool, spec in zip(tools, specs):
        if not all(hasattr(spec, field) for field in ("name", "tag", "description")):
            raise TypeError(f"tool {tool!r} has no name, tag and description to describe it in the system prompt: "
                            "register a class that declares them, or pass the tool itself")
    return Protocol({spec.tag: spec for spec in specs}, fmt).system_prompt()


SYSTEM_PROMPT = system_prompt()


def chat_messages(question: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The prompt of one question: the tool-protocol system message, then the user question (§1.1)."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def split_examples(task_name: str, splits: dict[str, list[Example]], split: str) -> list[Example]:
    """``splits[split]``; an unknown split raises KeyError naming the task and the splits it has."""
    if split not in splits:
        raise KeyError(f"task '{task_name}' has no split '{split}'; splits: {list(splits)}")
    return splits[split]


SANDBOX_TIMEOUT_SHARE = 0.8
"""The python sandbox's timeout as a share of ``rollout.tool_timeout``: the sandbox kills the code and
reports the timeout itself before the rollout stops waiting for the call."""


@dataclass(frozen=True)
class ToolOptions:
    """Tool settings from outside ``TaskConfig``: where search indexes are cached, the sandbox's limits,
    and the tool-call format prompts and demonstrations are written in."""

    cache_dir: str
    python_timeout: float
    python_workers: int
    python_write_mb: int
    tool_format: str = "xml"
    python_isolation: str = "auto"

    @classmethod
    def from_config(cls, cfg: Config) -> ToolOptions:
        """``model.cache_dir``; ``rollout.tool_timeout`` × SANDBOX_TIMEOUT_SHARE; ``rollout.tool_workers``;
        ``rollout.sandbox_write_mb``; ``rollout.tool_format``; ``rollout.sandbox_isolation``."""
        return cls(cfg.model.cache_dir, SANDBOX_TIMEOUT_SHARE * cfg.rollout.tool_timeout, cfg.rollout.tool_workers,
                   cfg.rollout.sandbox_write_mb, cfg.rollout.tool_format, cfg.rollout.sandbox_isolation)


def check_sandbox(tools, options: ToolOptions | None) -> None:
    """Refuse, when a task is built (before any model), a python tool among ``tools`` (names or tools)
    whose ``rollout.sandbox_isolation`` cannot run here: :class:`~aepo_rl.tools.python.SandboxUnavailable`
    names the ways to a private root and the weaker modes. The probe is cached, so building the tool
    later costs nothing more."""
    if "python" in tools:
        python_tool(options or ToolOptions.from_config(Config()))


def python_tool(options: ToolOptions) -> Tool:
    """The python sandbox with the rollout's limits and isolation."""
    return get_tool("python", timeout=options.python_timeout, pool_size=options.python_workers,
                    write_mb=options.python_write_mb, isolation=options.python_isolation)


def build_tools(task_cfg: TaskConfig, corpus: list[dict] | str | None = None,
                allowed: tuple[str, ...] = ("search", "python"), options: ToolOptions | None = None,
                search_perturb=None) -> dict[str, Tool]:
    """Tools by tag. Search queries ``task_cfg.search_url`` when set, else an in-process BM25 index
    over ``task_cfg.corpus`` (a JSONL path or 'wiki') or, when that is unset, the task's own corpus; each hit
    shows ``task_cfg.search_max_chars`` characters; ``search_perturb`` rewrites its hits (the search tool's
    ``perturb``). ``options`` default to those of the default :class:`Config`."""
    options = options or ToolOptions.from_config(Config())
    tools: dict[str, Tool] = {}
    search = {"perturb": search_perturb} if search_perturb else {}  # a re-registered "search" need not take
    if task_cfg.search_max_chars != TaskConfig.search_max_chars:  # these, unless they are set
        search["max_chars"] = task_cfg.search_max_chars
    if "search" in allowed:
        if task_cfg.search_url:
            tools["search"] = get_tool("search", url=task_cfg.search_url, topk=task_cfg.search_topk, **search)
        else:
            source = task_cfg.corpus or corpus
            if source is None:
                raise ConfigError(f"task '{task_cfg.name}' uses the search tool but has no corpus: "
                                 "set task.corpus=<corpus.jsonl | wiki> or task.search_url=<server URL>")
            tools["search"] = get_tool("search", corpus=source, topk=task_cfg.search_topk, cache_dir=options.cache_dir,
                                       **search)
    if "python" in allowed:
        tools["python"] = python_tool(options)
    return tools
