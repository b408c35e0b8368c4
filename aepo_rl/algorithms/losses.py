"""Policy losses (§2.3, §4) with verl's signature, sharing one clipped-surrogate core.

Every loss is ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
config=None, entropy=None, *, entropy_stats=None, index=None) -> (loss, metrics)`` over
[batch, response_len] tensors; ``config`` is ``AlgorithmConfig`` (= ``PolicyLossConfig``).
Tokens with mask 0 are ignored everywhere: they change neither the loss nor any gradient.
The built-ins declare ``token_flags``: given ``token_flags={}``, they also put there their per-token
bool indicators under their metric names, from which the trainer computes the same shares over the
high-entropy tokens of a whole mini-batch (:func:`high_entropy_shares`, §7.1).
"""

from __future__ import annotations

import torch

from ..config import AlgorithmConfig
from ..registry import POLICY_LOSSES, register_policy_loss
from . import entropy_adv
from .aggregation import agg_loss
from .tensors import check_tensors, masked_mean

# log(π/π_old) is clamped to ±20 before exp, as verl does, so r never overflows.
LOG_RATIO_CLAMP = 20.0
HIGH_ENTROPY_QUANTILE = 0.8
"""Tokens at or above this quantile of a mini-batch's token entropies are "high-entropy" in the
``*_high_entropy`` metrics (§7.1)."""


