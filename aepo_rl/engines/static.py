"""The HF engine's static decode path: one decode step over fixed buffers, recorded as a CUDA graph.

The dynamic path (:mod:`aepo_rl.engines.hf`) runs one eager forward per token over a batch that
shrinks as rows finish, over key/value views that grow by a column per step. Every shape changes,
so on a GPU each step pays about a thousand kernel launches from Python. The static path keeps
every tensor the step touches at a fixed address and shape:

- per-layer key/value buffers ``[rows, kv_heads, columns, head_dim]``, kept across ``generate``
  calls and RL steps; the step writes its new keys/values at a device-side column
  (``index_copy_``, :class:`~aepo_rl.engines.kv.ColumnLayer`);
- a 4-D bool attention mask ``[rows, 1, 1, columns]`` (transformers passes a 4-D mask through
  unchanged), input ids, positions and the column index, all updated in place before each step;
- finished rows stay in the batch as dead rows (their logits are ignored); the batch is
  compacted only when the live rows fall to half of its bucket;
- shapes come in buckets: rows a power of two, columns a multiple of :data:`COLUMN_BUCKET`.

On CUDA the step of each (rows, columns) bucket is captured once with ``torch.cuda.CUDAGraph``
and replayed; elsewhere the same step runs eagerly over the live columns only (``column + 1``, a
width that grows by one per step: no graph needs a fixed shape there, and on the CPU the masked
columns of a bucket cost as much attention as real ones). Prefill, the per-token statistics, sampling
and stop checks stay outside the step, shared with the dynamic path, which keeps the tokens,
log-probs and entropies the same (tests/test_static_decode.py). Graphs and buffers are dropped
when the model's parameters or buffers are replaced (their storage addresses change); in-place
updates (AdamW, ``load_state_dict`` without ``assign``) keep them valid.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from aepo_rl.engines.kv import BatchCache, ColumnLayer, LayerKV

log = logging.getLogger(__name__)

COLUMN_BUCKET = 256
"""Key/value columns come in multiples of this: attention reads at most this many extra masked columns."""

CUDA_GRAPH_SETTINGS = ("auto", "on", "off")
STATIC_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take a 4-D mask as given."""


def row_bucket(rows: int) -> int:
    """The batch rows of the step: the next power of two."""
    return 1 << (rows - 1).bit_length()


