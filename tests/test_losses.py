"""Policy losses: the §2.3 gradient table, hand-computed CISPO/GSPO/DAPO, the §2.2 entropy-aware
advantage, mask invariance, bad inputs and the registry."""

import math

import pytest
import torch

from aepo_rl.algorithms import POLICY_LOSSES, PolicyLossConfig, entropy_stats, get_policy_loss, register_policy_loss
from aepo_rl.config import ConfigError, load_config

NO_ENT = dict(entropy_adv_coef=0.0)


def run_loss(name, log_ratio, adv, mask=None, agg="seq-mean-token-sum", entropy=None, **cfg_kw):
    """Loss, metrics and d loss / d log π for tokens with log r = ``log_ratio`` (log π = 0)."""
    log_ratio = torch.as_tensor(log_ratio, dtype=torch.float32)
    log_prob = torch.zeros_like(log_ratio, requires_grad=True)
    mask = torch.ones_like(log_ratio) if mask is None else torch.as_tensor(mask, dtype=torch.float32)
    adv = torch.as_tensor(adv, dtype=torch.float32)
    cfg = PolicyLossConfig(**{**NO_ENT, **cfg_kw})
    loss, metrics = get_policy_loss(name)(-log_ratio, log_prob, adv, mask, agg, cfg, entropy)
    loss.backward()
    return loss, metrics, log_prob.grad


# §2.3 gradient table, ε_l = ε_h = 0.2, c = 3: (r, A) → gradient w.r.t. log π for ppo, aepo, gppo.
GRADIENT_TABLE = [
    ("A>0, r<=1+eh", 1.1, 1.0, (-1.1, -1.1, -1.1)),
    ("A>0, r>1+eh", 1.5, 1.0, (0.0, -1.2, -1.2)),
    ("A<0, 1-el<=r<=c (low)", 0.9, -1.0, (0.9, 0.9, 0.9)),
    ("A<0, 1-el<=r<=c (high)", 2.0, -1.0, (2.0, 2.0, 2.0)),
    ("A<0, r<1-el", 0.5, -1.0, (0.0, 0.0, 0.8)),
    ("A<0, r>c (dual clip)", 4.0, -1.0, (0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize("region,r,adv,expected", GRADIENT_TABLE, ids=[row[0] for row in GRADIENT_TABLE])
@pytest.mark.parametrize("loss_index,name", enumerate(["ppo", "aepo", "gppo"]))
def test_gradient_table(region, r, adv, expected, loss_index, name):
    _, _, grad = run_loss(name, [[math.log(r)]], [[adv]])
    assert grad.item() == pytest.approx(expected[loss_index], abs=1e-6)


def test_gradient_table_in_one_batch_and_equal_forward():
    log_ratio = [[math.log(r) for _, r, _, _ in GRADIENT_TABLE]]
    adv = [[a for _, _, a, _ in GRADIENT_TABLE]]
    results = {name: run_loss(name, log_ratio, adv) for name in ("ppo", "grpo", "aepo", "gppo")}
    for index, name in enumerate(["ppo", "aepo", "gppo"]):
        expected = torch.tensor([[row[3][index] for row in GRADIENT_TABLE]])
        assert torch.allclose(results[name][2], expected, atol=1e-6)
    # forward values equal PPO's: max(−A r, −A clip(r)) then dual clip
    expected_loss = -1.1 - 1.2 + 0.9 + 2.0 + 0.8 + 3.0
    for name, (loss, metrics, _) in results.items():
        assert loss.item() == pytest.approx(expected_loss, abs=1e-5)
        # verl's meaning: clipped branch taken at either bound (r = 1.5, A > 0 and r = 0.5, A < 0);
        # _lower = dual clip active (r = 4, A < 0); our split by bound under other names
        assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)
        assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 6)
        assert metrics["actor/pg_clipfrac_upper_bound"] == pytest.approx(1 / 6)
        assert metrics["actor/pg_clipfrac_lower_bound"] == pytest.approx(1 / 6)
    assert results["aepo"][1]["actor/grad_preserved_frac"] == pytest.approx(1 / 6)


def test_forward_equal_on_random_tensors():
    gen = torch.Generator().manual_seed(0)
    old, new = torch.randn(4, 9, generator=gen), torch.randn(4, 9, generator=gen)
    adv, mask = torch.randn(4, 9, generator=gen), (torch.rand(4, 9, generator=gen) > 0.3).float()
    cfg = PolicyLossConfig(**NO_ENT)
    losses = [get_policy_loss(n)(old, new, adv, mask, "token-mean", cfg)[0] for n in ("ppo", "aepo", "gppo")]
    assert torch.allclose(losses[0], losses[1]) and torch.allclose(losses[0], losses[2])


def test_dapo_clip_higher_by_hand():
    # ε_l = 0.2, ε_h = 0.28: r = 1.25 is inside the bound (gradient −r·A), r = 1.4 is clipped to 1.28.
    loss, metrics, grad = run_loss("dapo", [[math.log(1.25), math.log(1.4), math.log(0.7)]], [[1.0, 1.0, -2.0]],
                                   clip_ratio_high=0.28)
    assert loss.item() == pytest.approx(-1.25 - 1.28 + 2 * 0.8, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-1.25, 0.0, 0.0]]), atol=1e-6)
    # r = 1.4 (A > 0) and r = 0.7 (A < 0) take the clipped branch; −A·max(r, clip(r)) = 1.6 < −A·c = 6: no dual clip
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/pg_clipfrac_upper_bound"] == pytest.approx(1 / 3)
    assert metrics["actor/pg_clipfrac_lower_bound"] == pytest.approx(1 / 3)
    # the same tokens under symmetric ε = 0.2 (ppo): 1.25 is clipped too
    _, _, grad = run_loss("ppo", [[math.log(1.25), math.log(1.4), math.log(0.7)]], [[1.0, 1.0, -2.0]])
    assert torch.allclose(grad, torch.zeros(1, 3))


