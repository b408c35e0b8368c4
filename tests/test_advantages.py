"""Advantage estimators on hand-computed groups, and the DAPO helpers."""

import math

import pytest
import torch
from helpers import make_traj

from aepo_rl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    PolicyLossConfig,
    filter_groups,
    get_advantage_estimator,
    overlong_penalty,
)
from aepo_rl.train.rl import anchor_keys

EPS = 1e-6
# Rows: group "a" = rewards 1, 0, 0; group "b" = a single row, reward 0.5; group "c" = two equal rewards.
INDEX = ["a", "a", "a", "b", "c", "c"]
R = [1.0, 0.0, 0.0, 0.5, 1.0, 1.0]
MASK = torch.tensor([[1, 1, 0]] * 6)


def outcome_rewards(scores, length=3):
    """Token rewards with the outcome reward on the last token (a masked-out one here)."""
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores)
    return rewards


def estimate(name, scores=R, index=INDEX, mask=MASK, **kw):
    cfg = PolicyLossConfig(**kw.pop("cfg", {}))
    return get_advantage_estimator(name)(outcome_rewards(scores), mask, index, cfg, **kw)


def expect_rows(adv, per_row, mask=MASK):
    expected = torch.tensor(per_row)[:, None] * mask
    assert torch.allclose(adv, expected, atol=1e-5), (adv, expected)


def test_grpo_by_hand():
    std_a = math.sqrt(1 / 3)  # unbiased std of 1, 0, 0
    adv, returns = estimate("grpo")
    expect_rows(adv, [(2 / 3) / (std_a + EPS), (-1 / 3) / (std_a + EPS), (-1 / 3) / (std_a + EPS),
                      0.5 / (1 + EPS), 0.0, 0.0])
    assert torch.equal(adv, returns)


def test_grpo_without_std_and_dr_grpo():
    centered = [2 / 3, -1 / 3, -1 / 3, 0.5, 0.0, 0.0]
    expect_rows(estimate("grpo", cfg={"norm_adv_by_std": False})[0], centered)
    expect_rows(estimate("dr_grpo")[0], centered)


def test_grpo_with_n_equal_one_uses_mean_zero_std_one():
    mask = torch.ones(3, 3)
    adv, _ = estimate("grpo", scores=[1.0, -1.0, 0.25], index=[0, 1, 2], mask=mask)
    expect_rows(adv, [1 / (1 + EPS), -1 / (1 + EPS), 0.25 / (1 + EPS)], mask)


@pytest.mark.parametrize("name", ["dr_grpo", "rloo", "gigpo"])
def test_n_equal_one_keeps_the_raw_reward(name):
    # every group has one trajectory: mean 0 (and for gigpo std 1, no step groups)
    mask = torch.ones(3, 3)
    adv, _ = estimate(name, scores=[1.0, -1.0, 0.25], index=["x", "y", "z"], mask=mask,
                      anchor_keys=torch.tensor([[-1, 1, 1], [-1, 2, 2], [-1, 3, 3]]))
    expect_rows(adv, [1.0, -1.0, 0.25], mask)


def test_rloo_by_hand():
    # A_i = R_i − mean of the others: group a → 1 − 0, 0 − 0.5, 0 − 0.5; a group of one keeps R
    expect_rows(estimate("rloo")[0], [1.0, -0.5, -0.5, 0.5, 0.0, 0.0])


def test_reinforce_plus_plus_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.ones(2, 3)
    adv, returns = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, None, PolicyLossConfig())
    assert torch.allclose(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    scale = 1 / math.sqrt(6 * 0.25 / 5)  # mean 0.5, unbiased var 0.3 over the 6 tokens
    assert torch.allclose(adv, torch.tensor([[0.5] * 3, [-0.5] * 3]) * scale, atol=1e-5)
    # γ = 0.5 and a per-token KL penalty folded into the rewards (β = 0.1), KL ignored under mask 0
    kl = torch.tensor([[1.0, 2.0, 0.0], [0.0, 50.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    cfg = PolicyLossConfig(gamma=0.5, use_kl_in_reward=True, kl_coef=0.1)
    _, returns = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, None, cfg, kl=kl)
    # row 0 rewards −0.1, −0.2, 1 → G = [−0.1 + 0.5·0.3, −0.2 + 0.5·1, 1];
    # row 1 rewards 0, 0, −0.3 (token 1 masked: its return is reported as 0)
    assert torch.allclose(returns, torch.tensor([[0.05, 0.3, 1.0], [-0.075, 0.0, -0.3]]), atol=1e-6)
    with pytest.raises(ValueError, match="kl="):
        get_advantage_estimator("reinforce_plus_plus")(rewards, mask, None, cfg)


def test_reinforce_plus_plus_does_not_cut_credit_at_tool_tokens():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1]])  # row 0: tool result at tokens 1-2
    _, returns = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, None, PolicyLossConfig())
    assert returns[0, 0].item() == 1.0


def test_reinforce_plus_plus_baseline_by_hand():
    adv, _ = estimate("reinforce_plus_plus_baseline")
    centered = torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])  # group of one: mean 0 → R − 0 = 0.5
    centered[3] = 0.5
    tokens = centered.repeat_interleave(2)  # two masked tokens per row
    whitened = (tokens - tokens.mean()) / tokens.std()
    expect_rows(adv, whitened[::2].tolist())


