"""Loss aggregation over a [batch, response_len] per-token loss, in verl's four modes (§2.4)."""

from __future__ import annotations

import torch

from .tensors import masked_sum

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss L[i, t] over the tokens with mask 1 to a scalar.

    - ``token-mean`` (release, §2.4): Σ_i,t m·L / Σ_i,t m.
    - ``seq-mean-token-sum``: mean over sequences of Σ_t m·L.
    - ``seq-mean-token-mean``: mean over sequences of (Σ_t m·L / Σ_t m).
    - ``seq-mean-token-sum-norm`` (Dr.GRPO, §4): mean over sequences of Σ_t m·L / T, with the
      constant T = ``loss_mat.shape[-1]`` (the padded response length, i.e. the response budget)
      in place of each sequence's own length.

    "Mean over sequences" counts only rows with at least one masked-in token. Tokens with mask 0
    contribute nothing (not even NaN/Inf); an all-zero mask gives 0 with zero gradient.
    """
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat has shape {tuple(loss_mat.shape)} but mask has shape {tuple(mask.shape)}")
    mask = mask if mask.dtype == torch.bool else mask != 0
    if mode == "token-mean":
        return masked_sum(loss_mat, mask) / mask.sum().clamp(min=1)
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode '{mode}'; valid modes: {', '.join(AGG_MODES)}")
    tokens = mask.sum(-1)
    seq = masked_sum(loss_mat, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        seq = seq / tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum-norm":
        seq = seq / loss_mat.shape[-1]
    return seq.sum() / (tokens > 0).sum().clamp(min=1)
