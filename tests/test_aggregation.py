"""Loss aggregation modes, KL estimators, token entropy and the entropy bonus, by hand."""

import math

import pytest
import torch

from aepo_rl.algorithms import AGG_MODES, agg_loss, entropy_bonus, entropy_from_logits, kl_penalty, micro_batch_weight

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


def test_dr_grpo_divisor_is_the_constant_loss_scale_factor():
    # verl 0.9 agg_loss, seq-mean-token-sum-norm: Σ_i Σ_t m·L / (sequences · loss_scale_factor);
    # rows 0 and 1 sum to 6 and 9, row 2 is empty: (6 + 9) / (2 · 10) with T = 10
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.75)
    # a batch whose longest response is longer (more padding) keeps the value: T is a constant
    wider_loss = torch.cat([LOSS, torch.full((3, 5), 50.0)], dim=1)
    wider_mask = torch.cat([MASK, torch.zeros(3, 5, dtype=MASK.dtype)], dim=1)
    assert (agg_loss(wider_loss, wider_mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item()
            == pytest.approx(0.75))
    # without it, verl's fallback is the padded width, which does change (15 / (2·4) vs 15 / (2·9))
    assert agg_loss(wider_loss, wider_mask, "seq-mean-token-sum-norm").item() == pytest.approx(15 / 18)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):  # the other modes ignore it
        assert agg_loss(LOSS, MASK, mode, loss_scale_factor=10).item() == agg_loss(LOSS, MASK, mode).item()


# Four rows split into micro-batches {0, 1} and {2, 3}; row 3 has no trained token.
MINI_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
MINI_LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 5.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode,weights", [
    ("token-mean", (5 / 9, 4 / 9)),            # tokens: 3 + 2 of 9, 4 of 9
    ("seq-mean-token-sum", (2 / 3, 1 / 3)),    # sequences with a token: 2 of 3, 1 of 3
    ("seq-mean-token-mean", (2 / 3, 1 / 3)),
    ("seq-mean-token-sum-norm", (2 / 3, 1 / 3)),
])
def test_mini_batch_scope_weights_give_the_whole_mini_batch_loss(mode, weights):
    micro = (slice(0, 2), slice(2, 4))
    got = [micro_batch_weight(MINI_MASK[k], MINI_MASK, mode) for k in micro]
    assert got == pytest.approx(list(weights))
    accumulated = sum(w * agg_loss(MINI_LOSS[k], MINI_MASK[k], mode, 10) for w, k in zip(got, micro))
    assert accumulated.item() == pytest.approx(agg_loss(MINI_LOSS, MINI_MASK, mode, 10).item())


def test_micro_batch_scope_is_the_release_weighting_by_hand():
    micro = (slice(0, 2), slice(2, 4))
    # release (verl 0.3.1, use_dynamic_bsz): each micro-batch's loss × its share of sequences, 2/4 each
    weights = [micro_batch_weight(MINI_MASK[k], MINI_MASK, "token-mean", "micro-batch") for k in micro]
    assert weights == [0.5, 0.5]
    # token-mean per micro-batch: (1+2+3+4+2)/5 = 2.4 and (1+1+1+5)/4 = 2 → 0.5·2.4 + 0.5·2 = 2.2
    release = sum(w * agg_loss(MINI_LOSS[k], MINI_MASK[k], "token-mean") for w, k in zip(weights, micro))
    assert release.item() == pytest.approx(2.2)
    assert agg_loss(MINI_LOSS, MINI_MASK, "token-mean").item() == pytest.approx(20 / 9)  # mini-batch scope
    uneven = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert micro_batch_weight(uneven[:1], uneven, "token-mean", "micro-batch") == 0.5  # sequences, not tokens (4/5)
    assert micro_batch_weight(uneven[:1], uneven, "token-mean") == pytest.approx(4 / 5)
    # seq-mean-token-sum-norm in verl 0.3.1 sums over sequences: Σ_i,t m·L / T per micro-batch, T = 10:
    # (6 + 6)/10 = 1.2 and 8/10 = 0.8, weighted 2/4 each → 1.0
    weights = [micro_batch_weight(MINI_MASK[k], MINI_MASK, "seq-mean-token-sum-norm", "micro-batch") for k in micro]
    assert weights == [1.0, 0.5]  # 2/4 · 2 sequences, 2/4 · 1 sequence
    release = sum(w * agg_loss(MINI_LOSS[k], MINI_MASK[k], "seq-mean-token-sum-norm", 10)
                  for w, k in zip(weights, micro))
    assert release.item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="valid scopes: mini-batch, micro-batch"):
        micro_batch_weight(MINI_MASK, MINI_MASK, "token-mean", "batch")


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