def run_cispo(**cfg_kw):
    """CISPO on two tokens: r = 1.5 with A = +1 and r = 0.5 with A = −1, log π = (−0.5, −1)."""
    log_prob = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    ratios = torch.tensor([[1.5, 0.5]])
    old = log_prob.detach() - ratios.log()
    cfg = PolicyLossConfig(clip_ratio_high=0.28, **NO_ENT, **cfg_kw)
    loss, metrics = get_policy_loss("cispo")(old, log_prob, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                                             "token-mean", cfg)
    loss.backward()
    return loss, metrics, log_prob.grad


def test_cispo_by_hand():
    # CISPO paper (the cispo preset, ε_l = 1: no lower bound)
    loss, metrics, grad = run_cispo(clip_ratio_low=1.0)
    # −sg(min(r, 1.28))·A·log π: token 1: −1.28·1·(−0.5) = 0.64; token 2: −0.5·(−1)·(−1) = −0.5
    assert loss.item() == pytest.approx((0.64 - 0.5) / 2, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-1.28 / 2, 0.5 / 2]]), atol=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, abs=1e-6)
    assert load_config("cispo").algorithm.clip_ratio_low == 1.0


def test_cispo_with_verls_lower_bound_by_hand():
    # verl's compute_policy_loss_cispo: weight clip(r, 1 − ε_l, 1 + ε_h) = (1.28, 0.8) with ε_l = 0.2
    loss, metrics, grad = run_cispo(clip_ratio_low=0.2)
    # token 1: −1.28·1·(−0.5) = 0.64; token 2: −0.8·(−1)·(−1) = −0.8
    assert loss.item() == pytest.approx((0.64 - 0.8) / 2, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[-1.28 / 2, 0.8 / 2]]), atol=1e-6)
    assert metrics["actor/pg_clipfrac"] == 1.0  # both weights clipped
    assert metrics["actor/pg_clipfrac_lower"] == 0.0  # no dual clip in CISPO
    assert metrics["actor/pg_clipfrac_upper_bound"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower_bound"] == pytest.approx(0.5)


def test_gspo_by_hand():
    # row 0: log r = [0.1, 0.3] → s = e^0.2 = 1.2214 > 1.2, A = +1 → clipped: −1.2 per token, gradient 0
    # row 1: log r = [−0.1, 0.0] (third token masked) → s = e^−0.05, A = −1 → loss s, gradient s per token
    log_ratio = [[0.1, 0.3, 0.0], [-0.1, 0.0, 5.0]]
    mask = [[1, 1, 0], [1, 1, 0]]
    loss, metrics, grad = run_loss("gspo", log_ratio, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], mask=mask,
                                   agg="token-mean")
    s = math.exp(-0.05)
    assert loss.item() == pytest.approx((-1.2 * 2 + s * 2) / 4, abs=1e-6)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, 0.0], [s / 4, s / 4, 0.0]]), atol=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_gspo_tiny_epsilon_preset_values():
    # with ε = 3e-4 / 4e-4 a sequence ratio of e^0.001 > 1.0004 is clipped for A > 0
    _, metrics, grad = run_loss("gspo", [[0.001, 0.001]], [[1.0, 1.0]], clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    assert metrics["actor/pg_clipfrac"] == 1.0 and torch.all(grad == 0)


# ---- §2.2 entropy-aware advantage -------------------------------------------------------------

H = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
Z = (H - 2.5) / math.sqrt(5 / 3)  # unbiased std of 1, 2, 3, 4


def test_entropy_aware_advantage_by_hand():
    # r = 1 everywhere, so the gradient of each token is −Ã = −A·(1 + a·z)
    loss, metrics, grad = run_loss("aepo", [[0.0] * 4], [[1.0] * 4], entropy=H, entropy_adv_coef=0.2)
    assert torch.allclose(grad, -(1 + 0.2 * Z), atol=1e-6)
    assert loss.item() == pytest.approx(-4.0, abs=1e-6)
    assert metrics["actor/entropy_adv_scale/mean"] == pytest.approx(1.0, abs=1e-6)


def test_entropy_aware_advantage_clamp():
    _, metrics, grad = run_loss("aepo", [[0.0] * 4], [[1.0] * 4], entropy=H, entropy_adv_coef=1.0,
                                entropy_adv_clamp=True)
    expected = (1 + Z).clamp(min=0)
    assert expected[0, 0] == 0  # 1 + z = −0.16 is clamped
    assert torch.allclose(grad, -expected, atol=1e-6)
    assert metrics["actor/entropy_adv_scale/mean"] == pytest.approx(expected.mean().item(), abs=1e-6)
    _, _, unclamped = run_loss("aepo", [[0.0] * 4], [[1.0] * 4], entropy=H, entropy_adv_coef=1.0)
    assert unclamped[0, 0].item() == pytest.approx(-(1 + Z[0, 0]).item(), abs=1e-6)  # sign flips without the clamp


def test_constant_entropy_gives_std_one():
    _, _, grad = run_loss("aepo", [[0.0] * 3], [[1.0] * 3], entropy=torch.full((1, 3), 2.0), entropy_adv_coef=0.5)
    assert torch.allclose(grad, -torch.ones(1, 3))


def test_mini_batch_scope_stats_are_used_across_micro_batches():
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.ones(2, 2)
    mean, std = entropy_stats(entropy, mask, "mini-batch")
    assert mean.item() == pytest.approx(2.5) and std.item() == pytest.approx(math.sqrt(5 / 3))
    cfg = PolicyLossConfig(entropy_adv_coef=0.2)
    log_prob = torch.zeros(1, 2, requires_grad=True)  # micro-batch = first row only
    get_policy_loss("aepo")(torch.zeros(1, 2), log_prob, torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum",
                            cfg, entropy[:1], entropy_stats=(mean, std))[0].backward()
    assert torch.allclose(log_prob.grad, -(1 + 0.2 * (entropy[:1] - 2.5) / math.sqrt(5 / 3)))
    assert entropy_stats(entropy, mask, "micro-batch") is None


def test_group_scope_stats_by_hand():
    entropy = torch.tensor([[1.0, 3.0], [5.0, 7.0], [2.0, 9.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    mean, std = entropy_stats(entropy, mask, "group", index=["a", "a", "b"])
    assert mean.shape == (3, 1)
    assert torch.allclose(mean[:, 0], torch.tensor([4.0, 4.0, 2.0]))
    assert torch.allclose(std[:, 0], torch.tensor([math.sqrt(20 / 3), math.sqrt(20 / 3), 1.0]))  # one token → std 1
    # the loss computes group statistics itself from index when scope = group and none are passed
    cfg = PolicyLossConfig(entropy_adv_coef=0.2, entropy_adv_scope="group")
    log_prob = torch.zeros(3, 2, requires_grad=True)
    get_policy_loss("aepo")(torch.zeros(3, 2), log_prob, torch.ones(3, 2), mask, "seq-mean-token-sum", cfg, entropy,
                            index=["a", "a", "b"])[0].backward()
    expected = -(1 + 0.2 * (entropy - mean) / std) * mask / 3
    assert torch.allclose(log_prob.grad, expected, atol=1e-6)
    with pytest.raises(ValueError, match="index"):
        entropy_stats(entropy, mask, "group")
    with pytest.raises(ValueError, match="valid scopes"):
        entropy_stats(entropy, mask, "batch")


def test_quantile_restricts_gradient_preservation_to_high_entropy_tokens():
    # all tokens at r = 1.5 with A = +1: only tokens with H ≥ the median (2.5) keep −1.2
    loss, metrics, grad = run_loss("aepo", [[math.log(1.5)] * 4], [[1.0] * 4], entropy=H,
                                   grad_preserve_entropy_quantile=0.5)
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, -1.2, -1.2]]), atol=1e-6)
    assert loss.item() == pytest.approx(-4.8, abs=1e-6)
    assert metrics["actor/grad_preserved_frac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac"] == 1.0


