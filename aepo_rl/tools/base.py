"""Tool protocol and registry.

A tool turns the body of a tool tag (``<search>query</search>``) into result text. ``run``
never raises: failures come back as text, so the rollout continues (docs/algorithm.md §1.1), and
a failed call returns its text as a :class:`ToolError` so the rollout marks it as an error.
Users add tools with ``@register_tool("name")`` on a factory ``(**options) -> Tool`` (an entry of
:data:`aepo_rl.registry.TOOLS`); ``get_tool(name, **options)`` builds one, and ``aepo_rl.protocol``
prompts, parses and checks its calls.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from aepo_rl.registry import TOOLS, register_tool

__all__ = ["Tool", "ToolError", "argument_error", "get_tool", "register_tool"]


class ToolError(str):
    """The result text of a call that failed: the tool could not give its result (a server
    unreachable or answering with an error, a sandbox that could not run or stopped the code at a
    limit, an unusable argument). It is the text the model sees, unchanged; the rollout records
    the call with ``error=True`` and counts it in ``rollout/tool_errors``. A plain ``str`` from
    ``run`` is a result: what the tool found or what the model's code printed, tracebacks of the
    model's own code included. String operations on a ``ToolError`` give plain ``str``: return it
    as built."""

    __slots__ = ()


@runtime_checkable
class Tool(Protocol):
    """A tool. Two optional attributes shape its line of the system prompt, ``<tag>argument</tag> usage``
    (``aepo_rl.protocol``): ``argument``, the name of the call's one argument, also its key in a
    Hermes call (default ``"input"``); ``usage``, what a call does (default: ``description``
    without its final period). Search declares ``"query"`` / ``"searches"``."""

    name: str
    """Registry name, also the Hermes function name."""
    tag: str
    """XML tag the model writes the call in (``search`` → ``<search>…</search>``)."""
    description: str
    """One line for the system prompt and the Hermes tool schema."""

    def run(self, arg: str) -> str:
        """Execute the call; never raises: a failed call returns its error text as a :class:`ToolError`."""


def get_tool(name: str, **options) -> Tool:
    """Build a registered tool with its options (UnknownNameError, a KeyError, listing the tools otherwise)."""
    return tool_factory(name)(**options)


def tool_factory(name: str) -> Callable[..., Tool]:
    """The registered factory of tool ``name`` (usually its class, whose attributes describe the
    tool for the system prompt without building it)."""
    return TOOLS.lookup(name)


def argument_error(arg: object, max_chars: int) -> ToolError | None:
    """Why a tool argument is unusable, as the error text ``run`` returns, or None if it is fine.

    Rejects non-strings, arguments longer than ``max_chars``, and binary garbage: NUL and
    other control bytes, lone surrogates (undecodable bytes) and U+FFFD replacement characters.
    """
    if not isinstance(arg, str):
        return ToolError(f"Error: the tool argument must be text, got {type(arg).__name__}.")
    if len(arg) > max_chars:
        return ToolError(f"Error: the tool argument has {len(arg)} characters; the limit is {max_chars}.")
    if not _GARBAGE.isdisjoint(arg) or _has_surrogate(arg):
        return ToolError("Error: the tool argument contains binary data (control bytes or invalid unicode).")
    return None


_GARBAGE = frozenset(chr(c) for c in range(32) if chr(c) not in "\t\n\r\f") | {"\x7f", "\ufffd"}


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
