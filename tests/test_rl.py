"""The RL loop: training tensors, log-probs, rewards, GiGPO anchors, gradient accumulation, every preset."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from helpers import TINY_RL, VaryingRewardTask, _random_fixed, build_tiny_model, make_traj

from aepo_rl import algorithms
from aepo_rl.config import PRESETS, ConfigError, load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import apply_lora
from aepo_rl.rollout.trajectory import Trajectory
from aepo_rl.train import rl as rl_module
from aepo_rl.train.rl import (
    Batch,
    DataOrder,
    FixedTensors,
    RLTrainer,
    accumulate_gradients,
    anchor_keys,
    batched_logprobs,
    build_optimizer,
    collate,
    last_token_rewards,
    recorded,
    response_logprobs,
)

# ----------------------------------------------------------------------------------------------
# Tensors


def test_collate_builds_right_padded_rows_from_token_ids():
    trajs = [make_traj([5, 6, 7], [10, 11, 12, 13], [1, 0, 0, 1]), make_traj([5], [20, 21], [1, 1])]
    batch = collate(trajs, [0, 1], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 10, 11, 12, 13], [5, 20, 21, 0, 0, 0, 0]]
    assert batch.responses.tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 0, 0, 1], [1, 1, 0, 0]]
    assert batch.prompt_lengths.tolist() == [3, 1]
    assert batch.sequence_lengths.tolist() == [7, 3]
    sub = batch.rows(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[5, 20, 21]]  # trimmed to the rows' longest sequence
    assert sub.responses.shape == (1, 4)  # response width stays the batch's


def test_collate_rejects_a_loss_mask_of_the_wrong_length():
    with pytest.raises(ValueError, match="loss_mask has 1 entries for 2 response tokens"):
        collate([make_traj([1], [2, 3], [1])], [0], pad_token_id=0)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_response_logprobs_equal_a_plain_full_forward(tiny_tokenizer, tiny_model, temperature):
    trajs = [make_traj([3, 4, 5, 6], [7, 8, 9], [1, 1, 1]), make_traj([3, 4], [10, 11, 12, 13, 14], [1, 0, 0, 1, 1])]
    batch = collate(trajs, [0, 1], pad_token_id=tiny_tokenizer.pad_token_id)
    log_probs, entropy = response_logprobs(tiny_model, batch, bf16=False, temperature=temperature)
    for i, traj in enumerate(trajs):
        ids = torch.tensor([traj.prompt_token_ids + traj.response_token_ids])
        logits = tiny_model(input_ids=ids).logits[0].float() / temperature
        p = len(traj.prompt_token_ids)
        expected = torch.log_softmax(logits[p - 1:-1], -1).gather(-1, ids[0, p:, None]).squeeze(-1)
        n = len(traj.response_token_ids)
        torch.testing.assert_close(log_probs[i, :n], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[i, :n], algorithms.entropy_from_logits(logits[p - 1:-1]),
                                   atol=1e-5, rtol=1e-5)


def test_bf16_autocast_log_probs_are_close_to_float32(tiny_tokenizer, tiny_model):
    batch = collate([make_traj([3, 4, 5], [7, 8, 9, 10], [1, 1, 1, 1])], [0], tiny_tokenizer.pad_token_id)
    full, _ = response_logprobs(tiny_model, batch, bf16=False)
    half, _ = response_logprobs(tiny_model, batch, bf16=True)
    assert half.dtype == torch.float32
    assert (full - half).abs().max() < 0.1


# ----------------------------------------------------------------------------------------------
# Rewards and anchors


def test_reward_sits_on_the_last_trained_token():
    mask = torch.tensor([[1., 1., 0., 0.], [1., 0., 1., 0.], [0., 0., 0., 0.]])
    rewards = last_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert rewards.tolist() == [[0, 2, 0, 0], [0, 0, -1, 0], [5, 0, 0, 0]]


def test_gigpo_advantage_uses_the_anchor_keys_of_forked_trajectories():
    a = make_traj([1], [10, 50, 12], [1, 0, 1], rounds=[(0, 1), (2, 3)])
    b = make_traj([1], [10, 50, 13], [1, 0, 1], rounds=[(0, 1), (2, 3)], traj_id=1)
    c = make_traj([1], [11, 50, 13], [1, 0, 1], rounds=[(0, 1), (2, 3)], traj_id=2)
    batch = collate([a, b, c], [0, 0, 0], pad_token_id=0)
    rewards = last_token_rewards(torch.tensor([1.0, 0.0, 0.0]), batch.response_mask)
    keys = anchor_keys([a, b, c], [0, 0, 0], 3)
    cfg = load_config("gigpo").algorithm
    adv, _ = algorithms.get_advantage_estimator("gigpo")(rewards, batch.response_mask, batch.group_index,
                                                         config=cfg, anchor_keys=keys)
    episode = (torch.tensor([1.0, 0.0, 0.0]) - 1 / 3) / (torch.tensor([1.0, 0.0, 0.0]).std() + 1e-6)
    # Round 1 of a and b shares one state: their step advantage is ±1/(std of {1, 0}) apart.
    step_ab = (1.0 - 0.5) / (torch.tensor([1.0, 0.0]).std() + 1e-6)
    assert adv[0, 2].item() == pytest.approx(float(episode[0] + step_ab), rel=1e-5)
    assert adv[1, 2].item() == pytest.approx(float(episode[1] - step_ab), rel=1e-5)
    assert adv[2, 2].item() == pytest.approx(float(episode[2]), rel=1e-5)  # alone in its state: no step term
    # Round 0 acts from the bare prompt, shared by all three: step advantage = episode advantage.
    assert adv[0, 0].item() == pytest.approx(float(2 * episode[0]), rel=1e-5)


# ----------------------------------------------------------------------------------------------
# Data order


def test_data_order_is_a_fresh_seeded_permutation_every_epoch_and_resumes_exactly():
    order = DataOrder(size=5, seed=3)
    first = order.take(3) + order.take(3)  # crosses into epoch 1
    assert sorted(first[:5]) == [0, 1, 2, 3, 4]
    assert (order.epoch, order.cursor) == (1, 1)
    assert first[5] == int(order.permutation(1)[0])
    resumed = DataOrder(size=5, seed=3)
    resumed.load_state_dict(order.state_dict())
    assert resumed.take(7) == order.take(7)
    with pytest.raises(ValueError, match="data order mismatch: the checkpoint was trained on 5 training examples with "
                                         "seed 3, this run has 6 with seed 3; resume with the training data "
                                         "the run used"):
        DataOrder(size=6, seed=3).load_state_dict(order.state_dict())


def _lrs(optimizer, scheduler, steps: int) -> list[float]:
    """The lr of each of ``steps`` optimizer steps."""
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_cosine_schedule_warms_up_then_decays(tiny_model):
    cfg = load_config("aepo", overrides=["trainer.lr_schedule=cosine", "trainer.warmup_steps=2",
                                         "trainer.steps=4", "trainer.lr=1.0"])
    assert _lrs(*build_optimizer(cfg, copy.deepcopy(tiny_model)), 5) == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


def test_constant_schedule_is_constant_without_warm_up_and_linear_with_it(tiny_model):
    cfg = load_config("aepo", overrides=["trainer.lr=1.0", "trainer.steps=3"])
    assert _lrs(*build_optimizer(cfg, copy.deepcopy(tiny_model)), 4) == [1.0] * 4
    cfg.trainer.warmup_steps = 4
    assert _lrs(*build_optimizer(cfg, copy.deepcopy(tiny_model)), 6) == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])


def test_the_schedule_resumes_from_its_state_also_one_saved_before_the_transformers_schedules(tiny_model):
    cfg = load_config("aepo", overrides=["trainer.lr_schedule=cosine", "trainer.warmup_steps=2",
                                         "trainer.steps=6", "trainer.lr=1.0"])
    model = copy.deepcopy(tiny_model)
    optimizer, scheduler = build_optimizer(cfg, model)
    straight = _lrs(optimizer, scheduler, 6)
    optimizer, scheduler = build_optimizer(cfg, model)
    _lrs(optimizer, scheduler, 3)
    resumed_optimizer, resumed = build_optimizer(cfg, model)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert _lrs(resumed_optimizer, resumed, 3) == straight[3:]
    # A checkpoint's scheduler state from a LambdaLR of a plain function (the earlier hand-written schedule)
    old_optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    old = torch.optim.lr_scheduler.LambdaLR(old_optimizer, lambda step: 1.0)
    _lrs(old_optimizer, old, 3)
    resumed_optimizer, resumed = build_optimizer(cfg, model)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(old.state_dict())
    assert _lrs(resumed_optimizer, resumed, 3) == straight[3:]


# ----------------------------------------------------------------------------------------------
# Gradient accumulation


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _accumulated(model, batch, fixed, cfg) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, batch, torch.arange(batch.num_rows), fixed, cfg,
                         algorithms.get_policy_loss(cfg.algorithm.policy_loss))
    return _grads(model)


@pytest.mark.parametrize("preset,mode", [("aepo", "token-mean"), ("grpo", "token-mean"),
                                         ("grpo", "seq-mean-token-mean"), ("dr_grpo", "seq-mean-token-sum-norm")])
def test_gradient_accumulation_equals_the_full_batch_gradient(tiny_tokenizer, tiny_model, preset, mode):
    trajs = [make_traj([3, 4, 5], [7, 8, 9, 10, 11, 12], [1, 1, 0, 0, 1, 1]), make_traj([3], [13, 14], [1, 1]),
             make_traj([3, 4], [15, 16, 17], [1, 1, 1]), make_traj([6, 4, 5, 3], [18], [1])]
    batch = collate(trajs, [0, 0, 1, 1], tiny_tokenizer.pad_token_id)
    fixed = _random_fixed(batch)
    cfg = load_config(preset, overrides={"algorithm.loss_agg_mode": mode, "trainer.micro_batch_size": 4})
    model = copy.deepcopy(tiny_model)
    full = _accumulated(model, batch, fixed, cfg)
    cfg.trainer.micro_batch_size = 1
    micro = _accumulated(model, batch, fixed, cfg)
    for a, b in zip(full, micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    # And it is the gradient of the loss written out over the whole batch in one go.
    model.zero_grad(set_to_none=True)
    log_probs, entropy = response_logprobs(model, batch, bf16=False)
    stats = (algorithms.entropy_stats(fixed.old_entropy, batch.response_mask, "mini-batch")
             if cfg.algorithm.policy_loss == "aepo" else None)
    # (seq-mean-token-sum-norm divides by the trainer's constant T = rollout.max_response_length)
    algo = dataclasses.replace(cfg.algorithm, loss_scale_factor=cfg.rollout.max_response_length)
    loss, _ = algorithms.get_policy_loss(cfg.algorithm.policy_loss)(
        fixed.old_log_probs, log_probs, fixed.advantages, batch.response_mask, loss_agg_mode=mode,
        config=algo, entropy=entropy, entropy_stats=stats)
    loss.backward()
    for a, b in zip(_grads(model), micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def _widened(batch: Batch, extra: int, pad_token_id: int) -> Batch:
    """``batch`` with ``extra`` more padded response columns (mask 0): as if a longer response were in the RL batch."""
    pad = torch.full((batch.num_rows, extra), pad_token_id, dtype=torch.long)
    return dataclasses.replace(batch, responses=torch.cat([batch.responses, pad], 1),
                               response_mask=torch.cat([batch.response_mask, torch.zeros(batch.num_rows, extra)], 1))


def test_dr_grpo_divisor_is_the_response_budget_not_the_longest_response(tiny_tokenizer, tiny_model):
    trajs = [make_traj([3, 4, 5], [7, 8, 9, 10], [1, 1, 0, 1]), make_traj([3], [13, 14], [1, 1])]
    batch = collate(trajs, [0, 0], tiny_tokenizer.pad_token_id)
    cfg = load_config("dr_grpo", overrides={"rollout.max_response_length": 64})
    model = copy.deepcopy(tiny_model)
    fixed = _random_fixed(batch)
    grads = _accumulated(model, batch, fixed, cfg)
    wide = _widened(batch, 5, tiny_tokenizer.pad_token_id)
    pad = torch.zeros(batch.num_rows, 5)
    wide_fixed = FixedTensors(torch.cat([fixed.old_log_probs, pad], 1), torch.cat([fixed.old_entropy, pad], 1),
                              torch.cat([fixed.advantages, pad], 1))
    for a, b in zip(grads, _accumulated(model, wide, wide_fixed, cfg)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    # by hand: Σ_i Σ_t m·L / (2 sequences · 64); doubling the budget halves the gradient
    cfg.algorithm.loss_scale_factor = 128
    for a, b in zip(grads, _accumulated(model, batch, fixed, cfg)):
        torch.testing.assert_close(a, 2 * b, atol=1e-7, rtol=1e-4)


def test_micro_batch_scope_weights_micro_batches_by_sequences_as_the_release(tiny_tokenizer, tiny_model):
    # One sequence per micro-batch: the release's Σ_k (1/B)·token-mean_k is seq-mean-token-mean of the batch.
    trajs = [make_traj([3, 4, 5], [7, 8, 9, 10, 11, 12], [1, 1, 0, 0, 1, 1]), make_traj([3], [13, 14], [1, 1]),
             make_traj([3, 4], [15, 16, 17], [1, 1, 1])]
    batch = collate(trajs, [0, 0, 1], tiny_tokenizer.pad_token_id)
    fixed = _random_fixed(batch)
    model = copy.deepcopy(tiny_model)
    release = load_config("grpo", overrides={"algorithm.loss_agg_scope": "micro-batch", "trainer.micro_batch_size": 1})
    per_sequence = load_config("grpo", overrides={"algorithm.loss_agg_mode": "seq-mean-token-mean"})
    global_mean = load_config("grpo")
    got = _accumulated(model, batch, fixed, release)
    for a, b in zip(got, _accumulated(model, batch, fixed, per_sequence)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(got, _accumulated(model, batch, fixed, global_mean)))
    assert load_config("official").algorithm.loss_agg_scope == "micro-batch"


def test_masked_tokens_get_no_gradient(tiny_tokenizer, tiny_model):
    """Advantages and old log-probs at mask-0 (tool result) positions change nothing."""
    trajs = [make_traj([3, 4], [7, 8, 9, 10, 11], [1, 0, 0, 1, 1]), make_traj([3], [12, 13, 14], [1, 1, 0])]
    batch = collate(trajs, [0, 0], tiny_tokenizer.pad_token_id)
    cfg = load_config("aepo")
    model = copy.deepcopy(tiny_model)
    fixed = _random_fixed(batch)
    reference = _accumulated(model, batch, fixed, cfg)
    masked = batch.response_mask == 0
    garbage = FixedTensors(old_log_probs=torch.where(masked, -50.0, fixed.old_log_probs),
                           old_entropy=torch.where(masked, 1e3, fixed.old_entropy),
                           advantages=torch.where(masked, 1e4, fixed.advantages))
    for a, b in zip(reference, _accumulated(model, batch, garbage, cfg)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # With every token masked there is nothing to learn: the gradient is exactly zero.
    batch.response_mask.zero_()
    assert all(float(g.abs().max()) == 0.0 for g in _accumulated(model, batch, fixed, cfg))


# ----------------------------------------------------------------------------------------------
# Every preset: two RL steps with the tiny model and a small fake task


STEP_METRICS = ["actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy",
                "actor/grad_norm", "actor/lr", "critic/score/mean", "critic/advantages/mean",
                "response_length/mean", "num_turns/mean", "tool_call_counts/mean", "timing_s/gen",
                "timing_s/update", "timing_s/step", "rollout/distinct_per_group", "rollout/branches_per_prompt",
                "train/tokens_per_s", "rollout/informative_group_frac", "rollout/entropy_leverage",
                "rollout/consecutive_branch_mean", "actor/entropy_unique", "actor/pg_clipfrac_high_entropy"]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_runs_two_rl_steps(tiny_tokenizer, preset):
    shaping = {"algorithm.overlong_buffer_len": 8} if preset == "dapo" else {}  # window inside the 24-token budget
    cfg = load_config(preset, overrides={**TINY_RL, **shaping})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    for _ in range(2):
        metrics = trainer.step()
    assert trainer.global_step == 2
    expected = STEP_METRICS + (["actor/entropy_adv_scale/mean", "actor/grad_preserved_frac"]
                               if cfg.algorithm.policy_loss == "aepo" else [])
    expected += ["dynamic_sampling/kept_frac"] if cfg.algorithm.dynamic_sampling else []
    missing = [k for k in expected if k not in metrics]
    assert not missing, f"{preset}: missing metrics {missing}"
    assert not any(k.startswith("perf/max_memory") for k in metrics)  # CUDA memory, logged on a GPU only
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters())), f"{preset}: no update"
    assert len(trainer.last_rollout) == 4 and "score" in trainer.last_rollout[0]


def test_the_trainer_owns_the_rollout_state_and_saves_it(tiny_tokenizer, monkeypatch):
    """The §1.4 release-quirk baselines live in the trainer's rollout state, passed to every rollout."""
    passed = []
    original = rl_module.run_rollout

    def spy(*args, **kwargs):
        passed.append(kwargs["state"])
        return original(*args, **kwargs)

    monkeypatch.setattr(rl_module, "run_rollout", spy)
    cfg = load_config("official", overrides=TINY_RL)
    model = build_tiny_model(tiny_tokenizer, seed=1)
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    trainer.step()
    trainer.step()
    assert len(passed) == 2 and all(state is trainer.rollout_state for state in passed)
    trainer.rollout_state.slot_baselines[3] = 0.25
    resumed = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    resumed.load_state_dict(trainer.state_dict())
    assert resumed.rollout_state == trainer.rollout_state and resumed.rollout_state.slot_baselines[3] == 0.25


