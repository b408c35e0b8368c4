"""Advantage estimators (§2.1, §4) with verl's signature.

``fn(token_level_rewards, response_mask, index, config=None, **kw) -> (advantages, returns)``:
[batch, response_len] rewards (the outcome reward R_i = Σ_t r_i,t over all positions, so a
reward placed on any token counts), ``index`` = group id per row (any hashables; rows with the
same id are the n trajectories of one prompt). Tokens with mask 0 get advantage 0.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from ..config import AlgorithmConfig
from ..registry import ADVANTAGE_ESTIMATORS, register_advantage_estimator
from .tensors import check_tensors, group_ids, group_mean_std, masked_whiten

# ε in (R − mean) / (std + ε) (§2.1, as verl).
GROUP_STD_EPS = 1e-6

Index = Sequence[Hashable] | torch.Tensor


def get_advantage_estimator(name: str):
    """The registered advantage estimator ``name`` (ValueError listing the valid names otherwise)."""
    return ADVANTAGE_ESTIMATORS.lookup(name)


def _outcome(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate; return (R [batch] = Σ_t r_t, bool mask)."""
    mask, _ = check_tensors(response_mask, token_level_rewards=token_level_rewards)
    if not bool(torch.isfinite(token_level_rewards).all()):
        raise ValueError("token_level_rewards contains NaN or Inf")
    return token_level_rewards.sum(-1), mask


def _per_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-row value to the row's tokens with mask 1 (0 elsewhere)."""
    return torch.where(mask, values[:, None], torch.zeros((), dtype=values.dtype, device=values.device))


def group_baseline(scores: torch.Tensor, ids: torch.Tensor,
                   num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group mean, group unbiased std, group size); a group of one has mean 0, std 1 (§2.1)."""
    mean, std, count = group_mean_std(scores, ids, num_groups)
    single = count[ids] == 1
    return (torch.where(single, 0.0, mean[ids]), torch.where(single, 1.0, std[ids]), count[ids])


def group_normalized(scores: torch.Tensor, index: Index, norm_by_std: bool) -> torch.Tensor:
    """GRPO outcome advantage (§2.1): (R_i − mean_g R) / (std_g R + 1e-6), or R_i − mean_g R."""
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    mean, std, _ = group_baseline(scores, ids, num_groups)
    centered = scores - mean
    return centered / (std + GROUP_STD_EPS) if norm_by_std else centered


@register_advantage_estimator("grpo")
def grpo_advantage(token_level_rewards, response_mask, index, config=None, **kw):
    """GRPO (§2.1): A_i = (R_i − mean_g R)/(std_g R + 1e-6), unbiased std, broadcast to every
    response token; without the std when ``config.norm_adv_by_std`` is False. Returns (A, A)."""
    cfg = config if config is not None else AlgorithmConfig()
    scores, mask = _outcome(token_level_rewards, response_mask)
    adv = _per_token(group_normalized(scores, index, cfg.norm_adv_by_std), mask)
    return adv, adv


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantage(token_level_rewards, response_mask, index, config=None, **kw):
    """Dr.GRPO (§4): A_i = R_i − mean_g R (no std normalization). Returns (A, A)."""
    scores, mask = _outcome(token_level_rewards, response_mask)
    adv = _per_token(group_normalized(scores, index, norm_by_std=False), mask)
    return adv, adv


@register_advantage_estimator("rloo")
def rloo_advantage(token_level_rewards, response_mask, index, config=None, **kw):
    """RLOO (§4): A_i = R_i − mean_{j≠i} R_j = n/(n−1)·(R_i − mean_g R); a group of one gives R_i."""
    scores, mask = _outcome(token_level_rewards, response_mask)
    ids, num_groups = group_ids(index, scores.shape[0], scores.device)
    mean, _, count = group_baseline(scores, ids, num_groups)
    factor = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.ones_like(count))
    adv = _per_token((scores - mean) * factor, mask)
    return adv, adv


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = Σ_{s≥t} γ^{s−t} r_s along the response (one batched op per position)."""
    returns = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


