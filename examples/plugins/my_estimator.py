"""An advantage estimator in one file: the outcome minus the mean outcome of the whole batch.

    A_i,t = R_i − mean_j R_j   for every response token t of trajectory i (mask 0: A = 0)

i.e. REINFORCE with a batch-mean baseline, where GRPO (§2.1) takes the mean of the prompt's
group. Run it with

    aepo --plugin examples/plugins/my_estimator.py train algorithm.adv_estimator=batch_mean
"""

import torch

from aepo_rl.registry import register_advantage_estimator


@register_advantage_estimator("batch_mean")  # needs=("kl",) or ("anchor_keys",) would add keyword arguments
def batch_mean_advantage(token_level_rewards, response_mask, index, config=None, **kw):
    outcome = token_level_rewards.sum(-1)  # R_i: the reward sits on the last trained token
    advantages = torch.where(response_mask.bool(), (outcome - outcome.mean())[:, None], 0.0)
    return advantages, advantages  # (advantages, returns)
