"""DAPO's data-side helpers (§4): dynamic sampling and overlong reward shaping."""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from .tensors import group_ids


def filter_groups(rewards: torch.Tensor,
                  index: Sequence[Hashable] | torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Dynamic sampling (§4): keep the rows of groups whose rewards differ (those give GRPO a
    non-zero advantage); drop groups whose rewards are all equal. A group of one is kept (as
    verl does; its GRPO advantage is R itself). ``rewards``: [batch] outcome rewards, or
    [batch, response_len] token rewards (summed). Returns (keep [batch] bool, metrics) with
    ``dynamic_sampling/dropped_group_frac`` and ``dynamic_sampling/kept_rows``."""
    scores = rewards.sum(-1) if rewards.dim() == 2 else rewards
    if scores.dim() != 1:
        raise ValueError(f"rewards must be [batch] or [batch, response_len], got shape {tuple(rewards.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("rewards contains NaN or Inf")
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    low = torch.full((num_groups,), float("inf"), dtype=scores.dtype,
                     device=scores.device).scatter_reduce(0, ids, scores, "amin")
    high = torch.full_like(low, float("-inf")).scatter_reduce(0, ids, scores, "amax")
    size = torch.zeros_like(low).index_add_(0, ids, torch.ones_like(scores))
    kept_group = (high > low) | (size == 1)
    keep = kept_group[ids]
    metrics = {"dynamic_sampling/dropped_group_frac": float((~kept_group).float().mean()) if num_groups else 0.0,
               "dynamic_sampling/kept_rows": float(keep.sum())}
    return keep, metrics


def overlong_penalty(response_lengths: torch.Tensor | Sequence[int], max_len: int, buffer_len: int,
                     penalty_factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (§4), added to the reward of each response of length L:

        0                                        if L ≤ max_len − buffer_len
        −penalty_factor · (L − (max_len − buffer_len)) / buffer_len   inside the buffer
        −penalty_factor                          if L ≥ max_len

    ``buffer_len`` = 0 turns it off (all zeros)."""
    lengths = torch.as_tensor(response_lengths, dtype=torch.float32)
    if buffer_len < 0 or buffer_len > max_len:
        raise ValueError(f"buffer_len={buffer_len} must be in [0, max_len={max_len}]")
    if buffer_len == 0:
        return torch.zeros_like(lengths)
    excess = (lengths - (max_len - buffer_len)).clamp(0, buffer_len)
    return -penalty_factor * excess / buffer_len
