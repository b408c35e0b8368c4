"""Input checks and masked reductions shared by the losses, estimators and helpers."""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


def check_tensors(mask: torch.Tensor, **named: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Check that every named tensor has the mask's shape [batch, response_len] and is finite where
    the mask is 1; values under mask 0 are ignored everywhere.

    Returns (mask as bool, {name: tensor with every mask-0 position set to 0}); None entries are
    skipped. Raises ValueError naming the offending argument and the shapes."""
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [batch, response_len], got shape {tuple(mask.shape)}")
    bool_mask = mask if mask.dtype == torch.bool else mask != 0
    cleaned = {}
    for name, value in named.items():
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(value.shape)} but response_mask has shape {tuple(mask.shape)}")
        kept = torch.where(bool_mask, value, torch.zeros((), dtype=value.dtype, device=value.device))
        # one reduction instead of an elementwise isfinite; the exact check only runs to confirm
        if not bool(torch.isfinite(kept.detach().sum())) and not bool(torch.isfinite(kept).all()):
            raise ValueError(f"{name} contains NaN or Inf at positions where response_mask is 1")
        cleaned[name] = kept
    return bool_mask, cleaned


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` (bool) is True; values under mask 0 never leak (not even NaN)."""
    kept = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over masked entries; 0 (with zero gradient) where nothing is masked in."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_mean_std(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std over masked entries; fewer than two entries or std 0 give std 1."""
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1)
    centered = torch.where(mask, values - mean, torch.zeros((), dtype=values.dtype, device=values.device))
    std = (centered.square().sum() / (count - 1).clamp(min=1)).sqrt()
    return mean, torch.where((count > 1) & (std > 0), std, torch.ones_like(std))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x − mean) / std over masked entries (unbiased std, as verl's masked_whiten without its
    1e-8 in the variance; std 0 or a single entry → 1); 0 under mask 0."""
    mean, std = masked_mean_std(values, mask)
    return torch.where(mask, (values - mean) / std, torch.zeros((), dtype=values.dtype, device=values.device))


def group_ids(index: Sequence[Hashable] | torch.Tensor, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map per-row group labels (any hashables) to dense ids 0..G-1; return (ids [batch], G)."""
    labels = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    if len(labels) != batch:
        raise ValueError(f"index has {len(labels)} entries but the batch has {batch} rows")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def group_mean_std(values: torch.Tensor, ids: torch.Tensor, num_groups: int,
                   weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group (mean, unbiased std, count) of ``values`` [N] grouped by ``ids`` [N], optionally
    counting entry j with integer weight ``weights[j]`` (0/1 masks). Returns tensors of size [G]."""
    w = torch.ones_like(values) if weights is None else weights.to(values.dtype)
    count = torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, w)
    total = torch.zeros_like(count).index_add_(0, ids, values * w)
    mean = total / count.clamp(min=1)
    sq = torch.zeros_like(count).index_add_(0, ids, (values - mean[ids]) ** 2 * w)
    std = (sq / (count - 1).clamp(min=1)).sqrt()
    return mean, std, count