def get_policy_loss(name: str):
    """The registered policy loss ``name`` (ValueError listing the valid names otherwise)."""
    return POLICY_LOSSES.lookup(name)


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
                      dual_clip: float | None = None, preserve_low: bool = False,
                      preserve_high: bool | torch.Tensor = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss max(−A·r, −A·clip(r, 1−ε_l, 1+ε_h)), then min(·, −A·c) where A < 0 (§2.3).

    A bound marked "preserve" keeps its value but passes gradient: clip(r) is replaced by
    r·sg(clip(r)/r), i.e. (1+ε_h)·r/sg(r) at the upper bound (AEPO §2.3; GPPO §4 for both bounds),
    whose gradient w.r.t. log π is (1+ε_h) instead of 0. ``preserve_high`` may be a bool tensor
    selecting the tokens that get it (AEPO's high-entropy option). Forward values equal PPO's.

    Returns (loss, upper, lower, dual): ``upper`` = A > 0 and r > 1+ε_h (the upper bound is
    active), ``lower`` = A < 0 and r < 1−ε_l (the lower bound is active), ``dual`` = A < 0 and
    max(−A·r, −A·clip(r)) > −A·c (the dual clip is active; all False without a dual clip).
    """
    low, high = 1.0 - eps_low, 1.0 + eps_high
    # Which branch max/min picks is decided without autograd; the loss is then −A·r·K + C with a
    # detached per-token slope K and constant C, so the graph holds two ops whatever the branch:
    # unclipped K = 1, C = 0; hard clip K = 0, C = −A·clip(r); preserved clip K = clip(r)/r, C = 0
    # (value −A·clip(r), gradient −A·clip(r)·∇log π); dual clip K = 0, C = −A·c.
    with torch.no_grad():
        r, a = ratio.detach(), adv.detach()
        above, below = r > high, r < low
        clipped = r.clamp(low, high)
        take_clip = -a * clipped > -a * r
        preserve = torch.zeros_like(above)
        if preserve_high is not False:
            preserve = above if preserve_high is True else above & preserve_high
        if preserve_low:
            preserve = preserve | below
        slope = torch.where(take_clip, torch.where(preserve, clipped / r, 0.0), 1.0)
        const = torch.where(take_clip & ~preserve, -a * clipped, 0.0)
        negative = a < 0
        dual = torch.zeros_like(above)
        if dual_clip is not None:
            dual = negative & (-a * dual_clip < -a * torch.where(take_clip, clipped, r))
            slope = torch.where(dual, 0.0, slope)
            const = torch.where(dual, -a * dual_clip, const)
    loss = torch.addcmul(const, ratio * slope, -adv)
    return loss, above & (a > 0), below & negative, dual


def _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy):
    """Validate; return (config, bool mask, log π, log r, A, H) with every mask-0 position zeroed
    (H is None when no entropy is given)."""
    cfg = config if config is not None else AlgorithmConfig()
    mask, t = check_tensors(response_mask, old_log_prob=old_log_prob.detach(), log_prob=log_prob,
                            advantages=advantages.detach(), entropy=None if entropy is None else entropy.detach())
    log_ratio = (t["log_prob"] - t["old_log_prob"]).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return cfg, mask, t["log_prob"], log_ratio, t["advantages"], t.get("entropy")


def _finish(loss_mat, mask, loss_agg_mode, cfg, log_ratio, upper, lower, dual, extra=None, aggregate=None,
            token_flags=None):
    """Aggregate (T of seq-mean-token-sum-norm = ``cfg.loss_scale_factor``) and compute the metrics
    (one host sync for all of them), §7.

    verl's names mean what verl's ``compute_policy_loss_vanilla`` means: ``actor/pg_clipfrac`` =
    share of masked tokens where the clipped branch is taken (either bound: ``upper | lower``),
    ``actor/pg_clipfrac_lower`` = share where the dual clip is active (``dual``). Our split by
    bound: ``actor/pg_clipfrac_upper_bound`` (A > 0, r > 1+ε_h) and
    ``actor/pg_clipfrac_lower_bound`` (A < 0, r < 1−ε_l). ``upper``, ``lower``, ``dual``,
    ``log_ratio`` and ``extra`` values are already 0 at mask-0 positions, so their masked means
    are plain sums over the token count. ``token_flags`` (a dict) receives the per-token bool
    indicators behind the share metrics, under the same names."""
    loss = (agg_loss(loss_mat, mask, loss_agg_mode, cfg.loss_scale_factor) if aggregate is None
            else aggregate(loss_mat, mask))
    with torch.no_grad():
        count = mask.sum().clamp(min=1)
        values = {
            "actor/pg_loss": loss.detach(),
            "actor/pg_clipfrac": (upper | lower).sum() / count,
            "actor/pg_clipfrac_lower": dual.sum() / count,
            "actor/pg_clipfrac_upper_bound": upper.sum() / count,
            "actor/pg_clipfrac_lower_bound": lower.sum() / count,
            "actor/ppo_kl": -log_ratio.detach().sum() / count,
            **{name: value.sum() / count for name, value in (extra or {}).items()},
        }
        if token_flags is not None:
            token_flags.update({"actor/pg_clipfrac": upper | lower, "actor/pg_clipfrac_lower": dual,
                                "actor/pg_clipfrac_upper_bound": upper, "actor/pg_clipfrac_lower_bound": lower,
                                **{name: value for name, value in (extra or {}).items() if value.dtype == torch.bool}})
        floats = torch.stack([v.float() for v in values.values()]).tolist()
    return loss, dict(zip(values, floats))


def _clip_loss(ratio, adv, mask, cfg, loss_agg_mode, log_ratio, *, dual_clip, preserve_both=False, aggregate=None,
               token_flags=None):
    """The clipped surrogate of ``ppo``/``gppo``/``gspo`` (hard bounds, or both gradient-preserving),
    aggregated, with its metrics."""
    loss_mat, upper, lower, dual = clipped_surrogate(ratio, adv, cfg.clip_ratio_low, cfg.clip_ratio_high, dual_clip,
                                                     preserve_low=preserve_both, preserve_high=preserve_both)
    return _finish(loss_mat, mask, loss_agg_mode, cfg, log_ratio, upper, lower, dual, aggregate=aggregate,
                   token_flags=token_flags)


@register_policy_loss("ppo", "grpo", "dapo", token_flags=True)
def ppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                    config=None, entropy=None, *, entropy_stats=None, index=None, aggregate=None, token_flags=None):
    """PPO/GRPO clipped surrogate with dual clip c (§2.3, §4). DAPO's clip-higher (§4) is this
    loss with ε_h > ε_l (``clip_ratio_high`` = 0.28 in the ``dapo`` preset)."""
    cfg, mask, _, log_ratio, adv, _ = _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy)
    return _clip_loss(log_ratio.exp(), adv, mask, cfg, loss_agg_mode, log_ratio, dual_clip=cfg.clip_ratio_c,
                      aggregate=aggregate, token_flags=token_flags)


@register_policy_loss("gppo", token_flags=True)
def gppo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                     config=None, entropy=None, *, entropy_stats=None, index=None, aggregate=None, token_flags=None):
    """GPPO (§4): both clip bounds gradient-preserving, (1∓ε)·r/sg(r); dual clip kept."""
    cfg, mask, _, log_ratio, adv, _ = _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy)
    return _clip_loss(log_ratio.exp(), adv, mask, cfg, loss_agg_mode, log_ratio, dual_clip=cfg.clip_ratio_c,
                      preserve_both=True, aggregate=aggregate, token_flags=token_flags)


def _high_entropy_tokens(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Tokens whose entropy is at or above the ``quantile`` of this micro-batch's masked tokens (§2.3 paper)."""
    values = entropy.detach()[mask]
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values.float(), quantile).to(entropy.dtype)
    return entropy.detach() >= threshold


def high_entropy_shares(entropy: torch.Tensor, mask: torch.Tensor, token_flags: dict[str, torch.Tensor],
                        quantile: float = HIGH_ENTROPY_QUANTILE) -> dict[str, float]:
    """Each flag's share among the high-entropy tokens, as ``<name>_high_entropy`` (§7.1): the masked
    tokens whose entropy is at or above the ``quantile`` of the masked tokens' entropies. All of
    [rows, R], typically a whole mini-batch; one host sync."""
    mask = mask.bool()
    high = _high_entropy_tokens(entropy, mask, quantile) & mask
    count = high.sum().clamp(min=1)
    values = {f"{name}_high_entropy": (flag & high).sum() / count for name, flag in token_flags.items()}
    return dict(zip(values, torch.stack([v.float() for v in values.values()]).tolist())) if values else {}