def test_sg_upper_clip_off_is_ppos_hard_clip_with_the_entropy_advantage_kept():
    # the stop-gradient ablation: every row of the §2.3 table gets PPO's gradient, same forward value
    log_ratio = [[math.log(r) for _, r, _, _ in GRADIENT_TABLE]]
    adv = [[a for _, _, a, _ in GRADIENT_TABLE]]
    loss, metrics, grad = run_loss("aepo", log_ratio, adv, sg_upper_clip=False)
    assert torch.allclose(grad, torch.tensor([[row[3][0] for row in GRADIENT_TABLE]]), atol=1e-6)
    assert loss.item() == pytest.approx(-1.1 - 1.2 + 0.9 + 2.0 + 0.8 + 3.0, abs=1e-5)
    assert metrics["actor/grad_preserved_frac"] == 0.0
    # the entropy-aware advantage stays on: Ã = A(1 + a·z) scales the unclipped gradient
    _, _, grad = run_loss("aepo", [[0.0, 0.0]], [[1.0, 1.0]], entropy=torch.tensor([[1.0, 3.0]]),
                          sg_upper_clip=False, entropy_adv_coef=0.2)
    z = 1 / math.sqrt(2)  # (H − 2)/std with the sample std √2
    assert torch.allclose(grad, torch.tensor([[-(1 - 0.2 * z), -(1 + 0.2 * z)]]), atol=1e-6)