def test_a_registered_loss_and_estimator_train_through_the_config(tiny_tokenizer):
    calls = []

    @algorithms.register_advantage_estimator("my_score")
    def my_score(token_level_rewards, response_mask, index, config=None, **_):
        scores = token_level_rewards.sum(-1, keepdim=True) * response_mask
        return scores, scores

    @algorithms.register_policy_loss("my_reinforce")
    def my_reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     entropy=None, *, entropy_stats=None, index=None):
        calls.append(loss_agg_mode)
        return -algorithms.agg_loss(advantages * log_prob, response_mask, loss_agg_mode), {}

    try:
        cfg = load_config("aepo", overrides={**TINY_RL, "algorithm.policy_loss": "my_reinforce",
                                             "algorithm.adv_estimator": "my_score"})
        model = build_tiny_model(tiny_tokenizer, seed=1)
        before = [p.detach().clone() for p in model.parameters()]
        trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
        assert math.isfinite(trainer.step()["actor/grad_norm"])
    finally:
        del algorithms.POLICY_LOSSES["my_reinforce"], algorithms.ADVANTAGE_ESTIMATORS["my_score"]
    assert calls and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_overlong_window_longer_than_the_budget_is_a_config_error(tiny_tokenizer, tiny_model):
    cfg = load_config("dapo", overrides=TINY_RL)
    with pytest.raises(ConfigError, match="overlong_buffer_len=64 must be <= rollout.max_response_length=24"):
        RLTrainer(cfg, tiny_model, tiny_tokenizer, VaryingRewardTask(), HFEngine(tiny_model, tiny_tokenizer))


