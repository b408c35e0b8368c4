"""AEPO's entropy-aware advantage (§2.2): Ã_t = A · (1 + a · z_t), z_t = (H_t − mean H) / std H."""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from .tensors import check_tensors, group_ids, group_mean_std, masked_mean_std

ENTROPY_SCOPES = ("micro-batch", "mini-batch", "group")
EntropyStats = tuple[torch.Tensor, torch.Tensor]


def entropy_stats(entropy: torch.Tensor, mask: torch.Tensor, scope: str,
                  index: Sequence[Hashable] | torch.Tensor | None = None) -> EntropyStats | None:
    """Mean and std of the token entropy H over tokens with mask 1, for the z of §2.2.

    The trainer calls this once per mini-batch and passes the result to the ``aepo`` loss as
    ``entropy_stats`` (so z does not depend on micro-batch packing):
    - ``mini-batch``: one (mean, std) over all masked tokens, as 0-dim tensors;
    - ``group``: per group id in ``index`` (one label per row), over the masked tokens of the
      group's rows, returned per row as [batch, 1] tensors;
    - ``micro-batch`` (release): None; the loss then uses its own micro-batch.
    Std is the unbiased std; a std of 0 or fewer than two tokens gives std 1 (release).
    """
    if scope not in ENTROPY_SCOPES:
        raise ValueError(f"unknown entropy_adv_scope '{scope}'; valid scopes: {', '.join(ENTROPY_SCOPES)}")
    bool_mask, cleaned = check_tensors(mask, entropy=entropy.detach())
    entropy = cleaned["entropy"]
    if scope == "micro-batch":
        return None
    if scope == "mini-batch":
        return masked_mean_std(entropy, bool_mask)
    if index is None:
        raise ValueError("entropy_stats(scope='group') needs index (the group id of every row)")
    ids, num_groups = group_ids(index, entropy.shape[0], entropy.device)
    row_ids = ids[:, None].expand_as(entropy)
    mean, std, count = group_mean_std(entropy.reshape(-1), row_ids.reshape(-1), num_groups,
                                      weights=bool_mask.reshape(-1))
    std = torch.where((count > 1) & (std > 0), std, torch.ones_like(std))
    return mean[ids][:, None], std[ids][:, None]


def entropy_adv_scale(entropy: torch.Tensor, mask: torch.Tensor, coef: float, clamp: bool,
                      stats: EntropyStats | None = None) -> torch.Tensor:
    """The factor 1 + a·z_t of §2.2 (a = ``coef``), from the detached entropy; clamped at 0 when
    ``clamp``. ``stats`` = (mean, std) broadcastable to [B, T]; None = this micro-batch's masked
    tokens (release behaviour)."""
    entropy = entropy.detach()
    mean, std = stats if stats is not None else masked_mean_std(entropy, mask)
    slope = coef / std
    scale = torch.addcmul(1 - mean * slope, entropy, slope)  # 1 + a·(H − mean)/std in one pass
    return scale.clamp(min=0) if clamp else scale