@pytest.mark.parametrize("name", ["ppo", "gppo", "aepo", "cispo", "gspo"])
def test_aggregate_replaces_the_aggregation_only(name):
    # a host trainer's own normaliser (verl's agg_loss, TRL's loss types) gets the same loss matrix
    log_ratio = torch.tensor([[0.1, -0.3, 0.5], [0.2, 0.0, -0.1]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    seen = {}

    def total_over_7(loss_mat, bool_mask):
        seen["mask"] = bool_mask
        return (loss_mat * bool_mask).sum() / 7.0

    cfg = PolicyLossConfig(**NO_ENT)
    fn = get_policy_loss(name)
    mine, mine_metrics = fn(-log_ratio, torch.zeros(2, 3), adv, mask, "seq-mean-token-sum", cfg, aggregate=total_over_7)
    theirs, metrics = fn(-log_ratio, torch.zeros(2, 3), adv, mask, "seq-mean-token-sum", cfg)
    # seq-mean-token-sum = Σ over tokens / 2 sequences, so the two differ by the factor 2/7 exactly
    assert mine.item() == pytest.approx(theirs.item() * 2 / 7, rel=1e-6)
    assert torch.equal(seen["mask"], mask.bool())
    assert {k: v for k, v in mine_metrics.items() if k != "actor/pg_loss"} == {
        k: v for k, v in metrics.items() if k != "actor/pg_loss"}


def test_aepo_needs_entropy_when_the_entropy_advantage_is_on():
    with pytest.raises(ValueError, match="entropy"):
        get_policy_loss("aepo")(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))


# ---- mask invariance, bad inputs, registry ---------------------------------------------------

AEPO_FULL = dict(entropy_adv_coef=0.3, entropy_adv_clamp=True, grad_preserve_entropy_quantile=0.3)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_masked_tokens_change_nothing(name, agg):
    gen = torch.Generator().manual_seed(1)
    shape = (4, 7)
    old, new = torch.randn(shape, generator=gen) * 0.5, torch.randn(shape, generator=gen) * 0.5
    adv, entropy = torch.randn(shape, generator=gen), torch.rand(shape, generator=gen) * 3
    mask = (torch.rand(shape, generator=gen) > 0.4).float()
    mask[3] = 0  # one fully padded row
    cfg = PolicyLossConfig(**AEPO_FULL)

    def evaluate(old, new, adv, entropy):
        log_prob = new.clone().requires_grad_(True)
        loss, metrics = get_policy_loss(name)(old, log_prob, adv, mask, agg, cfg, entropy, index=[0, 0, 1, 1])
        loss.backward()
        return loss, metrics, log_prob.grad

    base = evaluate(old, new, adv, entropy)
    hidden = mask == 0
    wild = lambda x, v: torch.where(hidden, torch.full_like(x, v), x)  # noqa: E731
    perturbed = evaluate(wild(old, -1e4), wild(new, float("nan")), wild(adv, 1e6), wild(entropy, float("inf")))
    assert torch.equal(base[0], perturbed[0])
    assert base[1] == perturbed[1]
    assert torch.equal(base[2], perturbed[2])
    assert torch.all(base[2][hidden] == 0)
    stats = entropy_stats(entropy, mask, "mini-batch"), entropy_stats(wild(entropy, 1e9), mask, "mini-batch")
    assert torch.equal(stats[0][0], stats[1][0]) and torch.equal(stats[0][1], stats[1][1])
    group = (entropy_stats(entropy, mask, "group", [0, 0, 1, 1]),
             entropy_stats(wild(entropy, float("nan")), mask, "group", [0, 0, 1, 1]))
    assert torch.equal(group[0][0], group[1][0]) and torch.equal(group[0][1], group[1][1])


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_all_zero_mask_gives_zero_loss_and_zero_gradient(name):
    log_prob = torch.randn(2, 3, requires_grad=True)
    loss, metrics = get_policy_loss(name)(torch.randn(2, 3), log_prob, torch.randn(2, 3), torch.zeros(2, 3),
                                          config=PolicyLossConfig(**AEPO_FULL), entropy=torch.rand(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and torch.all(log_prob.grad == 0)
    assert all(value == 0.0 for value in metrics.values())


def test_shape_mismatch_names_the_argument_and_shapes():
    with pytest.raises(ValueError, match=r"advantages has shape \(2, 4\) but response_mask has shape \(2, 3\)"):
        get_policy_loss("ppo")(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"entropy has shape \(3,\)"):
        get_policy_loss("aepo")(torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3),
                                entropy=torch.zeros(3))
    with pytest.raises(ValueError, match=r"response_mask must be \[batch, response_len\]"):
        get_policy_loss("ppo")(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))


@pytest.mark.parametrize("argument", ["old_log_prob", "log_prob", "advantages", "entropy"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_name_the_argument(argument, bad):
    inputs = {"old_log_prob": torch.zeros(1, 3), "log_prob": torch.zeros(1, 3), "advantages": torch.ones(1, 3),
              "entropy": torch.ones(1, 3)}
    inputs[argument][0, 1] = bad
    with pytest.raises(ValueError, match=f"{argument} contains NaN or Inf"):
        get_policy_loss("aepo")(inputs["old_log_prob"], inputs["log_prob"], inputs["advantages"], torch.ones(1, 3),
                                entropy=inputs["entropy"])


def test_registry_lists_valid_names_and_accepts_new_losses():
    from aepo_rl.config import AlgorithmConfig

    assert PolicyLossConfig is AlgorithmConfig
    with pytest.raises(ValueError,
                       match="unknown policy loss 'ppo2'; valid names: aepo, cispo, dapo, gppo, grpo, gspo, ppo"):
        get_policy_loss("ppo2")

    @register_policy_loss("my_reinforce")
    def my_reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     entropy=None, *, entropy_stats=None, index=None):
        return -(advantages * log_prob * response_mask).sum(), {}

    try:
        assert get_policy_loss("my_reinforce") is my_reinforce
        cfg = load_config("aepo", overrides=["algorithm.policy_loss=my_reinforce"])
        assert cfg.algorithm.policy_loss == "my_reinforce"
    finally:
        del POLICY_LOSSES["my_reinforce"]
    with pytest.raises(ConfigError,
                       match=r"algorithm.policy_loss='my_reinforce' is not allowed; choose one of \['aepo', "):
        load_config("aepo", overrides=["algorithm.policy_loss=my_reinforce"])


def test_high_entropy_shares_by_hand():
    """§7.1: 10 trained tokens with H = 0..9 (0.8-quantile 7.2: tokens 8 and 9 are high-entropy) and a
    tool token with H = 100 (mask 0, never counted). Tokens 0-3 and 8 are clipped at the upper bound
    (A > 0, r = 1.5): pg_clipfrac 5/10 over all tokens, 1/2 over the high-entropy ones."""
    from aepo_rl.algorithms import high_entropy_shares

    log_ratio = torch.tensor([[math.log(1.5)] * 4 + [0.0] * 4 + [math.log(1.5), 0.0, math.log(1.5)]])
    mask = torch.tensor([[1.0] * 10 + [0.0]])
    entropy = torch.tensor([[float(i) for i in range(10)] + [100.0]])
    for name in ("ppo", "aepo"):
        flags: dict = {}
        _, metrics = get_policy_loss(name)(-log_ratio, torch.zeros_like(log_ratio), torch.ones_like(log_ratio), mask,
                                           config=PolicyLossConfig(**NO_ENT), entropy=entropy, token_flags=flags)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
        shares = high_entropy_shares(entropy, mask, flags)
        assert shares["actor/pg_clipfrac_high_entropy"] == pytest.approx(0.5)
        assert shares["actor/pg_clipfrac_upper_bound_high_entropy"] == pytest.approx(0.5)
        assert shares["actor/pg_clipfrac_lower_high_entropy"] == 0.0
        assert ("actor/grad_preserved_frac_high_entropy" in shares) == (name == "aepo")


@pytest.mark.parametrize("name", ["ppo", "grpo", "dapo", "gppo", "aepo", "cispo", "gspo"])
def test_every_builtin_loss_hands_back_its_token_flags(name):
    assert POLICY_LOSSES.capabilities(name)["token_flags"]
    flags: dict = {}
    log_ratio = torch.tensor([[0.5, -0.5, 0.0]])
    get_policy_loss(name)(-log_ratio, torch.zeros_like(log_ratio), torch.tensor([[1.0, -1.0, 1.0]]),
                          torch.ones_like(log_ratio), config=PolicyLossConfig(**NO_ENT),
                          entropy=torch.ones_like(log_ratio), token_flags=flags)
    assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower"} <= set(flags)
    assert all(f.dtype == torch.bool and f.shape == log_ratio.shape for f in flags.values())
