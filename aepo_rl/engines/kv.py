"""KV-cache storage for the HF engine: per-sequence contexts and the batch cache of one generate.

Between ``generate`` calls each sequence owns a :class:`Context`: the keys/values of its first
``n_cached`` tokens (one compact tensor pair per layer) plus the tokens after them that the
model has not run yet (``pending``: the last generated token and appended tool results).
A fork shares the parent's Context object, so shared pending tokens are run once (§1.5);
``append`` replaces a sequence's Context with a new one (copy-on-write).

During ``generate`` the rows are laid out in one :class:`BatchCache` whose layers write into
buffers sized for the whole call (no ``torch.cat`` per step). Rows are right-aligned at a common
column: [left padding | cached tokens | holes | pending tokens | decoded tokens]; a 2-D
attention mask marks the real columns and explicit position ids keep each row's positions.
The static decode path (:mod:`aepo_rl.engines.static`) copies that batch into fixed buffers whose
layers are :class:`ColumnLayer` views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""Keys and values of one layer for one sequence: [kv_heads, tokens, head_dim] each."""


@dataclass
class Context:
    """A sequence's model state between generate calls (shared by forks until it changes)."""

    kv: list[LayerKV] | None
    n_cached: int
    pending: list[int]
    pending_generated: int = 0
    """How many leading pending tokens the model generated (counted as decode, not prefill)."""
    next_logits: torch.Tensor | None = None
    """Logits after the last token, once no token is pending."""


class BufferLayer(DynamicLayer):
    """One layer's batch keys/values in a buffer of fixed capacity, written in place."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        self.buffer_keys = key_states.new_zeros(batch, heads, self.capacity, key_states.shape[-1])
        self.buffer_values = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        self.device = key_states.device
        self.is_initialized = True

    def load_rows(self, rows: list[LayerKV | None], width: int) -> None:
        """Copy each row's cached keys/values right-aligned into columns [0, width)."""
        keys, values = next((kv for kv in rows if kv is not None))
        heads = keys.shape[0]
        self.lazy_initialization(keys.new_empty(len(rows), heads, 0, keys.shape[-1]),
                                 values.new_empty(len(rows), heads, 0, values.shape[-1]))
        for row, kv in enumerate(rows):
            if kv is not None and kv[0].shape[1]:
                n = kv[0].shape[1]
                self.buffer_keys[row, :, width - n:width] = kv[0]
                self.buffer_values[row, :, width - n:width] = kv[1]
        self.length = width
        self._expose()

    def _expose(self) -> None:
        self.keys = self.buffer_keys[:, :, :self.length]
        self.values = self.buffer_values[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> LayerKV:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"BufferLayer capacity {self.capacity} exceeded ({end} columns)")
        self.buffer_keys[:, :, self.length:end] = key_states
        self.buffer_values[:, :, self.length:end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.buffer_keys = self.buffer_keys[indices]
            self.buffer_values = self.buffer_values[indices]
            self._expose()

    def row(self, row: int, columns: torch.Tensor) -> LayerKV:
        """A compact copy of one row's keys/values at the given columns."""
        return self.buffer_keys[row][:, columns], self.buffer_values[row][:, columns]


class ColumnLayer(DynamicLayer):
    """One layer's keys/values as fixed views of the static decode buffers: each step writes its token's
    keys/values at the column held in a device tensor and attends over the whole view (a 4-D mask
    hides the columns not in use), so no shape or address changes from step to step."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> LayerKV:
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.keys.shape[2]


class BatchCache(Cache):
    """The model-facing cache of one generate call: a :class:`BufferLayer` per decoder layer."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[BufferLayer(capacity) for _ in range(num_layers)])

    def load_rows(self, contexts: list[Context], width: int) -> None:
        if width == 0:
            return
        for i, layer in enumerate(self.layers):
            layer.load_rows([c.kv[i] if c.kv is not None else None for c in contexts], width)

    def extract_row(self, row: int, columns: torch.Tensor) -> list[LayerKV]:
        return [layer.row(row, columns) for layer in self.layers]
