"""KL to a reference policy, token entropy and the entropy bonus (§2.4: all off in the release)."""

from __future__ import annotations

import torch

from .aggregation import agg_loss

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled-token log-probs (Schulman's k1/k2/k3).

    - k1: log π − log π_ref
    - k2: ½ (log π − log π_ref)²
    - k3 = low_var_kl: ρ − log ρ − 1 with ρ = π_ref / π, clamped to [−10, 10] as verl does.

    As a loss term: ``kl_loss_coef · agg_loss(kl_penalty(...), mask, mode)``. In the reward
    (REINFORCE++, §4): pass it as ``kl=`` to the estimator (``r_t − kl_coef · kl_t``).
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp has shape {tuple(logp.shape)} but ref_logp has shape {tuple(ref_logp.shape)}")
    diff = logp - ref_logp
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        return (torch.exp(-diff) + diff - 1).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL kind '{kind}'; valid kinds: {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy H = logsumexp(z) − Σ_v softmax(z)_v · z_v over the last dim (nats), for any leading
    shape. Stable for large logits; masked vocabulary entries should be a large negative finite
    number rather than −inf. ``chunk_size`` rows at a time bounds the softmax's extra memory."""
    if chunk_size is None or logits.dim() < 2:
        probs = torch.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(chunk) for chunk in flat.split(chunk_size)]
    return torch.cat(parts).reshape(logits.shape[:-1])


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float,
                  loss_agg_mode: str = "token-mean", loss_scale_factor: int | None = None) -> torch.Tensor:
    """Loss term −coef · agg(H): add it to the policy loss to reward entropy (``entropy_coeff``)."""
    return -coef * agg_loss(entropy, mask, loss_agg_mode, loss_scale_factor)
