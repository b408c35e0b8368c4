"""Rollout Correction (§2.11) against verl 0.9.1's own functions on random tensors: IS weights (token, sequence,
TIS, IcePop, batch-normalised), rejection masks (every option, chained), the off-policy metrics, the whole
pipeline; and the IS weights on the policy loss, as the trainer applies them, against verl's ``ppo_loss``.
Marked ``verl``; runs in .venv-verl (.ci/run), skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl "
                            "(.ci/run, docs/verl.md)")

from verl.trainer.ppo import rollout_corr_helper as verl_rc  # noqa: E402

from aepo_rl.algorithms import rollout_correction as rc  # noqa: E402
from aepo_rl.algorithms.losses import aepo_policy_loss  # noqa: E402
from aepo_rl.config import AlgorithmConfig, RolloutCorrectionConfig  # noqa: E402
from aepo_rl.train.rl import is_weighted_aggregate  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def _tensors(seed: int, rows: int = 12, width: int = 16, spread: float = 0.6):
    """Rollout and training log-probs that disagree by ~``spread`` nats, a ragged mask with tool holes and a
    row without a trained token."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(rows, width, generator=g) * 4
    old = rollout + torch.randn(rows, width, generator=g) * spread
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    mask[1, 2:5] = 0
    mask[-1] = 0
    return old, rollout, mask


def _same_metrics(ours: dict, theirs: dict, prefix: str = ""):
    """Every metric we log is verl's, under verl's name, with verl's value."""
    ours = {k.removeprefix(prefix): float(v) for k, v in ours.items()}
    missing = sorted(set(ours) - set(theirs))
    assert not missing, f"not verl's names: {missing}"
    for key, value in ours.items():
        assert value == pytest.approx(float(theirs[key]), abs=1e-5, rel=1e-5), key
    return len(ours)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", ["2.0", "0.5_2.0", "5"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_is_weights_equal_verls(level, threshold, normalize, seed):
    old, rollout, mask = _tensors(seed, spread=0.6 if level == "token" else 0.05)
    ours, our_metrics = rc.is_weights(old - rollout, mask, level, threshold, normalize)
    theirs, their_metrics = verl_rc.compute_rollout_correction_weights(old - rollout, mask, level, threshold, normalize)
    torch.testing.assert_close(ours, theirs, **TOL)
    assert _same_metrics(rc.to_floats(our_metrics), their_metrics) >= 14
    assert ours.max() > 0 and ours[mask == 0].abs().sum() == 0


@pytest.mark.parametrize("options,threshold", [
    ("token_k1", "0.6_1.5"), ("token_k1", "1.5"), ("token_k2", "0.1"), ("token_k3", "0.1"),
    ("seq_sum_k1", "0.3_3.0"), ("seq_sum_k2", "1.0"), ("seq_sum_k3", "1.0"),
    ("seq_mean_k1", "0.8_1.25"), ("seq_mean_k2", "0.1"), ("seq_mean_k3", "0.1"),
    ("seq_max_k2", "0.5"), ("seq_max_k3", "0.5"),
    ("token_k1,seq_mean_k3", "0.5_2.0,0.15"), ("seq_max_k2,token_k3", "0.6"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_masks_equal_verls(options, threshold, seed):
    old, rollout, mask = _tensors(seed)
    ours, our_metrics = rc.rejection_mask(old - rollout, mask, options, threshold)
    theirs, their_metrics = verl_rc.compute_rollout_rejection_mask(old - rollout, mask, options, threshold)
    assert torch.equal(ours, theirs)
    assert 0 < ours.sum() < mask.sum() or options == "seq_max_k3"  # the thresholds reject some, not all
    _same_metrics(rc.to_floats(our_metrics), their_metrics)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mismatch_metrics_equal_verls(seed):
    old, rollout, mask = _tensors(seed, spread=0.05 * (seed + 1))
    ours = rc.to_floats(rc.mismatch_metrics(old, rollout, mask))
    theirs = verl_rc.compute_offpolicy_metrics(old, rollout, mask)
    assert set(ours) == set(theirs)
    _same_metrics(ours, theirs)


@pytest.mark.parametrize("settings", [
    dict(rollout_is="token"), dict(rollout_is="sequence", rollout_is_threshold="0.5_2.0"),
    dict(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"),
    dict(rollout_is="token", rollout_is_batch_normalize=True, rollout_rs="seq_mean_k3,token_k2",
         rollout_rs_threshold="0.2,0.5"),
])
def test_the_whole_correction_equals_verls(settings):
    old, rollout, mask = _tensors(3, spread=0.3)
    config = RolloutCorrectionConfig(**settings)
    weights, new_mask, metrics = rc.rollout_correction(old, rollout, mask, config)
    proto, their_mask, their_metrics = verl_rc.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, rollout_is=config.rollout_is, rollout_is_threshold=config.rollout_is_threshold,
        rollout_is_batch_normalize=config.rollout_is_batch_normalize, rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold)
    assert torch.equal(new_mask, their_mask)
    if proto is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, proto.batch["rollout_is_weights"], **TOL)
    assert _same_metrics(metrics, their_metrics) == len(their_metrics)  # every metric verl logs, none more


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_the_trainers_is_weighted_aepo_loss_equals_verls_ppo_loss_with_rollout_is_weights(agg):
    """The trainer multiplies the per-token policy loss by the IS weights before aggregating
    (``is_weighted_aggregate``); verl's ppo_loss, with ``rollout_is_weights`` in the batch, through the plugin's
    aepo loss, gives the same loss and gradient."""
    import verl.workers.engine_workers as engine_workers
    from test_verl_plugin_on_cpu import _actor_config, _batch, _flat, _verl_data

    lengths, mask, old, logp, adv, entropy, prompt = _batch()
    weights, _ = rc.is_weights(old - (old - 0.3 * torch.randn_like(old)), mask, "token", "2.0")
    leaf = logp.clone().requires_grad_(True)
    data = _verl_data(lengths, mask, old, adv, prompt)
    data["rollout_is_weights"] = weights
    loss, _ = engine_workers.ppo_loss(_actor_config("aepo", agg, entropy_adv_coef=0.2),
                                      {"log_probs": _flat(leaf, lengths, prompt),
                                       "entropy": _flat(entropy, lengths, prompt)},
                                      data)
    loss.backward()
    native = logp.clone().requires_grad_(True)
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, entropy_adv_scope="micro-batch",
                          entropy_adv_coef=0.2, loss_agg_mode=agg)
    ref, _ = aepo_policy_loss(old, native, adv, mask, agg, cfg, entropy, aggregate=is_weighted_aggregate(weights, cfg))
    ref.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(leaf.grad, native.grad, atol=1e-6, rtol=0)
    unweighted, _ = aepo_policy_loss(old, logp, adv, mask, agg, cfg, entropy)
    assert not torch.allclose(unweighted, ref, atol=1e-4)  # the weights matter
