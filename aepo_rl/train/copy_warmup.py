"""Copy warm-up of the tiny model: language modelling on repeated random token sequences.

A pretrained LLM arrives at SFT able to copy a name from its context (induction heads); a
randomly initialised tiny model does not, and the task's demonstrations hold too few copies
for it to learn within the CPU budget. Sequences ``x x`` of random non-special tokens, with
the next-token loss on every position, make the copy circuit form in a phase change (as for
induction heads in small transformers) whose step varies with the initialisation; the skill then
carries over to copying entity names and values in the task. Measurements (steps per seed,
transfer, settings that form it faster but transfer worse) are in docs/results.md.
Part of the cached tiny-model build (§5's pipeline starts from a pretrained model; this stands
in for pretraining).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from aepo_rl.train.forward import lm_head, packed_hidden

COPY_BATCH = 32
COPY_LR = 3e-3
COPY_LENGTHS = (8, 24)
COPY_TARGET = 0.9
"""Sequences per step, AdamW learning rate, the range of the repeated half's length, and the
copy accuracy at which the warm-up stops (the steps it takes vary with the initialisation)."""


def copy_batch(pool: torch.Tensor, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` [B, 2·max_len] holding ``x x`` per row (x drawn from ``pool``), right-padded, and the attention mask."""
    low, high = COPY_LENGTHS
    lengths = torch.randint(low, high + 1, (batch_size,), generator=generator)
    halves = pool[torch.randint(len(pool), (batch_size, high), generator=generator)]
    positions = torch.arange(2 * high)
    in_row = positions < 2 * lengths[:, None]
    source = torch.where(positions < lengths[:, None], positions, positions - lengths[:, None]).clamp(max=high - 1)
    ids = torch.where(in_row, halves.gather(1, source.expand(batch_size, -1)), 0)
    return ids, in_row.long()


def copy_warmup(model, tokenizer, steps: int, seed: int = 0,
                on_step: Callable[[float, float], None] | None = None) -> list[float]:
    """Train ``model`` in place on repeated random sequences for at most ``steps`` AdamW steps,
    stopping once it copies: argmax accuracy ≥ ``COPY_TARGET`` on the repeated half of a fresh
    batch (measured before that batch's update). Returns the losses, one per step taken.
    Batches are drawn on the CPU (the same on every device) and moved to the model's device.

    ``on_step(loss, accuracy)``, when given, is called after each step (progress display)."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    pool = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=COPY_LR, betas=(0.9, 0.95), weight_decay=0.01)
    device = next(model.parameters()).device
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask = (t.to(device) for t in copy_batch(pool, COPY_BATCH, generator))
        # the rows packed (a third of the batch is padding) and only real targets through the LM head (train/forward.py)
        targets = mask[:, 1:].bool()
        logits = lm_head(model, packed_hidden(model, ids, mask.sum(1))[:, :-1][targets])
        accuracy = repeated_half_accuracy(logits, ids, mask)
        if accuracy >= COPY_TARGET:
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
