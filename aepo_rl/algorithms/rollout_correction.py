"""Rollout Correction (§2.11): importance weights and rejection from the rollout engine's own log-probs,
with verl 0.9.1's semantics and metric names (``verl/trainer/ppo/rollout_corr_helper.py``).

Three policies: π_rollout sampled the tokens (the engine's recorded log-probs, ``rollout_log_probs``),
π_old anchors the PPO ratio (the trainer's recomputed forward, or π_rollout itself in bypass mode)
and π_θ is trained. With δ_t = log π_old(y_t) − log π_rollout(y_t) on the trained tokens (mask 1):

- IS weights (``rollout_is``): token w_t = exp(clamp(δ_t, ±20)); sequence w_i = exp(clamp(Σ_t δ_t, ±20))
  on every token of row i. Truncated (TIS) to ``min(w, U)`` for a threshold "U", or zeroed outside
  [L, U] for "L_U" (IcePop); optionally divided by their masked batch mean. Detached. The per-token
  policy loss is multiplied by them before aggregation, as verl's losses do.
- Rejection (``rollout_rs``, comma-separated options, all must pass): k1 = −δ, k2 = δ²/2,
  k3 = e^δ − 1 − δ per token (δ clamped to ±20); ``token_kX`` rejects a token, ``seq_sum_kX`` /
  ``seq_mean_kX`` / ``seq_max_kX`` a whole row, by the statistic's sum, mean or max over its trained
  tokens. k1 options keep [log L, log U] ("L_U", or "U" meaning L = 1/U), k2/k3 keep ≤ U. A rejected
  token leaves the loss mask.
- Mismatch metrics (always, when the engine's log-probs are comparable): verl's
  ``compute_offpolicy_metrics`` (KL estimates, perplexities, χ²), logged as ``rollout_corr/<name>``.

Every function here works on [rows, R] tensors and syncs with the host once, for its metrics.
"""

from __future__ import annotations

import math

import torch

from ..config import IS_LEVELS, LOSS_TYPES, RS_OPTIONS, parse_is_threshold, parse_rs_thresholds, rs_options  # noqa: F401
from .tensors import masked_mean, masked_sum

SAFETY_BOUND = 20.0
"""|log-ratio| bound before exp, as verl's (exp(20) ≈ 4.9e8)."""


def to_floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-d tensor metrics to floats with one host sync."""
    if not metrics:
        return {}
    device = next(iter(metrics.values())).device
    return dict(zip(metrics, torch.stack([v.float().reshape(()).to(device) for v in metrics.values()]).tolist()))


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: str | float = 2.0,
               batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated (or IcePop-masked) importance weights π_old/π_rollout, [rows, R], 0 off the mask, detached,
    and verl's ``rollout_is_*`` metrics as 0-d tensors (``compute_rollout_correction_weights``)."""
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_is={level!r}; choose one of {list(IS_LEVELS)}")
    upper, lower = parse_is_threshold(threshold)
    mask_f, on = mask.to(log_ratio.dtype), mask.bool()
    log_ratio = log_ratio.detach()
    if level == "token":
        raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask_f
        seq_log = None
    else:
        seq_log = masked_sum(log_ratio, on, dim=-1)
        raw = seq_log.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()[:, None].expand_as(log_ratio) * mask_f
    kept = (raw >= lower) & (raw <= upper) if lower is not None else None
    weights = raw.clamp(max=upper) if kept is None else torch.where(kept, raw, 0.0)
    low = 1.0 / upper if lower is None else lower
    zero = torch.zeros((), device=log_ratio.device)
    m: dict[str, torch.Tensor] = {"rollout_is_mean": masked_mean(weights, on)}
    if seq_log is None:
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > upper).float(), on)
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < low).float(), on)
        m["rollout_is_max"] = weights.masked_fill(~on, -math.inf).max()
        m["rollout_is_min"] = weights.masked_fill(~on, math.inf).min()
    else:  # verl: over every row, log space
        m["rollout_is_max"] = seq_log.max().clamp(max=SAFETY_BOUND).exp()
        m["rollout_is_min"] = seq_log.min().exp()
        m["rollout_is_ratio_fraction_high"] = (seq_log > math.log(upper)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (seq_log < math.log(low)).float().mean()
    bounded = weights.clamp(0.0, upper)
    mean_bounded = masked_mean(bounded, on)
    std = (masked_mean(bounded.square(), on) - mean_bounded.square()).clamp(min=0).sqrt()
    m["rollout_is_std"] = torch.where(on.sum() > 1, std, 0.0)
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / (mean_bounded + 1e-8)).square(), on)
    seq_mean = masked_mean(weights, on, dim=-1)
    raw_seq_mean = masked_mean(raw, on, dim=-1)
    m.update({"rollout_is_seq_mean": seq_mean.mean(),
              "rollout_is_seq_std": seq_mean.std() if len(seq_mean) > 1 else zero,
              "rollout_is_seq_max": seq_mean.max(), "rollout_is_seq_min": seq_mean.min(),
              "rollout_is_seq_max_deviation": (seq_mean - 1.0).abs().max(),
              "rollout_is_seq_fraction_high": (raw_seq_mean > upper).float().mean(),
              "rollout_is_seq_fraction_low": (raw_seq_mean < low).float().mean()})
    if kept is not None:
        m["rollout_is_oob_ratio"] = masked_mean((~kept).float(), on)
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, on)
        else:
            valid = (mask_f.sum(-1) > 0).to(weights.dtype)
            mean = (seq_mean * valid).sum() / valid.sum().clamp(min=1e-8)
        big = mean > 1e-8
        weights = torch.where(big, weights / mean.clamp(min=1e-8), weights)
        m["rollout_is_batch_norm_factor"] = torch.where(big, mean, torch.ones_like(mean))
    return weights, m


