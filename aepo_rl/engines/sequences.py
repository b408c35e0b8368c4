"""Per-sequence state by id: the bookkeeping every engine shares."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

State = TypeVar("State")


class SequenceTable(Generic[State]):
    """Sequence ids → an engine's per-sequence state. Ids count up from 0 and are never reused."""

    def __init__(self, engine_name: str):
        self.engine_name = engine_name
        self._states: dict[int, State] = {}
        self._next_id = 0

    def add(self, state: State) -> int:
        seq_id = self._next_id
        self._next_id += 1
        self._states[seq_id] = state
        return seq_id

    def __getitem__(self, seq_id: int) -> State:
        if seq_id not in self._states:
            raise KeyError(f"{self.engine_name}: unknown or released sequence id {seq_id}")
        return self._states[seq_id]

    def release(self, seq_id: int) -> None:
        self[seq_id]
        del self._states[seq_id]

    def values(self) -> Iterable[State]:
        return self._states.values()