@pytest.mark.parametrize("overrides", [{"algorithm.use_kl_loss": True},
                                       {"algorithm.use_kl_in_reward": True,
                                        "algorithm.adv_estimator": "reinforce_plus_plus"},
                                       {"algorithm.use_kl_in_reward": True},
                                       {"algorithm.entropy_coeff": 0.01, "trainer.ppo_epochs": 2,
                                        "trainer.bf16": True, "algorithm.entropy_adv_scope": "group"}])
def test_kl_entropy_bonus_epochs_and_bf16_options_run(tiny_tokenizer, overrides):
    cfg = load_config("aepo", overrides={**TINY_RL, "trainer.mini_batch_size": 2, **overrides})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    metrics = trainer.step()
    assert all(math.isfinite(v) for v in metrics.values())
    assert (trainer.ref_model is not None) == bool(cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward)
    if cfg.algorithm.use_kl_loss:
        # One optimizer step per RL step, taken after the loss: π_θ = π_ref while it is computed.
        assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    if cfg.algorithm.use_kl_in_reward:
        assert "actor/reward_kl_penalty" in metrics


@pytest.mark.parametrize("scope", ["mini-batch", "group"])
def test_entropy_stats_from_the_engines_recorded_entropies_equal_a_forward_pass(tiny_tokenizer, scope):
    """The HF engine shares the model, so its recorded entropies are H_old (§2.2): no extra pass needed."""
    cfg = load_config("aepo", overrides={**TINY_RL, "rollout.n": 3, "algorithm.entropy_adv_scope": scope})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    groups, _ = trainer.generate()
    trajectories = [t for g in groups for t in g.trajectories]
    group_index = [i for i, g in enumerate(groups) for _ in g.trajectories]
    batch = collate(trajectories, group_index, tiny_tokenizer.pad_token_id)
    engine_entropy = recorded(trajectories, "entropies", batch.response_mask)
    _, forward_entropy = batched_logprobs(model, batch, torch.arange(batch.num_rows), 2, bf16=False)
    mask = batch.response_mask
    torch.testing.assert_close(engine_entropy * mask, forward_entropy * mask, atol=1e-4, rtol=0)
    for ours, reference in zip(algorithms.entropy_stats(engine_entropy, mask, scope, index=batch.group_index),
                               algorithms.entropy_stats(forward_entropy, mask, scope, index=batch.group_index)):
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=0)
    assert float(algorithms.entropy_stats(engine_entropy, mask, scope, index=batch.group_index)[1].min()) != 1.0