def _token_stats(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    d = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -d, "k2": 0.5 * d.square(), "k3": d.exp() - 1.0 - d}


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, rs: str, threshold: str | float | None
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``mask`` with every token or row that fails an option of ``rs`` set to 0, and verl's
    ``rollout_rs_*`` metrics (``compute_rollout_rejection_mask``: each option's statistic mean/max/min/std,
    shares above/below its bounds, its per-row summary ``_seq_*``, masked token and row shares; the overall
    shares)."""
    options = rs_options(rs)
    bounds = parse_rs_thresholds(options, threshold)
    stats = _token_stats(log_ratio.detach())
    on = mask.bool()
    keep_all = torch.ones_like(on)
    zero = torch.zeros((), device=log_ratio.device)
    m: dict[str, torch.Tensor] = {}
    for option in options:
        lower, upper = bounds[option]
        kind = option[-2:]
        if kind == "k1":
            lower, upper = math.log(lower), math.log(upper)
        token = stats[kind]
        if option.startswith("token"):
            values, per_row = token, None
        else:
            reduce = option.split("_")[1]
            if reduce == "sum":
                per_row = masked_sum(token, on, dim=-1)
            elif reduce == "mean":
                per_row = masked_mean(token, on, dim=-1)
            else:
                per_row = token.masked_fill(~on, -math.inf).max(-1).values
                per_row = torch.where(per_row == -math.inf, 0.0, per_row)
            values = per_row[:, None].expand_as(token)
        keep = values <= upper
        if lower is not None:
            keep = keep & (values >= lower)
        keep_all = keep_all & keep
        prefix = f"rollout_rs_{option}"
        low = lower if lower is not None else 0.0
        m[f"{prefix}_mean"] = masked_mean(values, on)
        if per_row is None:
            m[f"{prefix}_max"] = values.masked_fill(~on, -math.inf).max()
            m[f"{prefix}_min"] = values.masked_fill(~on, math.inf).min()
            m[f"{prefix}_fraction_high"] = masked_mean((values > upper).float(), on)
            m[f"{prefix}_fraction_low"] = masked_mean((values < low).float(), on) if lower is not None else zero
        else:  # over the rows with a trained token
            valid = on.any(-1)
            m[f"{prefix}_max"] = torch.where(valid.any(), per_row.masked_fill(~valid, -math.inf).max(), 0.0)
            m[f"{prefix}_min"] = torch.where(valid.any(), per_row.masked_fill(~valid, math.inf).min(), 0.0)
            m[f"{prefix}_fraction_high"] = masked_mean((per_row > upper).float(), valid)
            m[f"{prefix}_fraction_low"] = masked_mean((per_row < low).float(), valid) if lower is not None else zero
        clamped = values.clamp(min=low, max=upper)
        std = (masked_mean(clamped.square(), on) - masked_mean(clamped, on).square()).clamp(min=0).sqrt()
        m[f"{prefix}_std"] = torch.where(on.sum() > 1, std, 0.0)
        rows_on = on.any(-1)
        row_values = masked_mean(values, on, dim=-1) if per_row is None else per_row
        n_rows = rows_on.sum()
        row_mean = masked_mean(row_values, rows_on)
        row_var = masked_sum((row_values - row_mean).square(), rows_on) / (n_rows - 1).clamp(min=1)
        m[f"{prefix}_seq_mean"] = row_mean
        m[f"{prefix}_seq_std"] = torch.where(n_rows > 1, row_var.sqrt(), 0.0)
        m[f"{prefix}_seq_max"] = torch.where(n_rows > 0, row_values.masked_fill(~rows_on, -math.inf).max(), 0.0)
        m[f"{prefix}_seq_min"] = torch.where(n_rows > 0, row_values.masked_fill(~rows_on, math.inf).min(), 0.0)
        m[f"{prefix}_seq_max_deviation"] = torch.where(n_rows > 0, row_values.abs().masked_fill(~rows_on, 0).max(), 0.0)
        m[f"{prefix}_seq_fraction_high"] = masked_mean((row_values > upper).float(), rows_on)
        if lower is not None:
            m[f"{prefix}_seq_fraction_low"] = masked_mean((row_values < lower).float(), rows_on)
        m[f"{prefix}_masked_fraction"] = masked_mean((~keep).float(), on)
        m[f"{prefix}_seq_masked_fraction"] = (((~keep & on).any(-1) & on.any(-1)).float().sum()
                                              / on.any(-1).float().sum().clamp(min=1))
    m["rollout_rs_masked_fraction"] = masked_mean((~keep_all).float(), on)
    m["rollout_rs_seq_masked_fraction"] = (~keep_all & on).any(-1).float().mean()
    return mask * keep_all.to(mask.dtype), m


def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor
                     ) -> dict[str, torch.Tensor]:
    """verl's ``compute_offpolicy_metrics``: π_old (training) against π_rollout on the trained tokens.

    kl = mean(log π_rollout − log π_old) (k1 of KL(π_rollout‖π_old)); k3_kl = mean(e^δ − δ − 1);
    training/rollout_ppl = batch mean of each row's exp(−mean log π); *_log_ppl its log; log_ppl_diff =
    mean log π_rollout − mean log π_old per row (mean, |·| mean, max, min over rows); ppl_ratio = mean
    of exp(log_ppl_diff); chi2_token = mean(ρ²) − 1; chi2_seq = mean over rows of (Πρ)² − 1, ρ = e^δ
    (δ clamped to ±20 for both χ²)."""
    on = mask.bool()
    old, rollout = old_log_prob.detach(), rollout_log_prob.detach()
    log_ratio = old - rollout
    old_row, rollout_row = masked_mean(old, on, dim=-1), masked_mean(rollout, on, dim=-1)
    diff = rollout_row - old_row
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq = masked_sum(log_ratio, on, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"training_ppl": (-old_row).exp().mean(), "training_log_ppl": (-old_row).mean(),
            "kl": masked_mean(-log_ratio, on), "k3_kl": masked_mean(log_ratio.exp() - log_ratio - 1, on),
            "rollout_ppl": (-rollout_row).exp().mean(), "rollout_log_ppl": (-rollout_row).mean(),
            "log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(),
            "log_ppl_diff_max": diff.max(), "log_ppl_diff_min": diff.min(), "ppl_ratio": diff.exp().mean(),
            "chi2_token": masked_mean(safe.exp().square(), on) - 1.0,
            "chi2_seq": (2.0 * seq).exp().mean() - 1.0}


def rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor, config
                       ) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (None when ``config.rollout_is`` is off), the mask after rejection, and every metric
    as ``rollout_corr/<verl name>`` (verl's ``compute_rollout_correction_and_rejection_mask``).
    ``config``: a ``RolloutCorrectionConfig`` (``algorithm.rollout_correction``)."""
    log_ratio = old_log_prob.detach() - rollout_log_prob.detach()
    weights, metrics, trained = None, {}, mask
    if config.rollout_is is not None:
        weights, metrics = is_weights(log_ratio, mask, config.rollout_is, config.rollout_is_threshold,
                                      config.rollout_is_batch_normalize)
    if config.rollout_rs is not None:
        mask, rs_metrics = rejection_mask(log_ratio, mask, config.rollout_rs, config.rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(mismatch_metrics(old_log_prob, rollout_log_prob, trained))  # before rejection, as verl
    return weights, mask, {f"rollout_corr/{k}": v for k, v in to_floats(metrics).items()}
