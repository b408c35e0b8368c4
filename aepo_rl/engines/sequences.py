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


class TokenLists:
    """Sequence bookkeeping of an engine that keeps each sequence's token ids and sends the whole context
    with every request, leaving the reuse of a shared prefix to the backend's prefix cache (OpenAIEngine,
    VLLMEngine). The engine sets ``self._sequences = SequenceTable(name)`` and ``self.counters``."""

    _sequences: SequenceTable[list[int]]
    counters: dict[str, float]

    def add_sequence(self, prompt_token_ids: list[int]) -> int:
        if not prompt_token_ids:
            raise ValueError("add_sequence: prompt_token_ids is empty")
        return self._sequences.add(list(prompt_token_ids))

    def fork(self, seq_id: int) -> int:
        """A new token list; the backend's prefix cache serves the shared context."""
        return self._sequences.add(list(self._sequences[seq_id]))

    def append(self, seq_id: int, token_ids: list[int]) -> None:
        self._sequences[seq_id].extend(token_ids)

    def release(self, seq_id: int) -> None:
        self._sequences.release(seq_id)

    def stats(self) -> dict[str, float]:
        return dict(self.counters)

    def token_ids(self, seq_id: int) -> list[int]:
        return list(self._sequences[seq_id])
