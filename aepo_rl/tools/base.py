"""Tool protocol and registry.

A tool turns the body of a tool tag (``<search>query</search>``) into result text. ``run``
never raises: failures come back as text, so the rollout continues (docs/algorithm.md §1.1).
Users add tools with ``@register_tool("name")``.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable


@runtime_checkable
class Tool(Protocol):
    name: str
    """Registry name, also the Hermes function name."""
    tag: str
    """XML tag the model writes the call in (``search`` → ``<search>…</search>``)."""
    description: str
    """One line for the system prompt and the Hermes tool schema."""

    def run(self, arg: str) -> str:
        """Execute the call; never raises (errors come back as text)."""


_REGISTRY: dict[str, Callable[..., Tool]] = {}


def register_tool(name: str) -> Callable[[Callable[..., Tool]], Callable[..., Tool]]:
    """Class decorator: ``@register_tool("calculator")`` makes ``get_tool("calculator")`` work."""

    def wrap(factory: Callable[..., Tool]) -> Callable[..., Tool]:
        _REGISTRY[name] = factory
        return factory

    return wrap


def get_tool(name: str, **options) -> Tool:
    """Build a registered tool with its options."""
    import aepo_rl.tools  # noqa: F401  (registers the built-in tools)

    if name not in _REGISTRY:
        raise KeyError(f"unknown tool '{name}'; registered tools: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**options)


def argument_error(arg: object, max_chars: int) -> str | None:
    """Why a tool argument is unusable, as the error text ``run`` returns, or None if it is fine.

    Rejects non-strings, arguments longer than ``max_chars``, and binary garbage: NUL and
    other control bytes, lone surrogates (undecodable bytes) and U+FFFD replacement characters.
    """
    if not isinstance(arg, str):
        return f"Error: the tool argument must be text, got {type(arg).__name__}."
    if len(arg) > max_chars:
        return f"Error: the tool argument has {len(arg)} characters; the limit is {max_chars}."
    if not _GARBAGE.isdisjoint(arg) or _has_surrogate(arg):
        return "Error: the tool argument contains binary data (control bytes or invalid unicode)."
    return None


_GARBAGE = frozenset(chr(c) for c in range(32) if chr(c) not in "\t\n\r\f") | {"\x7f", "\ufffd"}


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
