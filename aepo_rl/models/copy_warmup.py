"""Copy warm-up of the tiny model: language modelling on repeated random token sequences.

A pretrained LLM arrives at SFT able to copy a name from its context (induction heads); a
randomly initialised tiny model does not, and the task's demonstrations hold too few copies
for it to learn within the CPU budget. Sequences ``x x`` of random non-special tokens, with
the next-token loss on every position, make the copy circuit form in a phase change (as for
induction heads in small transformers) whose step varies with the initialisation; the skill then
carries over to copying entity names and values in the task. Measurements (steps per seed,
transfer, settings that form it faster but transfer worse) are in lab/notebook.md.
Part of the cached tiny-model build (§5's pipeline starts from a pretrained model; this stands
in for pretraining).

:func:`induction_circuit` writes that circuit into the freshly initialised weights instead (the
default, ``model.tiny_init=induction``): the model copies from step 0, and the warm-up takes its
``CIRCUIT_STEPS`` steps to calibrate the rest, where a random start waits, for a number of steps
that varies with the seed, for the phase change (measured in lab/notebook.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from aepo_rl.config import CIRCUIT_MIN_HEAD_DIM, circuit_heads, circuit_shape_error
from aepo_rl.models.forward import lm_head, packed_hidden

COPY_BATCH = 32
COPY_LR = 3e-3
COPY_LENGTHS = (8, 24)
COPY_TARGET = 0.9
CIRCUIT_STEPS = 300
"""Sequences per step, AdamW learning rate, the range of the repeated half's length, the copy
accuracy at which the warm-up stops (the steps it takes vary with the initialisation), and the
steps it takes at least from the induction circuit (which copies from the start but predicts the
rest with uncalibrated confidence: the task's SFT then learns badly, lab/notebook.md)."""


def copy_batch(pool: torch.Tensor, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` [B, 2·max_len] holding ``x x`` per row (x drawn from ``pool``), right-padded, and the attention
    mask."""
    low, high = COPY_LENGTHS
    lengths = torch.randint(low, high + 1, (batch_size,), generator=generator)
    halves = pool[torch.randint(len(pool), (batch_size, high), generator=generator)]
    positions = torch.arange(2 * high)
    in_row = positions < 2 * lengths[:, None]
    source = torch.where(positions < lengths[:, None], positions, positions - lengths[:, None]).clamp(max=high - 1)
    ids = torch.where(in_row, halves.gather(1, source.expand(batch_size, -1)), 0)
    return ids, in_row.long()


def copy_warmup(model, tokenizer, steps: int, seed: int = 0, min_steps: int = 0,
                on_step: Callable[[float, float], None] | None = None) -> list[float]:
    """Train ``model`` in place on repeated random sequences for at most ``steps`` AdamW steps,
    stopping once it copies: argmax accuracy ≥ ``COPY_TARGET`` on the repeated half of a fresh
    batch (measured before that batch's update), after at least ``min_steps`` steps. Returns the
    losses, one per step taken.
    Batches are drawn on the CPU (the same on every device) and moved to the model's device.

    ``on_step(loss, accuracy)``, when given, is called after each step (progress display)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=COPY_LR, betas=(0.9, 0.95), weight_decay=0.01)
    device = next(model.parameters()).device
    model.train()
    losses = []
    for step in range(steps):
        ids, mask = (t.to(device) for t in copy_batch(pool, COPY_BATCH, generator))
        # the rows packed (a third of the batch is padding) and only real targets through the LM head
        # (models/forward.py)
        targets = mask[:, 1:].bool()
        logits = lm_head(model, packed_hidden(model, ids, mask.sum(1))[:, :-1][targets])
        accuracy = repeated_half_accuracy(logits, ids, mask)
        if accuracy >= COPY_TARGET and step >= min_steps:
            break
        loss = F.cross_entropy(logits, ids[:, 1:][targets])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(losses[-1], accuracy)
    model.eval()
    return losses


def repeated_half(mask: torch.Tensor) -> torch.Tensor:
    """[B, T-1] bool over next-token targets: the second copy's tokens after its first, the ones
    only a model that copies can predict."""
    lengths = mask.sum(1, keepdim=True) // 2
    target = torch.arange(1, mask.shape[1], device=mask.device)
    return (target >= lengths + 1) & (target < 2 * lengths)


def repeated_half_accuracy(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the second copy's tokens (after its first, which nothing predicts) that
    ``logits`` predict by argmax: [N, V] at the real targets ``mask[:, 1:]`` in row order."""
    targets = mask[:, 1:].bool()
    repeated = repeated_half(mask)[targets]
    hits = (logits.argmax(-1) == ids[:, 1:][targets]) & repeated
    return float(hits.sum() / repeated.sum())


PREV_PAIRS = 3
MATCH_PAIRS = CIRCUIT_MIN_HEAD_DIM // 2 - PREV_PAIRS
CONSTANT = 2.5
ATTENTION_GAIN = 2.0
COPY_WRITE = 5.0
LOGIT_SCALE = 0.2
REFERENCE_WIDTH = 128
"""The induction circuit's sizes: RoPE frequency pairs of the previous-token head's position
match (the fastest), pairs of the induction head's token match (the slowest, which barely turn
over a few hundred positions; together they fill ``CIRCUIT_MIN_HEAD_DIM``), the constant embedding
coordinate (token coordinates have unit scale) that gives the first head a content-free query and
key, the factor on the two heads' q/k norm weights that sharpens their softmax, how strongly the
induction head writes the copied token against the current token's embedding, and the final norm's
weight at the default width ``REFERENCE_WIDTH`` (the logits' scale; it falls as 1/width, see
:func:`induction_circuit`)."""


def _head_rows(j: int, head_dim: int) -> slice:
    return slice(j * head_dim, (j + 1) * head_dim)


def _diagonal(rows: int, cols: int, row: int, col: int, count: int) -> torch.Tensor:
    """[rows, cols] zeros with ones at (row + i, col + i) for i < count (none when count ≤ 0)."""
    out = torch.zeros(rows, cols)
    i = torch.arange(max(count, 0))
    out[row + i, col + i] = 1.0
    return out


@torch.no_grad()
def induction_circuit(model, seed: int = 0) -> None:
    """Set the weights of a freshly initialised Qwen3-style model (at least 2 layers, per-head q/k
    RMSNorm, RoPE, tied embeddings) to a two-layer induction circuit, the circuit the copy
    warm-up trains (Olsson et al. 2022, "In-context learning and induction heads"):

    - the residual stream is split in halves: the token's embedding lives in the first half (its
      last coordinate a constant), the second half starts empty;
    - layer 0 attends to the previous position: its query and key read only the constant
      coordinate, so their dot product depends on the relative position alone, a RoPE phase that
      peaks at an offset of one; it writes the previous token's (normalised) embedding into the
      second half;
    - layer 1 attends to the positions whose previous token is the current token: query (the first
      half) and key (the second half) pass through one random map into RoPE's slowest pairs; it
      writes the attended token's embedding into the first half, so the tied LM head predicts the
      token that followed the current one last time.

    A head carries ``head_dim`` coordinates of the half it moves, so each layer's circuit is the first
    ``ceil(hidden_size/2 / head_dim)`` key/value heads (one at the default 128 wide with head_dim 64),
    all with the same query and key (:func:`circuit_heads`): head j moves coordinates j·head_dim onwards.
    Under grouped-query attention the circuit's query heads are the first of each key/value head's group.

    Every other head's and every MLP's output projection starts at zero (as nanochat initialises
    them), so nothing else writes into the stream until training moves them; their other weights
    keep their random initialisation. The embeddings have unit scale (as nanochat's), not the
    initializer's 0.02: AdamW moves every weight by about its learning rate per step, which at 0.02
    takes the circuit apart (lab/notebook.md); at unit scale training sharpens it instead. A token's
    logit against its own embedding grows with the width (its squared norm), so the final norm's
    weight is ``LOGIT_SCALE`` × ``REFERENCE_WIDTH`` / width: at 256 wide the default's scale made the
    first warm-up steps take the circuit apart (copy accuracy 0.93 → 0.02, lab/notebook.md).
    """
    core, config = model.model, model.config
    width, head_dim = config.hidden_size, config.head_dim
    error = circuit_shape_error(width, config.num_hidden_layers, config.num_attention_heads,
                                config.num_key_value_heads, head_dim)
    if error:
        raise ValueError(error)
    half, pairs = width // 2, head_dim // 2
    heads = circuit_heads(width, head_dim)
    group = config.num_attention_heads // config.num_key_value_heads
    embed = core.embed_tokens.weight
    first, second = core.layers[0].self_attn, core.layers[1].self_attn
    theta = config.rope_parameters["rope_theta"]
    frequency = theta ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
    for layer in core.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()

    embed[:, half:] = 0
    embed[:, :half - 1] *= math.sqrt(width / (half - 1)) / config.initializer_range  # unit scale in fewer coordinates
    embed[:, half - 1] = CONSTANT
    constant = torch.zeros(width)
    constant[half - 1] = 1.0

    # layer 0: the query is the key rotated back by one position: q·R(−Δ)k = Σ cos((Δ−1)ω)
    key, query = torch.zeros(head_dim), torch.zeros(head_dim)
    for i in range(PREV_PAIRS):
        key[i] = 1.0
        query[i], query[i + pairs] = math.cos(frequency[i]), -math.sin(frequency[i])
    fast = [*range(PREV_PAIRS), *range(pairs, pairs + PREV_PAIRS)]
    first.q_norm.weight[fast] *= ATTENTION_GAIN
    first.k_norm.weight[fast] *= ATTENTION_GAIN
    for j in range(heads):  # head j: the value is coordinates j·head_dim… of the token's half
        q, kv = _head_rows(j * group, head_dim), _head_rows(j, head_dim)
        first.q_proj.weight[q] = torch.outer(query, constant)
        first.k_proj.weight[kv] = torch.outer(key, constant)
        moved = min(head_dim, half - j * head_dim)  # the coordinates head j moves
        first.v_proj.weight[kv] = _diagonal(head_dim, width, 0, j * head_dim, moved)
        first.o_proj.weight[half:, q] = _diagonal(width - half, head_dim, j * head_dim, 0,
                                                  min(head_dim, width - half - j * head_dim))

    # layer 1: match the current token (first half) against the previous one (second half)
    slow = [*range(pairs - MATCH_PAIRS, pairs), *range(head_dim - MATCH_PAIRS, head_dim)]
    generator = torch.Generator().manual_seed(seed)
    match = torch.randn(len(slow), half - 1, generator=generator) / math.sqrt(half - 1)
    second.q_norm.weight[slow] *= ATTENTION_GAIN
    second.k_norm.weight[slow] *= ATTENTION_GAIN
    for j in range(heads):
        q, kv = _head_rows(j * group, head_dim), _head_rows(j, head_dim)
        second.q_proj.weight[q] = 0
        second.k_proj.weight[kv] = 0
        second.q_proj.weight[q][slow, :half - 1] = match
        second.k_proj.weight[kv][slow, half:2 * half - 1] = match
        moved = min(head_dim, half - j * head_dim)
        second.v_proj.weight[kv] = _diagonal(head_dim, width, 0, j * head_dim, moved)
        second.o_proj.weight[:half, q] = COPY_WRITE * _diagonal(half, head_dim, j * head_dim, 0, moved)
    core.norm.weight.fill_(LOGIT_SCALE * REFERENCE_WIDTH / width)