def test_gigpo_by_hand():
    # one group, R = 1, 0, 1. Token anchors: rows 0 and 1 share state 7; states 8 and 9 are reached once.
    rewards = outcome_rewards([1.0, 0.0, 1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    anchors = torch.tensor([[-1, 7, 7], [-1, 7, 9], [-1, 8, 8]])
    cfg = PolicyLossConfig(gigpo_step_weight=0.5)
    adv, _ = get_advantage_estimator("gigpo")(rewards, mask, [0, 0, 0], cfg, anchor_keys=anchors)
    std = math.sqrt(1 / 3)
    episode = torch.tensor([1 / 3, -2 / 3, 1 / 3]) / (std + EPS)
    step_7 = 0.5 / (math.sqrt(0.5) + EPS)  # R = 1, 0 within state 7: mean 0.5, unbiased std √0.5
    expected = episode[:, None].expand(3, 3).clone()
    expected[0, 1:] += 0.5 * step_7
    expected[1, 1] -= 0.5 * step_7
    expected[2, 2] = 0.0  # mask 0
    assert torch.allclose(adv, expected, atol=1e-5)
    with pytest.raises(ValueError, match="anchor_keys"):
        get_advantage_estimator("gigpo")(rewards, mask, [0, 0, 0], cfg)


def test_anchor_keys_group_tokens_by_identical_prefix_ending_at_a_tool_result():
    # Round 0: tokens 0-1, tool result 2-3, round 1: 4-5. The fork (traj 1) shares round 0 and the
    # tool result, then generates differently; traj 2 differs from the first token.
    a = make_traj([1, 2], [10, 11, 50, 51, 12, 13], [1, 1, 0, 0, 1, 1], rounds=[(0, 2), (4, 6)])
    b = make_traj([1, 2], [10, 11, 50, 51, 14, 15], [1, 1, 0, 0, 1, 1], rounds=[(0, 2), (4, 6)], traj_id=1)
    c = make_traj([1, 2], [16, 11, 50, 51, 12], [1, 1, 0, 0, 1], rounds=[(0, 2), (4, 5)], traj_id=2)
    other_group = make_traj([1, 2], [10, 11], [1, 1], rounds=[(0, 2)])
    keys = anchor_keys([a, b, c, other_group], [0, 0, 0, 1], response_length=6)
    assert keys[0, 0] == keys[1, 0] == keys[2, 0]  # the bare prompt
    assert keys[0, 4] == keys[1, 4] and keys[0, 5] == keys[1, 4]  # same prefix up to the tool result
    assert keys[2, 4] != keys[0, 4]  # different first round: a different state
    assert keys[0, 4] != keys[0, 0]
    assert keys[3, 0] != keys[0, 0]  # same prompt tokens in another group: not the same anchor
    assert keys[2, 5] == -1 and keys[3, 2] == -1  # padding has no anchor
    assert bool((keys[:3, :5] >= 0).all())


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_all_equal_rewards_give_zero_advantage_and_mask_zero_tokens_get_zero(name):
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]])
    adv, _ = get_advantage_estimator(name)(outcome_rewards([0.7, 0.7, 0.7]), mask, ["g"] * 3, PolicyLossConfig(),
                                           anchor_keys=torch.full((3, 3), -1))
    assert torch.allclose(adv, torch.zeros(3, 3), atol=1e-4)
    adv, _ = get_advantage_estimator(name)(outcome_rewards([1.0, 0.0, 2.0]), mask, ["g"] * 3, PolicyLossConfig(),
                                           anchor_keys=torch.full((3, 3), -1))
    assert torch.all(adv[mask == 0] == 0) and torch.any(adv[mask == 1] != 0)


def test_estimator_input_errors():
    with pytest.raises(ValueError, match="index has 2 entries but the batch has 6 rows"):
        estimate("grpo", index=["a", "b"])
    bad = outcome_rewards(R)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="token_level_rewards contains NaN or Inf"):
        get_advantage_estimator("grpo")(bad, MASK, INDEX)
    with pytest.raises(ValueError,
                       match=r"token_level_rewards has shape \(6, 3\) but response_mask has shape \(6, 2\)"):
        get_advantage_estimator("rloo")(outcome_rewards(R), MASK[:, :2], INDEX)
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'; valid names: dr_grpo, gigpo, grpo, "
                                         "reinforce_plus_plus, reinforce_plus_plus_baseline, rloo"):
        get_advantage_estimator("gae")


def test_filter_groups_drops_all_equal_groups():
    keep, metrics = filter_groups(torch.tensor(R), INDEX)
    assert keep.tolist() == [True, True, True, True, False, False]  # a group of one is kept
    assert metrics == {"dynamic_sampling/dropped_group_frac": pytest.approx(1 / 3), "dynamic_sampling/kept_rows": 4.0}
    keep, _ = filter_groups(outcome_rewards(R), INDEX)  # token rewards are summed
    assert keep.tolist() == [True, True, True, True, False, False]


def test_overlong_penalty_is_linear_in_the_buffer():
    penalty = overlong_penalty([5, 6, 8, 10, 12], max_len=10, buffer_len=4, penalty_factor=1.0)
    assert torch.allclose(penalty, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    assert torch.all(overlong_penalty([5, 10], max_len=10, buffer_len=0) == 0)
    with pytest.raises(ValueError, match="buffer_len=11"):
        overlong_penalty([5], max_len=10, buffer_len=11)