@register_advantage_estimator("reinforce_plus_plus", needs=("kl",))
def reinforce_plus_plus_advantage(token_level_rewards, response_mask, index=None, config=None, *,
                                  kl: torch.Tensor | None = None, **kw):
    """REINFORCE++ (§4): token rewards r_t − β·KL_t (β = ``kl_coef``, only when
    ``use_kl_in_reward``; ``kl`` = per-token KL from ``kl_penalty``), returns G_t with γ =
    ``gamma``, advantages = G whitened over all masked tokens of the batch. Returns (A, G).

    Unlike verl, the running return is not reset at mask-0 tokens, so a tool result in the middle
    of a trajectory does not cut the credit of the tokens before it."""
    cfg = config if config is not None else AlgorithmConfig()
    _, mask = _outcome(token_level_rewards, response_mask)
    rewards = token_level_rewards
    if cfg.use_kl_in_reward:
        if kl is None:
            raise ValueError("reinforce_plus_plus: use_kl_in_reward is on but no kl= tensor was passed")
        rewards = rewards - cfg.kl_coef * check_tensors(response_mask, kl=kl)[1]["kl"]
    returns = discounted_returns(rewards, cfg.gamma)
    return masked_whiten(returns, mask), torch.where(mask, returns, 0.0)


@register_advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(token_level_rewards, response_mask, index, config=None, **kw):
    """REINFORCE++ with baseline (§4): R_i − mean_g R (group of one: mean 0), broadcast to the
    masked tokens, then whitened over all masked tokens of the batch. Returns (A, A)."""
    scores, mask = _outcome(token_level_rewards, response_mask)
    adv = masked_whiten(_per_token(group_normalized(scores, index, norm_by_std=False), mask), mask)
    return adv, adv


@register_advantage_estimator("gigpo", needs=("anchor_keys",))
def gigpo_advantage(token_level_rewards, response_mask, index, config=None, *,
                    anchor_keys: torch.Tensor | None = None, **kw):
    """GiGPO (§4): A = A_episode + ω·A_step, ω = ``gigpo_step_weight``.

    A_episode is GRPO's (respecting ``norm_adv_by_std``). ``anchor_keys`` [batch, response_len]
    (long; −1 = no anchor) assigns each token the state it acts from: a key identifies one
    identical token prefix ending at a tool result (:func:`aepo_rl.train.rl.anchor_keys`). The step group of
    key k is the set of trajectories having a token with key k; a token's step advantage is its
    trajectory's R normalized within that group ((R_i − mean)/(std + 1e-6)). Tokens without an
    anchor, and anchors reached by a single trajectory (nothing to compare), get A_step = 0.
    Returns (A, A)."""
    cfg = config if config is not None else AlgorithmConfig()
    scores, mask = _outcome(token_level_rewards, response_mask)
    if anchor_keys is None:
        raise ValueError("gigpo needs anchor_keys=[batch, response_len] (long tensor, -1 = no anchor)")
    if anchor_keys.shape != mask.shape:
        raise ValueError(f"anchor_keys has shape {tuple(anchor_keys.shape)} but "
                         f"response_mask has shape {tuple(mask.shape)}")
    episode = group_normalized(scores, index, cfg.norm_adv_by_std)
    rows, cols = ((anchor_keys >= 0) & mask).nonzero(as_tuple=True)
    step = torch.zeros_like(token_level_rewards)
    if rows.numel() > 0:
        batch = scores.shape[0]
        _, key = torch.unique(anchor_keys[rows, cols], return_inverse=True)
        pairs = torch.unique(key * batch + rows)  # one entry per (state, trajectory)
        mean, std, count = group_mean_std(scores[pairs % batch], pairs // batch, int(key.max()) + 1)
        centered = scores[rows] - mean[key]
        value = centered / (std[key] + GROUP_STD_EPS) if cfg.norm_adv_by_std else centered
        step[rows, cols] = torch.where(count[key] > 1, value, torch.zeros_like(value))
    adv = torch.where(mask, episode[:, None] + cfg.gigpo_step_weight * step, 0.0)
    return adv, adv