@pytest.mark.parametrize("tempered", [False, True])
def test_tempered_logprobs_use_the_rollout_temperature_everywhere(tiny_tokenizer, monkeypatch, tempered):
    """verl's actor (official): π_old, π_ref, π_θ and H_old all from logits / rollout.temperature; the
    engine's untempered entropies then cannot stand in for H_old, so the old pass covers every row."""
    calls = {"old": [], "new": []}
    original_batched, original_response = rl_module.batched_logprobs, rl_module.response_logprobs

    def batched(model, batch, rows, micro_batch_size, bf16, temperature=1.0, **kwargs):
        calls["old"].append((len(rows), temperature))
        return original_batched(model, batch, rows, micro_batch_size, bf16, temperature, **kwargs)

    def response(model, batch, **kwargs):
        calls["new"].append(kwargs.get("temperature", 1.0))
        return original_response(model, batch, **kwargs)

    monkeypatch.setattr(rl_module, "batched_logprobs", batched)
    monkeypatch.setattr(rl_module, "response_logprobs", response)
    cfg = load_config("aepo", overrides={**TINY_RL, "rollout.temperature": 0.5, "algorithm.use_kl_loss": True,
                                         "algorithm.tempered_logprobs": tempered})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    metrics = trainer.step()
    expected = 0.5 if tempered else 1.0
    assert {t for _, t in calls["old"]} == {expected}  # old-log-prob pass and reference pass
    assert calls["new"] and set(calls["new"]) == {expected}  # training forwards
    old_pass_rows, ref_rows = calls["old"][0][0], calls["old"][1][0]
    # untempered: H_old is the engine's record, so the first mini-batch's own forward serves as π_old
    assert ref_rows == 4 and old_pass_rows == (4 if tempered else 2)
    assert ("rollout/logprob_abs_diff" in metrics) == (not tempered)


