"""Loss aggregation over a [batch, response_len] per-token loss, in verl's four modes (§2.5), and
the weight of a micro-batch's loss in its mini-batch's gradient."""

from __future__ import annotations

import torch

from .tensors import masked_sum

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
AGG_SCOPES = ("mini-batch", "micro-batch")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
             loss_scale_factor: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss L[i, t] over the tokens with mask 1 to a scalar.

    - ``token-mean`` (release, §2.5): Σ_i,t m·L / Σ_i,t m.
    - ``seq-mean-token-sum``: mean over sequences of Σ_t m·L.
    - ``seq-mean-token-mean``: mean over sequences of (Σ_t m·L / Σ_t m).
    - ``seq-mean-token-sum-norm`` (Dr.GRPO, §4): mean over sequences of Σ_t m·L / T with a
      constant T = ``loss_scale_factor`` in place of each sequence's own length. The trainer
      passes the response budget ``rollout.max_response_length`` (the release pads every
      response to it); None falls back to ``loss_mat.shape[-1]``, as verl does.

    These are verl 0.9's ``agg_loss`` over one batch (``global_batch_size`` = the sequences with
    a token); see :func:`micro_batch_weight` for a mini-batch split into micro-batches.
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
        seq = seq / (loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor)
    return seq.sum() / (tokens > 0).sum().clamp(min=1)


def agg_units(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """What :func:`agg_loss` averages over: masked-in tokens (token-mean) or sequences with at least
    one masked-in token (the seq-mean modes)."""
    if mode == "token-mean":
        return (mask != 0).sum()
    return ((mask != 0).sum(-1) > 0).sum()


def micro_batch_weight(micro_mask: torch.Tensor, mini_mask: torch.Tensor, mode: str,
                       scope: str = "mini-batch") -> float:
    """Weight w_k of micro-batch k's ``agg_loss`` in its mini-batch's loss Σ_k w_k·agg_k (§2.5).

    - ``mini-batch`` (verl ≥ 0.6, default): w_k = the micro-batch's share of the mini-batch's
      :func:`agg_units`, so the accumulated loss is ``agg_loss`` of the whole mini-batch (verl
      normalises every micro-batch by the global mini-batch's token or sequence count).
    - ``micro-batch`` (the release, verl 0.3.1 with ``use_dynamic_bsz``): every micro-batch is
      aggregated on its own and weighted by its share of the mini-batch's sequences, B_k / B;
      under ``seq-mean-token-sum-norm`` verl 0.3.1 sums over sequences (Σ_i,t m·L / T, no mean),
      so w_k is also multiplied by the micro-batch's sequence count.
    """
    if scope == "mini-batch":
        return float(agg_units(micro_mask, mode) / agg_units(mini_mask, mode).clamp(min=1))
    if scope != "micro-batch":
        raise ValueError(f"unknown loss_agg_scope '{scope}'; valid scopes: {', '.join(AGG_SCOPES)}")
    weight = micro_mask.shape[0] / max(1, mini_mask.shape[0])
    if mode == "seq-mean-token-sum-norm":
        weight *= float(agg_units(micro_mask, mode))
    return weight
