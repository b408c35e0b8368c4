"""Loss aggregation modes, KL estimators, token entropy and the entropy bonus, by hand."""

import math

import pytest
import torch

from aepo_rl.algorithms import AGG_MODES, agg_loss, entropy_bonus, entropy_from_logits, kl_penalty

LOSS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, -7.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])  # row 2 is empty


@pytest.mark.parametrize("mode,expected", [
    ("token-mean", (1 + 2 + 3 + 4 + 5) / 5),
    ("seq-mean-token-sum", (6 + 9) / 2),
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),
    ("seq-mean-token-sum-norm", (6 / 4 + 9 / 4) / 2),  # T = 4, the padded response length
])
def test_aggregation_modes_by_hand(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregation_of_empty_mask_is_zero_with_zero_gradient(mode):
    loss = torch.full((2, 3), float("nan"), requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    out.backward()
    assert out.item() == 0.0 and torch.all(loss.grad == 0)


def test_aggregation_rejects_unknown_mode_and_bad_shapes():
    with pytest.raises(ValueError, match="valid modes: token-mean, seq-mean-token-sum"):
        agg_loss(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match=r"loss_mat has shape \(3, 4\) but mask has shape \(3, 3\)"):
        agg_loss(LOSS, MASK[:, :3], "token-mean")


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    diff = torch.tensor([0.5, -1.0])
    assert torch.allclose(kl_penalty(logp, ref, "k1"), diff)
    assert torch.allclose(kl_penalty(logp, ref, "k2"), 0.5 * diff ** 2)
    k3 = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])
    assert torch.allclose(kl_penalty(logp, ref, "k3"), k3)
    assert torch.allclose(kl_penalty(logp, ref, "low_var_kl"), k3)
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0  # clamp
    with pytest.raises(ValueError, match="valid kinds: k1, k2, k3, low_var_kl"):
        kl_penalty(logp, ref, "mse")


def test_entropy_from_logits_is_exact_stable_and_chunkable():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    expected = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert entropy_from_logits(logits).item() == pytest.approx(expected, abs=1e-6)
    assert entropy_from_logits(logits + 1e4).item() == pytest.approx(expected, abs=1e-3)  # no overflow
    assert entropy_from_logits(torch.tensor([[0.0, -1e9]])).item() == pytest.approx(0.0, abs=1e-6)
    big = torch.randn(3, 5, 11)
    assert torch.allclose(entropy_from_logits(big, chunk_size=4), entropy_from_logits(big), atol=1e-6)
    assert entropy_from_logits(big).shape == (3, 5)


def test_entropy_bonus_is_negative_coef_times_mean_entropy():
    entropy = torch.tensor([[1.0, 3.0, 50.0]])
    assert entropy_bonus(entropy, torch.tensor([[1, 1, 0]]), coef=0.01).item() == pytest.approx(-0.02)