def test_the_old_and_reference_passes_skip_the_entropies_they_would_discard(tiny_tokenizer, monkeypatch):
    """With the HF engine, H_old is the engine's record and π_ref's entropy is never used: the no-grad
    passes compute log-probs only (a full-vocabulary softmax less per token), and the step trains the
    same weights, bit for bit, as when they computed the entropies too."""
    cfg = load_config("aepo", overrides={**TINY_RL, "algorithm.use_kl_loss": True})
    original_entropy, original_batched = algorithms.entropy_from_logits, rl_module.batched_logprobs

    def step(always_entropy: bool) -> tuple[dict, list[int]]:
        rows_with_entropy: list[int] = []

        def entropy(logits, *args, **kwargs):
            rows_with_entropy.append(logits.shape[0])
            return original_entropy(logits, *args, **kwargs)

        def batched(*args, **kwargs):
            return original_batched(*args, **{**kwargs, "with_entropy": True} if always_entropy else kwargs)

        monkeypatch.setattr(algorithms, "entropy_from_logits", entropy)
        monkeypatch.setattr(rl_module, "batched_logprobs", batched)
        model = build_tiny_model(tiny_tokenizer, seed=1)
        trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
        groups, _ = trainer.generate()
        rows_with_entropy.clear()
        trainer.update(groups)
        return {k: v.clone() for k, v in model.state_dict().items()}, rows_with_entropy

    weights, rows = step(always_entropy=False)
    reference_weights, reference_rows = step(always_entropy=True)
    sequences = cfg.trainer.batch_size * cfg.rollout.n
    assert sum(rows) == sequences * cfg.trainer.ppo_epochs  # the training forwards only
    assert sum(reference_rows) > sum(rows)  # the old and reference passes' entropies, now skipped
    assert weights.keys() == reference_weights.keys()
    assert all(torch.equal(weights[k], reference_weights[k]) for k in weights)


