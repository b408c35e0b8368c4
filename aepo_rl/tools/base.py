"""Tool protocol and registry.

A tool turns the body of a tool tag (``<search>query</search>``) into result text. ``run``
never raises: failures come back as text, so the rollout continues (aepo-algorithm.md §1.1).
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


def registered_tools() -> list[str]:
    return sorted(_REGISTRY)
