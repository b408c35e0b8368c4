"""Name → function registries for policy losses and advantage estimators (SkyRL/verl style)."""

from __future__ import annotations

from typing import Callable


class Registry(dict):
    """A dict of named functions; ``register`` is a decorator, ``lookup`` fails with the valid names."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, *names: str) -> Callable[[Callable], Callable]:
        """Decorator registering a function under one or more names (an existing name is replaced)."""
        def wrap(fn: Callable) -> Callable:
            for name in names:
                self[name] = fn
            return fn
        return wrap

    def lookup(self, name: str) -> Callable:
        if name not in self:
            raise ValueError(f"unknown {self.kind} '{name}'; valid names: {', '.join(sorted(self))}")
        return self[name]
