"""Fakes shared by several test files."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EchoSearch:
    """A search tool that answers ``found <query>`` and records the queries it got."""

    name: str = "search"
    tag: str = "search"
    description: str = "returns its query"
    calls: list[str] = field(default_factory=list)

    def run(self, arg):
        self.calls.append(arg)
        return f"found {arg}"