@register_policy_loss("aepo", needs=("entropy", "entropy_stats"), token_flags=True)
def aepo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                     config=None, entropy=None, *, entropy_stats=None, index=None, aggregate=None, token_flags=None):
    """AEPO entropy-balanced policy optimization (§2.2 + §2.3).

    Ã = A·(1 + a·z), z = (H − mean H)/std H from the detached ``entropy`` (a = entropy_adv_coef,
    clamped at 0 if entropy_adv_clamp). mean/std: ``entropy_stats`` if given (the trainer's
    mini-batch or group statistics), else per group of ``index`` when entropy_adv_scope is
    "group", else this micro-batch's masked tokens. Then the clipped surrogate with the
    stop-gradient upper bound (1+ε_h)·r/sg(r), hard lower bound and dual clip; with
    grad_preserve_entropy_quantile = q only tokens with H ≥ the q-quantile keep the upper-bound
    gradient (the others are hard-clipped as in PPO); with sg_upper_clip false none does (ablation).
    """
    cfg, mask, _, log_ratio, adv, entropy = _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy)
    quantile = cfg.grad_preserve_entropy_quantile
    if entropy is None and (cfg.entropy_adv_coef > 0 or quantile is not None):
        raise ValueError("aepo: entropy_adv_coef > 0 or grad_preserve_entropy_quantile needs the token "
                         "entropies: pass entropy=[batch, response_len] (or set entropy_adv_coef=0)")
    scale = torch.ones_like(adv)
    if cfg.entropy_adv_coef > 0:
        stats = entropy_stats
        if stats is None and cfg.entropy_adv_scope == "group" and index is not None:
            stats = entropy_adv.entropy_stats(entropy, mask, "group", index)
        scale = entropy_adv.entropy_adv_scale(entropy, mask, cfg.entropy_adv_coef, cfg.entropy_adv_clamp, stats)
        adv = adv * scale
    if not cfg.sg_upper_clip:
        preserve_high = False
    else:
        preserve_high = True if quantile is None else _high_entropy_tokens(entropy, mask, quantile)
    loss_mat, upper, lower, dual = clipped_surrogate(log_ratio.exp(), adv, cfg.clip_ratio_low, cfg.clip_ratio_high,
                                                     cfg.clip_ratio_c, preserve_high=preserve_high)
    extra = {"actor/grad_preserved_frac": upper if preserve_high is True else upper & preserve_high,
             "actor/entropy_adv_scale/mean": torch.where(mask, scale, 0.0)}
    return _finish(loss_mat, mask, loss_agg_mode, cfg, log_ratio, upper, lower, dual, extra, aggregate=aggregate,
                   token_flags=token_flags)


@register_policy_loss("cispo", token_flags=True)
def cispo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                      config=None, entropy=None, *, entropy_stats=None, index=None, aggregate=None, token_flags=None):
    """CISPO (§4) as verl's ``compute_policy_loss_cispo``: −sg(clip(r, 1−ε_l, 1+ε_h))·A·log π —
    no token is dropped, the IS weight is clipped to [1−ε_l, 1+ε_h] whatever the sign of A.
    The CISPO paper's weight has no lower bound: ``clip_ratio_low=1`` gives it (the ``cispo``
    preset). pg_clipfrac = share of masked tokens whose weight is clipped (either bound);
    pg_clipfrac_lower = 0 (no dual clip), as in verl."""
    cfg, mask, logp, log_ratio, adv, _ = _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy)
    ratio = log_ratio.detach().exp()
    weight = ratio.clamp(1.0 - cfg.clip_ratio_low, 1.0 + cfg.clip_ratio_high)
    upper, lower = ratio > 1.0 + cfg.clip_ratio_high, ratio < 1.0 - cfg.clip_ratio_low
    return _finish(-weight * adv * logp, mask, loss_agg_mode, cfg, log_ratio, upper, lower, torch.zeros_like(upper),
                   aggregate=aggregate, token_flags=token_flags)


@register_policy_loss("gspo", token_flags=True)
def gspo_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                     config=None, entropy=None, *, entropy_stats=None, index=None, aggregate=None, token_flags=None):
    """GSPO (§4): sequence ratio s_i = exp(mean_t log r_i,t) over masked tokens, used per token as
    s_i,t = sg(s_i)·π_θ(y_t)/sg(π_θ(y_t)) (GSPO-token: value s_i, gradient s_i·∇log π_t), in the
    clipped surrogate with ε_l, ε_h (tiny, e.g. 3e-4/4e-4) and no dual clip."""
    cfg, mask, logp, log_ratio, adv, _ = _prepare(old_log_prob, log_prob, advantages, response_mask, config, entropy)
    seq_log_ratio = masked_mean(log_ratio, mask, dim=-1).detach()[:, None]
    ratio = torch.exp(seq_log_ratio + logp - logp.detach())
    return _clip_loss(ratio, adv, mask, cfg, loss_agg_mode, log_ratio, dual_clip=None, aggregate=aggregate,
                      token_flags=token_flags)
