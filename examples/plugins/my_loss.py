"""A policy loss in one file: the unclipped importance-weighted policy gradient.

    L = agg(−A_t · r_t),  r_t = π_θ(y_t) / π_old(y_t)

is the surrogate of §2.3 without its clip: every token keeps its gradient however far the
policy moved. Run it with

    aepo --plugin examples/plugins/my_loss.py train algorithm.policy_loss=unclipped
"""

import torch

from aepo_rl.algorithms import agg_loss
from aepo_rl.registry import register_policy_loss


@register_policy_loss("unclipped")  # needs nothing beyond verl's arguments; see docs/extending.md for `needs`
def unclipped_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
                          config=None, entropy=None, *, entropy_stats=None, index=None):
    mask = response_mask.bool()
    log_ratio = torch.where(mask, log_prob - old_log_prob, 0.0).clamp(-20.0, 20.0)
    loss = agg_loss(-advantages * log_ratio.exp(), response_mask, loss_agg_mode)
    ppo_kl = -log_ratio.detach().sum() / mask.sum().clamp(min=1)  # verl's actor/ppo_kl
    return loss, {"actor/pg_loss": loss.item(), "actor/ppo_kl": ppo_kl.item()}