def test_recorded_values_must_cover_every_response_token():
    traj = make_traj([3], [7, 8, 9], [1, 1, 1])
    traj.entropies = [0.5, 0.5]
    with pytest.raises(ValueError, match="p/0: entropies has 2 entries for 3 response tokens"):
        recorded([traj], "entropies", torch.zeros(1, 3))


def test_an_rl_step_with_lora_changes_only_the_adapter_weights(tiny_tokenizer):
    cfg = load_config("aepo", overrides={**TINY_RL, "model.lora_rank": 2,
                                         "model.lora_target_modules": ["q_proj", "v_proj"]})
    model = apply_lora(build_tiny_model(tiny_tokenizer, seed=1), cfg.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
    trainer.step()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all("lora_" in k for k in changed), sorted(changed)
    assert {k for k in before if "lora_B" in k} <= changed  # B starts at 0 and must move


def test_informative_group_frac_counts_groups_with_distinct_scores():
    """§2.1: a group whose scores are all equal has zero advantage everywhere; the share of the others."""
    example = VaryingRewardTask().examples("train")[0]
    trajs = [Trajectory(prompt_id="q0", traj_id=i, parent_id=None, fork_token_index=None, prompt_token_ids=[1],
                        response_token_ids=[i + 2]) for i in range(2)]
    groups = [rl_module.ScoredGroup(example, trajs, scores)
              for scores in ([1.0, 1.0], [0.0, 1.0], [-1.0, -1.0], [0.5, 0.2])]
    assert RLTrainer.rollout_metrics(groups)["rollout/informative_group_frac"] == 0.5


@pytest.mark.parametrize("preset", ["aepo", "grpo"])
def test_high_entropy_clip_shares_are_over_the_whole_mini_batch(tiny_tokenizer, tiny_model, preset):
    """§7.1: `<metric>_high_entropy` = share among the mini-batch's masked tokens with H ≥ its 0.8-quantile,
    whatever the micro-batch packing, equal to the loss's flags over the whole batch in one forward."""
    trajs = [make_traj([3, 4, 5], [7, 8, 9, 10, 11, 12], [1, 1, 0, 0, 1, 1]), make_traj([3], [13, 14], [1, 1]),
             make_traj([3, 4], [15, 16, 17], [1, 1, 1]), make_traj([6, 4, 5, 3], [18, 19, 20, 21], [1, 1, 1, 1])]
    batch = collate(trajs, [0, 0, 1, 1], tiny_tokenizer.pad_token_id)
    fixed = _random_fixed(batch)
    model = copy.deepcopy(tiny_model)
    cfg = load_config(preset, overrides={"trainer.micro_batch_size": 1})
    loss_fn = algorithms.get_policy_loss(cfg.algorithm.policy_loss)
    rows = torch.arange(batch.num_rows)
    per_row = accumulate_gradients(model, batch, rows, fixed, cfg, loss_fn)
    cfg.trainer.micro_batch_size = 4
    whole = accumulate_gradients(model, batch, rows, fixed, cfg, loss_fn)
    names = ["actor/pg_clipfrac_high_entropy", "actor/pg_clipfrac_lower_high_entropy",
             "actor/pg_clipfrac_upper_bound_high_entropy", "actor/pg_clipfrac_lower_bound_high_entropy"]
    names += ["actor/grad_preserved_frac_high_entropy"] if preset == "aepo" else []
    assert sorted(k for k in whole if k.endswith("_high_entropy")) == sorted(names)
    with torch.no_grad():
        log_probs, entropy = response_logprobs(model, batch, bf16=False)
    flags: dict = {}
    algo = dataclasses.replace(cfg.algorithm, loss_scale_factor=cfg.rollout.max_response_length)
    stats = (algorithms.entropy_stats(fixed.old_entropy, batch.response_mask, "mini-batch")
             if preset == "aepo" else None)
    loss_fn(fixed.old_log_probs, log_probs, fixed.advantages, batch.response_mask, config=algo, entropy=entropy,
            entropy_stats=stats, token_flags=flags)
    expected = algorithms.high_entropy_shares(entropy, batch.response_mask, flags)
    high = entropy >= torch.quantile(entropy[batch.response_mask.bool()], 0.8)
    assert int((high & batch.response_mask.bool()).sum()) >= 3
    for name in names:
        assert per_row[name] == pytest.approx(expected[name], abs=1e-6)
        assert whole[name] == pytest.approx(expected[name], abs=1e-6)
    assert 0 < expected["actor/pg_clipfrac_high_entropy"] <= 1


def test_entropy_unique_counts_a_forks_copied_prefix_once(tiny_tokenizer, tiny_model):
    """§7.1: actor/entropy is verl's masked mean over rows (the fork's copied prefix counted in both rows);
    actor/entropy_unique counts each tree token once: the parent's tokens, then the fork's own after
    fork_token_index. Without forks the two are equal."""
    parent = make_traj([3, 4], [7, 8, 9, 10, 11, 12], [1, 1, 0, 0, 1, 1])
    child = dataclasses.replace(make_traj([3, 4], [7, 8, 9, 10, 13, 14, 15], [1, 1, 0, 0, 1, 1, 1]), traj_id=1,
                                parent_id=0, fork_token_index=4)
    other = make_traj([5], [16, 17, 18], [1, 1, 1])
    batch = collate([parent, child, other], [0, 0, 1], tiny_tokenizer.pad_token_id)
    assert batch.shared_prefix.tolist() == [0, 4, 0]
    cfg = load_config("grpo", overrides={"trainer.micro_batch_size": 1})
    model = copy.deepcopy(tiny_model)
    metrics = accumulate_gradients(model, batch, torch.arange(3), _random_fixed(batch), cfg,
                                   algorithms.get_policy_loss("grpo"))
    with torch.no_grad():
        _, entropy = response_logprobs(model, batch, bf16=False)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(entropy[0, :2], entropy[1, :2])  # the same prefix, the same entropies
    own = mask.clone()
    own[1, :4] = False
    assert metrics["actor/entropy_unique"] == pytest.approx(float(entropy[own].mean()), abs=2e-6)
    assert metrics["actor/entropy"] == pytest.approx(float(entropy[mask].mean()), abs=2e-6)  # token-mean shares
    assert abs(float(entropy[own].mean()) - float(entropy[mask].mean())) > 2e-5  # the two quantities differ here
    chains = collate([parent, other], [0, 1], tiny_tokenizer.pad_token_id)
    metrics = accumulate_gradients(model, chains, torch.arange(2), _random_fixed(chains), cfg,
                                   algorithms.get_policy_loss("grpo"))
    assert metrics["actor/entropy_unique"] == pytest.approx(metrics["actor/entropy"], abs=2e-6)