def column_bucket(columns: int) -> int:
    return -(-columns // COLUMN_BUCKET) * COLUMN_BUCKET


@dataclass(frozen=True)
class DecodePath:
    """How the HF engine decodes: ``static`` (this module) or the dynamic path; ``capture``: CUDA graphs."""

    static: bool
    capture: bool
    strict: bool
    """``on``: a failed capture is an error; ``auto``: it falls back to the eager static step."""


def decode_path(setting: str, device: torch.device, attention: str) -> DecodePath:
    """``rollout.cuda_graphs`` resolved for a model on ``device`` with attention implementation ``attention``.

    auto: on CUDA the static step captured as graphs; on the CPU the dynamic path (the static
    path is as fast there, but its log-probs differ in the last bits, and every CPU run in
    lab/notebook.md decoded on the dynamic path: docs/benchmarks.md); with an attention implementation
    that does not take a 4-D mask (flash), the dynamic path.
    on: the static path (graphs on CUDA, eager elsewhere); off: the dynamic path.
    """
    if setting not in CUDA_GRAPH_SETTINGS:
        raise ValueError(f"rollout.cuda_graphs must be one of {CUDA_GRAPH_SETTINGS}, got {setting!r}")
    supported = attention in STATIC_ATTENTION
    if setting == "on" and not supported:
        raise ValueError(f"rollout.cuda_graphs=on needs an attention implementation in {STATIC_ATTENTION} (the "
                         f"model uses {attention!r}); set model attn_implementation=sdpa or rollout.cuda_graphs=off")
    cuda = device.type == "cuda"
    if setting == "off" or (setting == "auto" and not (cuda and supported)):
        return DecodePath(static=False, capture=False, strict=False)
    return DecodePath(static=True, capture=cuda, strict=setting == "on")


def parameter_fingerprint(model) -> tuple:
    """Storage address, dtype and device of every parameter and buffer: changes when one is replaced."""
    return tuple((t.data_ptr(), t.dtype, t.device) for t in (*model.parameters(), *model.buffers()))


class StaticDecoder:
    """The static buffers and the recorded steps of one engine, kept across ``generate`` calls."""

    def __init__(self, model, cache_kwarg: str, capture: bool, strict: bool):
        self.model = model
        self.cache_kwarg = cache_kwarg
        self.capture = capture
        self.strict = strict
        self.bool_mask = model.config._attn_implementation == "sdpa"
        self.live_width = not capture
        """Eager steps attend over the live columns only (``column + 1``, no graph needs a fixed shape; on the
        CPU the masked columns of the bucket cost as much as real ones); captured steps over the whole bucket."""
        self.graphs_captured = 0
        """How many steps were captured as CUDA graphs over this decoder's life (0 on the CPU)."""
        self._fingerprint = None
        self._buffers: _Buffers | None = None
        self._steps: dict[tuple[int, int], object] = {}
        self._pool = None

    def drop(self) -> None:
        """Forget the buffers and every recorded step (their memory is freed with them)."""
        self._buffers, self._steps, self._pool = None, {}, None

    def batch(self, cache: BatchCache, mask: torch.Tensor, lengths: torch.Tensor, column: int,
              total_columns: int) -> StaticBatch:
        """Load a prefilled batch (``cache``, 2-D ``mask``, ``lengths``, next ``column``) into the buffers."""
        fingerprint = parameter_fingerprint(self.model)
        if fingerprint != self._fingerprint:
            self.drop()
            self._fingerprint = fingerprint
        rows, columns = row_bucket(len(lengths)), column_bucket(total_columns)
        keys = cache.layers[0].buffer_keys
        values = cache.layers[0].buffer_values
        buffers = self._buffers
        if (buffers is None or buffers.rows < rows or buffers.columns < columns or buffers.dtype != keys.dtype
                or buffers.keys[0].shape[1::2] != keys.shape[1::2]):
            self.drop()
            vocab = self.model.get_output_embeddings().weight.shape[0]
            grown = (max(rows, buffers.rows), max(columns, buffers.columns)) if buffers else (rows, columns)
            buffers = self._buffers = _Buffers.allocate(len(cache.layers), *grown, keys, values, vocab)
        return StaticBatch(self, buffers, cache, mask, lengths, column, rows, columns)

    def step(self, rows: int, columns: int):
        """The step over the first ``rows`` rows and ``columns`` columns: a CUDA graph's ``replay`` or the
        eager function (kept per bucket unless :attr:`live_width`, where the columns change every step)."""
        if self.live_width:
            return self._eager_step(rows, columns)
        key = (rows, columns)
        if key not in self._steps:
            run = self._eager_step(rows, columns)
            self._steps[key] = self._capture(run) if self.capture else run
        return self._steps[key]

    def _eager_step(self, rows: int, columns: int):
        b = self._buffers
        cache = Cache(layers=[ColumnLayer(k[:rows, :, :columns], v[:rows, :, :columns], b.column)
                              for k, v in zip(b.keys, b.values)])
        mask = b.mask[:rows, :, :, :columns]
        kwargs = {self.cache_kwarg: cache, "use_cache": True}
        minimum = torch.finfo(b.dtype).min

        def run() -> None:
            attention = mask if self.bool_mask else torch.where(mask, 0.0, minimum).to(b.dtype)
            out = self.model(input_ids=b.input_ids[:rows], attention_mask=attention,
                             position_ids=b.positions[:rows], **kwargs)
            b.logits[:rows].copy_(out.logits[:, -1])

        return run

    def _capture(self, run):
        """Warm the step up on a side stream (it is idempotent: it rewrites the same column), then record it."""
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                run()
        except Exception as error:
            if self.strict:
                raise
            log.warning("rollout.cuda_graphs=auto: capturing the decode step failed (%s); decoding with the eager "
                        "static step", error)
            self.capture = False
            return run
        self.graphs_captured += 1
        return graph.replay


@dataclass
class _Buffers:
    """Everything the step reads or writes, at fixed addresses; the step of a bucket uses leading views."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    column: torch.Tensor
    logits: torch.Tensor

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def columns(self) -> int:
        return self.mask.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @classmethod
    def allocate(cls, layers: int, rows: int, columns: int, keys: torch.Tensor, values: torch.Tensor,
                 vocab: int) -> _Buffers:
        device = keys.device

        def kv(like):
            return [like.new_zeros(rows, like.shape[1], columns, like.shape[-1]) for _ in range(layers)]

        return cls(kv(keys), kv(values), torch.zeros(rows, 1, 1, columns, dtype=torch.bool, device=device),
                   torch.zeros(rows, 1, dtype=torch.long, device=device),
                   torch.zeros(rows, 1, dtype=torch.long, device=device),
                   torch.zeros(1, dtype=torch.long, device=device),
                   torch.zeros(rows, vocab, dtype=torch.float32, device=device))


class StaticBatch:
    """One ``generate`` call's decode state over the static buffers; its live rows are indexed like the
    dynamic path's batch (0..n-1) and mapped to buffer rows."""

    def __init__(self, decoder: StaticDecoder, buffers: _Buffers, cache: BatchCache, mask: torch.Tensor,
                 lengths: torch.Tensor, column: int, rows: int, columns: int):
        n, b = len(lengths), buffers
        for layer, keys, values in zip(cache.layers, b.keys, b.values):
            if layer.is_initialized:
                keys[:n, :, :column] = layer.buffer_keys[:, :, :column]
                values[:n, :, :column] = layer.buffer_values[:, :, :column]
        b.mask[:rows] = False
        b.mask[:n, 0, 0, :column] = mask[:, :column]
        b.positions[:rows] = 0
        b.positions[:n, 0] = lengths
        self.decoder, self.buffers = decoder, buffers
        self.rows, self.columns, self.column = rows, columns, column
        self.live = list(range(n))
        self._live = torch.arange(n, device=lengths.device)

    def row_state(self, row: int) -> tuple[list[LayerKV], int]:
        """A finished live row's keys/values (its real columns, compact) and cached-token count."""
        b, r = self.buffers, self.live[row]
        columns = b.mask[r, 0, 0, :self.column].nonzero().squeeze(-1)
        return [(k[r][:, columns], v[r][:, columns]) for k, v in zip(b.keys, b.values)], int(b.positions[r, 0])

    def keep(self, keep: torch.Tensor) -> None:
        """Only the live rows ``keep`` go on; the others become dead rows, or leave when half are dead."""
        self.live = [self.live[i] for i in keep.tolist()]
        self._live = self._live[keep]
        n = len(self.live)
        if row_bucket(n) < self.rows and self.live != list(range(n)):
            b, used = self.buffers, self.column  # columns past the used ones are masked in every row
            for tensor in (*b.keys, *b.values):
                tensor[:n, :, :used] = tensor[self._live, :, :used]
            b.mask[:n, ..., :used] = b.mask[self._live, ..., :used]
            b.positions[:n] = b.positions[self._live]
            self.live = list(range(n))
            self._live = torch.arange(n, device=self._live.device)
        self.rows = max(row_bucket(n), 1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each live row its new token; returns the next logits of the live rows [n, V] (fp32)."""
        b = self.buffers
        b.input_ids.index_copy_(0, self._live, tokens[:, None])
        b.mask[:self.rows, 0, 0, self.column] = True  # every row (dead and padding ones too) sees its own new column
        b.column.fill_(self.column)
        self.decoder.step(self.rows, self.column + 1 if self.decoder.live_width else self.columns)()
        b.positions[:self.rows] += 1
        self.column += 1
        return b.logits[self._live]
