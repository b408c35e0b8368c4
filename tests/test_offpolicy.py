"""Staying on-policy: behaviour log-probs on the batch, Rollout Correction (§2.11), the target-KL guard and the
run's warnings (docs/training.md "Staying on-policy")."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch
from fakes import FakeEngine
from helpers import (
    TINY_RL,
    ScriptedUniforms,
    VaryingRewardTask,
    _random_fixed,
    build_tiny_model,
    calls_then_answer,
    make_traj,
    tree_cfg,
    tree_prompts,
    tree_tools,
)

from aepo_rl import algorithms, registry
from aepo_rl.algorithms import rollout_correction as rc
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.rollout.tree import run_rollout
from aepo_rl.train.health import RunHealth
from aepo_rl.train.logger import RunLogger
from aepo_rl.train.pipeline import check_rl_engine
from aepo_rl.train.rl import FixedTensors, RLTrainer, accumulate_gradients, collate

# ----------------------------------------------------------------------------------------------
# The math (verl parity: tests/test_verl_rollout_correction.py)


def _mask():
    return torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.float32)


def test_token_weights_are_truncated_ratios_zero_off_the_mask():
    log_ratio = torch.log(torch.tensor([[0.5, 3.0, 9.0, 1.5, 1.0]] * 3))
    weights, metrics = rc.is_weights(log_ratio, _mask(), "token", "2.0")
    expected = torch.tensor([[0.5, 2.0, 0.0, 1.5, 0.0], [0.5, 2.0, 2.0, 1.5, 1.0], [0.0] * 5])
    torch.testing.assert_close(weights, expected)
    assert float(metrics["rollout_is_ratio_fraction_high"]) == pytest.approx(3 / 8)  # 3.0, 3.0, 9.0 of 8 tokens


def test_sequence_weight_is_the_rows_product_and_icepop_zeroes_outside_the_range():
    log_ratio = torch.log(torch.tensor([[1.2, 1.5, 99.0, 1.1, 1.0], [0.9, 1.0, 1.0, 1.0, 1.0], [1.0] * 5]))
    weights, _ = rc.is_weights(log_ratio, _mask(), "sequence", "5.0")
    assert weights[0, 0] == pytest.approx(1.2 * 1.5 * 1.1) and weights[0, 2] == 0  # the masked 99 is not in it
    assert weights[1].tolist() == pytest.approx([0.9] * 5)
    icepop, metrics = rc.is_weights(log_ratio, _mask(), "sequence", "0.95_1.5")
    assert icepop[0].sum() == 0 and icepop[1].tolist() == pytest.approx([0.0] * 5)  # 1.98 > 1.5, 0.9 < 0.95
    normalized, _ = rc.is_weights(log_ratio, _mask(), "token", "2.0", batch_normalize=True)
    assert float(normalized[_mask().bool()].mean()) == pytest.approx(1.0)


def test_rejection_drops_tokens_or_whole_rows_outside_their_bounds():
    log_ratio = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0, 0.0], [0.0] * 5])
    mask, metrics = rc.rejection_mask(log_ratio, _mask(), "token_k1", "0.5_2.0")  # keeps |δ| <= log 2
    assert mask[0].tolist() == [1, 0, 0, 1, 0] and mask[1].tolist() == [1] * 5
    assert float(metrics["rollout_rs_masked_fraction"]) == pytest.approx(1 / 8)
    mask, _ = rc.rejection_mask(log_ratio, _mask(), "seq_mean_k3,token_k2", "0.05,10")  # k3(1) = e − 2 ≈ 0.72
    assert mask[0].tolist() == [0] * 5 and mask[1].tolist() == [1] * 5


def test_mismatch_metrics_are_zero_when_the_policies_agree():
    logp = -torch.rand(3, 5)
    metrics = rc.to_floats(rc.mismatch_metrics(logp, logp.clone(), _mask()))
    for key in ("kl", "k3_kl", "log_ppl_diff", "chi2_token", "chi2_seq"):
        assert metrics[key] == pytest.approx(0.0, abs=1e-6), key
    shifted = rc.to_floats(rc.mismatch_metrics(logp, logp - 0.1, _mask()))  # π_rollout uniformly less likely
    assert shifted["kl"] == pytest.approx(-0.1, abs=1e-6)
    assert shifted["k3_kl"] == pytest.approx(math.exp(0.1) - 1.1, abs=1e-6)


@pytest.mark.parametrize("override,key", [
    ("algorithm.rollout_correction.rollout_rs=token_k9", "rollout_rs"),
    ("algorithm.rollout_correction.rollout_rs=seq_max_k2", "rollout_rs_threshold"),
    ("algorithm.rollout_correction.rollout_is_threshold=0", "rollout_is_threshold"),
    ("algorithm.rollout_correction.rollout_is_threshold=3_2", "rollout_is_threshold"),
    ("algorithm.rollout_correction.rollout_is=tokens", "rollout_is"),
    ("algorithm.rollout_correction.loss_type=reinforce", "loss_type"),
    ("trainer.target_kl=-0.1", "trainer.target_kl"),
    ("trainer.warn_clipfrac=2", "trainer.warn_clipfrac"),
])
def test_bad_settings_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config("aepo", overrides=[override])


def test_a_correction_needs_comparable_log_probs_and_an_engine_that_records_them(tiny_tokenizer):
    with pytest.raises(ConfigError, match="tempered_logprobs"):
        load_config("aepo", overrides=["algorithm.rollout_correction.bypass_mode=true",
                                       "algorithm.tempered_logprobs=true", "rollout.temperature=0.7"])
    name = "test_no_logprobs_engine"
    registry.register_engine(name, shares_weights=True, entropies=("surprisal",))(lambda cfg, model, tok: None)
    try:
        cfg = load_config("aepo", overrides=[f"rollout.engine={name}", "rollout.entropy_measure=surprisal",
                                             "algorithm.rollout_correction.rollout_is=token"])
        with pytest.raises(ConfigError, match="behaviour_logprobs"):
            check_rl_engine(cfg)
        cfg.algorithm.rollout_correction.rollout_is = None
        check_rl_engine(cfg)  # without a correction the engine is fine
    finally:
        del registry.ENGINES[name]  # the registry is the process's: leave it as it was


# ----------------------------------------------------------------------------------------------
# Behaviour log-probs on the batch


class DistinctLogProbs(FakeEngine):
    """The tree tests' scripted engine, with a different log-prob on every generated token."""

    def generate(self, seq_ids, params, max_new_tokens):
        out, first = [], self.decode_tokens
        for seg in super().generate(seq_ids, params, max_new_tokens):
            out.append(dataclasses.replace(seg, logprobs=[-0.001 * (first + k + 1) for k in range(len(seg.token_ids))]))
            first += len(seg.token_ids)
        return out


def test_rollout_log_probs_are_token_aligned_and_a_forks_prefix_carries_its_parents(tiny_tokenizer):
    engine = DistinctLogProbs(tiny_tokenizer, calls_then_answer(3))
    result = run_rollout(engine, tree_prompts(tiny_tokenizer), tree_tools(), tree_cfg(penalty_scope="path"),
                         rng=ScriptedUniforms([0.9, 0.2, 0.9, 0.52]))
    trajs = result.groups[0]
    forks = [t for t in trajs if t.parent_id is not None]
    assert len(forks) == 3
    batch = collate(trajs, [0] * len(trajs), tiny_tokenizer.pad_token_id)
    for i, traj in enumerate(trajs):
        n, mask = len(traj.response_token_ids), torch.tensor(traj.loss_mask, dtype=torch.float32)
        assert 0 < mask.sum() < n  # model tokens and tool results
        torch.testing.assert_close(batch.rollout_log_probs[i, :n], torch.tensor(traj.logprobs) * mask)
        assert (batch.rollout_log_probs[i, :n][mask > 0] < 0).all()  # every model token has its own
        assert batch.rollout_log_probs[i, :n][mask == 0].abs().sum() == 0  # tool results: none
        assert batch.rollout_log_probs[i, n:].abs().sum() == 0
    for child in forks:
        k, p, point = trajs.index(child), child.parent_id, child.fork_token_index
        torch.testing.assert_close(batch.rollout_log_probs[k, :point], batch.rollout_log_probs[p, :point])
        assert not torch.equal(batch.rollout_log_probs[k, point:], batch.rollout_log_probs[p, point:])


def test_the_hf_engines_log_probs_match_pi_old_to_rounding(tiny_tokenizer):
    """The HF engine samples with the trainer's own weights: the mismatch metrics are ~0 every step."""
    trainer = _trainer(tiny_tokenizer)
    metrics = trainer.step()
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(0.0, abs=1e-8)
    assert abs(metrics["rollout_corr/kl"]) < 1e-5 and abs(metrics["rollout_corr/chi2_token"]) < 1e-4


# ----------------------------------------------------------------------------------------------
# The correction in the update


def test_is_weights_scale_each_tokens_policy_gradient(tiny_tokenizer, tiny_model):
    """Decoupled IS (§2.11): the loss is agg(w ⊙ L); with w = 2 on one row and 0 on the other, the gradient
    is twice the first row's alone."""
    trajs = [make_traj([3, 4], [7, 8, 9], [1, 1, 1]), make_traj([5], [10, 11, 12], [1, 0, 1])]
    batch = collate(trajs, [0, 1], tiny_tokenizer.pad_token_id)
    cfg = load_config("grpo", overrides={"algorithm.loss_agg_mode": "seq-mean-token-mean",
                                         "trainer.micro_batch_size": 2,
                                         "algorithm.rollout_correction.rollout_is": "token"})
    fixed = _random_fixed(batch)
    model = copy.deepcopy(tiny_model)

    def grads(weights):
        model.zero_grad(set_to_none=True)
        f = FixedTensors(fixed.old_log_probs, fixed.old_entropy, fixed.advantages, is_weights=weights)
        accumulate_gradients(model, batch, torch.arange(2), f, cfg, algorithms.get_policy_loss("grpo"))
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    weighted = grads(torch.tensor([[2.0] * 3, [0.0] * 3]))
    first_only = grads(torch.tensor([[1.0] * 3, [0.0] * 3]))
    torch.testing.assert_close(weighted, 2 * first_only)
    assert first_only.abs().sum() > 0


def _trainer(tiny_tokenizer, **overrides):
    cfg = load_config("aepo", overrides={**TINY_RL, **overrides})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    return RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))


def test_bypass_mode_takes_the_engines_log_probs_as_pi_old_without_a_forward(tiny_tokenizer, monkeypatch):
    from aepo_rl.train import rl as rl_module

    trainer = _trainer(tiny_tokenizer, **{"algorithm.rollout_correction.bypass_mode": True,
                                          "algorithm.rollout_correction.rollout_rs": "token_k1",
                                          "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"})
    passes = []
    original = rl_module.batched_logprobs
    monkeypatch.setattr(rl_module, "batched_logprobs", lambda model, batch, rows, *a, **k: (
        passes.append(len(rows)), original(model, batch, rows, *a, **k))[1])
    seen = {}
    policy_loss = trainer.policy_loss

    def spy(old, new, *args, **kwargs):
        seen.setdefault("old", []).append(old.detach().clone())
        return policy_loss(old, new, *args, **kwargs)

    trainer.policy_loss = spy
    groups, _ = trainer.generate()
    metrics = trainer.update(groups)
    assert passes == [0]  # the HF engine records H_old too: no forward before the update
    batch = collate([t for g in groups for t in g.trajectories], [0] * 4, tiny_tokenizer.pad_token_id)
    assert torch.cat([o.flatten() for o in seen["old"]]).abs().sum() > 0
    rows = sorted(torch.cat([o for o in seen["old"]]).sum(-1).tolist())
    assert rows == pytest.approx(sorted(batch.rollout_log_probs.sum(-1).tolist()), abs=1e-5)
    for key in ("rollout_corr/k3_kl", "rollout_corr/rollout_rs_masked_fraction", "actor/ppo_kl"):
        assert key in metrics and math.isfinite(metrics[key]), key


def test_decoupled_correction_logs_verls_metrics_and_rejects_tokens(tiny_tokenizer, monkeypatch):
    """A rollout engine whose log-probs are off by +1 nat on every other token: token_k1 rejection with
    bounds [1/2, 2] drops exactly those, and the IS weights of the rest are 1."""
    trainer = _trainer(tiny_tokenizer, **{"algorithm.rollout_correction.rollout_is": "token",
                                          "algorithm.rollout_correction.rollout_rs": "token_k1",
                                          "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"})
    groups, _ = trainer.generate()
    for g in groups:
        for t in g.trajectories:
            t.logprobs = [lp + (1.0 if j % 2 else 0.0) for j, lp in enumerate(t.logprobs)]
    seen = {}
    policy_loss = trainer.policy_loss

    def spy(old, new, adv, mask, *args, **kwargs):
        seen.setdefault("mask", []).append(mask.clone())
        return policy_loss(old, new, adv, mask, *args, **kwargs)

    trainer.policy_loss = spy
    metrics = trainer.update(groups)
    trained = torch.cat([m.flatten() for m in seen["mask"]])
    assert trained.sum() > 0
    odd = torch.cat([(torch.arange(m.shape[1]) % 2 == 1).expand_as(m).flatten() for m in seen["mask"]])
    assert trained[odd].sum() == 0  # every token the engine misjudged is rejected
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] > 0.3
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(1.0, abs=1e-4)  # the kept tokens: w = 1
    assert metrics["rollout_corr/kl"] > 0.3  # π_rollout is the more confident one on half the tokens


# ----------------------------------------------------------------------------------------------
# What the engine records: rollout.logprobs_mode (vLLM's names)


def _filtered(logits, temperature, top_k=0, top_p=1.0):
    """The tempered, top-k then top-p filtered distribution, renormalised, written out one row at a time."""
    out = []
    for row in (logits / temperature).softmax(-1):
        order = row.argsort(descending=True).tolist()
        kept = order[:top_k] if top_k else order
        if top_p < 1:
            mass = row[kept] / row[kept].sum()
            n = int((mass.cumsum(0) - mass < top_p).sum())
            kept = kept[:n]
        q = torch.zeros_like(row)
        q[kept] = row[kept] / row[kept].sum()
        out.append(q)
    return torch.stack(out)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (6, 1.0), (0, 0.6), (8, 0.7)])
def test_processed_log_probs_are_those_of_the_renormalised_distribution_drawn_from(top_k, top_p):
    from aepo_rl.engines.base import SamplingParams
    from aepo_rl.engines.sampling import sample

    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(0)) * 2
    logprobs = logits.log_softmax(-1)
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    tokens, processed = sample(logprobs, logprobs.exp(), params, torch.Generator().manual_seed(1),
                               logprobs_mode="processed_logprobs")
    raw_tokens, raw = sample(logprobs, logprobs.exp(), params, torch.Generator().manual_seed(1))
    assert torch.equal(tokens, raw_tokens)  # the mode changes what is recorded, never what is drawn
    q = _filtered(logits, 0.7, top_k, top_p)
    assert (q.gather(-1, tokens[:, None]) > 0).all()
    torch.testing.assert_close(processed, q.gather(-1, tokens[:, None]).squeeze(-1).log(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(raw, logprobs.gather(-1, tokens[:, None]).squeeze(-1))
    if top_k == 0 and top_p == 1:  # temperature alone: log softmax(logits / T) at the token
        torch.testing.assert_close(processed, (logits / 0.7).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    else:  # truncation renormalises: the kept tokens gain probability
        assert (processed > (logits / 0.7).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1) - 1e-6).all()
    greedy, greedy_lp = sample(logprobs, logprobs.exp(), SamplingParams(greedy=True), None,
                               logprobs_mode="processed_logprobs")
    torch.testing.assert_close(greedy_lp, logprobs.max(-1).values)  # greedy: temperature 1, as vLLM's greedy path


@pytest.mark.parametrize("cuda_graphs", ["off", "on"])  # the dynamic and the static decode path
def test_the_hf_engine_records_log_softmax_of_logits_over_t_at_the_sampled_token(tiny_tokenizer, tiny_model,
                                                                                cuda_graphs):
    from aepo_rl.engines.base import SamplingParams

    prompt = tiny_tokenizer("Velmora question 3?")["input_ids"]
    runs = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        engine = HFEngine(tiny_model, tiny_tokenizer, seed=4, cuda_graphs=cuda_graphs, logprobs_mode=mode)
        seqs = [engine.add_sequence(prompt) for _ in range(3)]
        runs[mode] = engine.generate(seqs, SamplingParams(temperature=0.7, top_k=12), [10, 10, 10])
    for raw, processed in zip(runs["raw_logprobs"], runs["processed_logprobs"]):
        assert raw.token_ids == processed.token_ids and len(raw.token_ids) > 0
        assert raw.entropies == pytest.approx(processed.entropies)  # the statistics stay the untempered policy's
        ids = torch.tensor([prompt + raw.token_ids])
        with torch.no_grad():
            logits = tiny_model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
        tokens = torch.tensor(raw.token_ids)[:, None]
        torch.testing.assert_close(torch.tensor(raw.logprobs), logits.log_softmax(-1).gather(-1, tokens).squeeze(-1),
                                   atol=1e-4, rtol=1e-4)
        expected = _filtered(logits, 0.7, top_k=12).gather(-1, tokens).squeeze(-1).log()
        torch.testing.assert_close(torch.tensor(processed.logprobs), expected, atol=1e-4, rtol=1e-4)
        assert all(p > r for p, r in zip(processed.logprobs, raw.logprobs))  # T < 1 and top-k favour the drawn tokens


def _trainer_for(tiny_tokenizer, sharpen: float = 1.0, **overrides):
    """A trainer whose engine is built from the config (``rollout.logprobs_mode``); ``sharpen`` scales the
    final norm, hence the logits (the random tiny model is near uniform: tempering it changes little)."""
    from aepo_rl.engines import build_engine

    cfg = load_config("aepo", overrides={**TINY_RL, **overrides})
    model = build_tiny_model(tiny_tokenizer, seed=1)
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpen)
    return RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), build_engine(cfg, model, tiny_tokenizer))


def _exact_kl(model, batch, temperature):
    """[B, R] Σ_v q_v (log q_v − log p_v) at each response position, q = softmax(logits / T), p = softmax(logits)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits.float()
    positions = (batch.prompt_lengths[:, None] - 1 + torch.arange(batch.responses.shape[1])[None]).clamp(
        max=logits.shape[1] - 1)
    logits = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    log_q, log_p = (logits / temperature).log_softmax(-1), logits.log_softmax(-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


@pytest.mark.parametrize("mode,tempered,mismatch", [
    ("processed_logprobs", False, True),  # tempered samples, untempered π_old: the temperature gap, measured
    ("raw_logprobs", False, False),  # both untempered: the gap is numerical only
    ("processed_logprobs", True, False),  # both tempered (verl's pairing)
])
def test_rollout_correction_measures_the_temperature_mismatch_only_when_it_is_real(tiny_tokenizer, mode, tempered,
                                                                                  mismatch):
    from aepo_rl.algorithms.tensors import masked_mean
    from aepo_rl.train.rl import response_logprobs

    trainer = _trainer_for(tiny_tokenizer, sharpen=8.0, **{"rollout.temperature": 0.7, "rollout.logprobs_mode": mode,
                                              "algorithm.tempered_logprobs": tempered,
                                              "algorithm.rollout_correction.rollout_is": "token"})
    assert trainer.rollout_log_probs_comparable
    groups, _ = trainer.generate()
    trajs = [t for g in groups for t in g.trajectories]
    batch = collate(trajs, [0] * len(trajs), tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        untempered, _ = response_logprobs(trainer.model, batch, bf16=False, with_entropy=False)
        sampled, _ = response_logprobs(trainer.model, batch, bf16=False, with_entropy=False, temperature=0.7)
    on = batch.response_mask.bool()
    recorded = sampled if mode == "processed_logprobs" else untempered  # what the engine logged, token by token
    torch.testing.assert_close(batch.rollout_log_probs[on], recorded[on], atol=1e-4, rtol=1e-4)
    pi_old = sampled if tempered else untempered
    direct = float(masked_mean(recorded - pi_old, on))  # k1 of KL(π_rollout ‖ π_old) over the sampled tokens
    metrics = trainer.update(groups)
    assert metrics["rollout_corr/kl"] == pytest.approx(direct, abs=1e-5)
    if mismatch:
        assert metrics["rollout_corr/kl"] > 0.05 and metrics["rollout_corr/k3_kl"] > 1e-3
        # k1 estimates the exact KL(π_T ‖ π) of each sampled position (on a few hundred tokens: loosely)
        exact = float(masked_mean(_exact_kl(trainer.model, batch, 0.7), on))
        assert 0.5 * exact < metrics["rollout_corr/kl"] < 2 * exact
        assert metrics["rollout_corr/rollout_is_mean"] < 1  # sampled tokens: π_old below the sharper π_rollout
    else:
        assert abs(metrics["rollout_corr/kl"]) < 1e-5 and metrics["rollout_corr/k3_kl"] < 1e-8


def test_processed_log_probs_are_refused_where_they_cannot_be_recorded_or_would_change_the_branching(tiny_tokenizer):
    from aepo_rl.engines import check_logprobs_mode

    for engine in ("vllm", "openai"):
        cfg = load_config("aepo", overrides=[f"rollout.engine={engine}", "rollout.entropy_measure=top10_proxy",
                                             "rollout.logprobs_mode=processed_logprobs"])
        with pytest.raises(ConfigError, match=r"rollout.logprobs_mode='processed_logprobs'.*\['hf'\].*raw_logprobs"):
            check_logprobs_mode(cfg)
    with pytest.raises(ConfigError, match="rollout.entropy_measure=surprisal.*rollout.logprobs_mode=raw_logprobs"):
        load_config("aepo", overrides=["rollout.entropy_measure=surprisal", "rollout.logprobs_mode=processed_logprobs"])
    load_config("aepo", overrides=["rollout.entropy_measure=surprisal", "rollout.logprobs_mode=processed_logprobs",
                                   "rollout.mode=independent"])  # no branching decision reads it
    load_config("aepo", overrides=["algorithm.rollout_correction.bypass_mode=true", "algorithm.tempered_logprobs=true",
                                   "rollout.temperature=0.7", "rollout.logprobs_mode=processed_logprobs"])
    with pytest.raises(ConfigError, match="logprobs_mode"):
        load_config("aepo", overrides=["rollout.logprobs_mode=processed_logits"])  # vLLM's logits modes: not log-probs


# ----------------------------------------------------------------------------------------------
# The target-KL guard


def test_target_kl_stops_the_rest_of_the_step_once_the_kl_passes_it(tiny_tokenizer, monkeypatch):
    over = {"trainer.ppo_epochs": 2, "trainer.lr": 0.05}
    steps = []
    trainer = _trainer(tiny_tokenizer, **over, **{"trainer.target_kl": 1e-6})
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: (steps.append(1), step(*a, **k))[1])
    metrics = trainer.step()
    # 2 mini-batches × 2 epochs planned; the first is on-policy (KL 0) and stepped, the second's KL passes 1e-6
    assert len(steps) == 1 and metrics["actor/early_stop_frac"] == pytest.approx(3 / 4)
    # the stopped mini-batch's metrics count in the step's means (as Stable-Baselines3 logs them): the stepped one's
    # KL is exactly 0 (on-policy), so a positive mean is the drift the guard refused
    assert metrics["actor/approx_kl"] > 1e-6 / 2
    steps.clear()
    loose = _trainer(tiny_tokenizer, **over, **{"trainer.target_kl": 100.0})
    step = loose.optimizer.step
    monkeypatch.setattr(loose.optimizer, "step", lambda *a, **k: (steps.append(1), step(*a, **k))[1])
    assert loose.step()["actor/early_stop_frac"] == 0 and len(steps) == 4
    assert "actor/early_stop_frac" not in _trainer(tiny_tokenizer, **over).step()  # off by default


# ----------------------------------------------------------------------------------------------
# Warnings


def _fired(rows, **limits):
    health = RunHealth(**limits)
    return [(step, kind) for step, m in enumerate(rows, 1) for kind, _ in health.check(step, m)]


# The autopsy's measured step means (study-autopsy.md §2): GRPO at the defaults, the DAPO-like regime, C7.
DEFAULTS = {"actor/pg_clipfrac": 0.0002, "actor/ppo_kl": 0.0005, "rollout/informative_group_frac": 0.6,
            "actor/grad_norm": 0.5}
DAPO_LIKE = {**DEFAULTS, "actor/pg_clipfrac": 0.0042, "actor/ppo_kl": 0.004}
C7 = {**DEFAULTS, "actor/pg_clipfrac": 0.034, "actor/ppo_kl": 0.04}


def test_far_off_policy_warns_once_for_the_c7_regime_and_not_for_the_normal_ones():
    assert _fired([DEFAULTS] * 20) == [] and _fired([DAPO_LIKE] * 20) == []
    assert _fired([C7] * 20) == [(3, "off_policy")]
    assert _fired([C7, C7, DEFAULTS, C7, C7] + [DEFAULTS] * 5) == []  # not 3 steps running


def test_with_the_guard_on_the_warning_says_so_instead_of_proposing_it():
    """The guarded C7 runs (lab/notebook.md) still warned: the message names the guard and the share it cut."""
    guarded = RunHealth(target_kl=0.02)
    cut = {**C7, "actor/early_stop_frac": 0.5}
    messages = [message for step in (1, 2, 3) for _, message in guarded.check(step, cut)]
    assert len(messages) == 1 and "trainer.target_kl=0.02 is on, leaving out 50% of this step's mini-batches" \
        in messages[0] and "(e.g. 0.02)" not in messages[0] and "trainer.ppo_epochs=1" in messages[0]
    health = RunHealth()
    unguarded = [message for step in (1, 2, 3) for _, message in health.check(step, C7)]
    assert "trainer.target_kl (e.g. 0.02)" in unguarded[0]
    climbing = RunHealth(target_kl=0.02)
    messages = [m for i in range(10) for kind, m in climbing.check(i, {**DEFAULTS, "actor/entropy": 0.3 + 0.03 * i})]
    assert len(messages) == 1 and "entropy climbing" in messages[0] and "target_kl=0.02 is on" in messages[0]


def test_no_signal_warns_after_steps_of_equal_scores_or_zero_gradients():
    flat = {**DEFAULTS, "rollout/informative_group_frac": 0.0}
    assert _fired([flat] * 4) == [(3, "no_signal")]
    assert _fired([{**DEFAULTS, "actor/grad_norm": 0.0}] * 3) == [(3, "no_signal")]
    assert _fired([flat, flat, DEFAULTS] * 3) == []


def _entropy_warnings(entropies):
    health = RunHealth()
    return [(step, message.split(":")[1].strip()) for step, value in enumerate(entropies, 1)
            for kind, message in health.check(step, {**DEFAULTS, "actor/entropy": value}) if kind == "entropy"]


def test_entropy_warns_when_it_halves_or_climbs_steadily():
    collapse = [{**DEFAULTS, "actor/entropy": 0.5 * 0.9 ** i} for i in range(12)]  # 0.5 → 0.17 in 10 steps
    assert _fired(collapse) == [(10, "entropy")]
    climb = [{**DEFAULTS, "actor/entropy": 0.3 + 0.03 * i} for i in range(12)]
    assert _fired(climb) == [(10, "entropy")]
    assert _entropy_warnings([0.5 * 0.9 ** i for i in range(12)]) == [(10, "entropy collapsing")]
    assert _entropy_warnings([0.3 + 0.03 * i for i in range(12)]) == [(10, "entropy climbing")]
    noisy = [0.5 * 0.9 ** i * (1.03 if i % 2 else 0.97) for i in range(12)]  # a steady fall through ±3% noise
    assert _entropy_warnings(noisy) == [(10, "entropy collapsing")]
    # the autopsy's DAPO-like run: 0.46 → 0.26 over 12 steps, with noise; the defaults: 0.51 → 0.47
    dapo = [{**DEFAULTS, "actor/entropy": 0.46 - 0.0167 * i + (0.02 if i % 2 else 0)} for i in range(12)]
    assert _fired(dapo) == [] and _fired([{**DEFAULTS, "actor/entropy": 0.51 - 0.002 * i} for i in range(20)]) == []


# actor/entropy of the C7 run without a guard (aepo, seed 0; lab/notebook.md), steps 1-60: a climb from 0.39 with
# one-prompt mini-batches' noise; steps 40-49 fall from a one-step peak (1.016) to 0.475 and the climb resumes.
C7_ENTROPY = [0.386, 0.426, 0.428, 0.347, 0.402, 0.388, 0.51, 0.211, 0.473, 0.369, 0.328, 0.469, 0.455, 0.118, 0.679,
              0.217, 0.293, 0.455, 0.257, 0.344, 0.256, 0.343, 0.246, 0.415, 0.405, 0.806, 0.733, 0.681, 0.466, 0.628,
              0.574, 0.445, 0.788, 0.35, 0.603, 0.616, 0.808, 0.718, 0.809, 1.016, 0.969, 0.658, 1.018, 0.551, 0.549,
              0.544, 0.524, 0.561, 0.475, 0.473, 0.612, 0.492, 0.596, 0.668, 0.776, 0.636, 0.762, 0.637, 0.479, 0.675]


def test_a_short_dip_inside_a_long_climb_does_not_warn_collapse():
    """The window's ends are the means of its thirds: the C7 run's step-49 window (1.016 … 0.475, 7 of 9 steps
    down) was a "collapse" by its single first and last values; its thirds' means, 0.88 → 0.52, are not halved."""
    assert _entropy_warnings(C7_ENTROPY) == []
    climb = [0.4 + 0.015 * i for i in range(40)]  # 0.4 → 0.99, then a dip from a one-step spike, then on up
    dip = [1.05, 0.9, 0.8, 0.72, 0.66, 0.6, 0.56, 0.52, 0.5, 0.49]
    after = [0.5 + 0.03 * i for i in range(10)]
    assert _entropy_warnings(climb + dip + after) == []
    steady = [0.88 ** i for i in range(10)]  # a fall that does halve, 1 → 0.32 (thirds 0.89 → 0.36): it warns
    assert _entropy_warnings(climb + steady) == [(48, "entropy collapsing")]  # 0.99 → 0.47 over steps 39-48


def test_mismatch_warns_above_its_threshold():
    assert _fired([{**DEFAULTS, "rollout_corr/k3_kl": 1e-9}] * 10) == []
    assert _fired([{**DEFAULTS, "rollout_corr/k3_kl": 0.01}] * 3) == [(3, "mismatch")]


def test_in_bypass_mode_the_mismatch_warning_names_the_steps_own_drift():
    """C7 with bypass mode (lab/notebook.md) warned `mismatch` at step 3 although the HF engine shares the
    trainer's weights: there rollout_corr/* compares π_rollout with the policy being updated."""
    drift = {**DEFAULTS, "rollout_corr/k3_kl": 0.05}
    for health, words in ((RunHealth(bypass=True), "In bypass mode"), (RunHealth(), "the engine that sampled")):
        messages = [message for step in (1, 2, 3) for kind, message in health.check(step, drift) if kind == "mismatch"]
        assert len(messages) == 1 and words in messages[0]
    cfg = load_config("aepo", overrides={"algorithm.rollout_correction.bypass_mode": True})
    assert RunHealth.from_config(cfg.trainer, cfg.algorithm.rollout_correction).bypass
    assert not RunHealth.from_config(cfg.trainer).bypass


def test_the_run_folder_keeps_the_warnings_and_a_resume_does_not_repeat_them(tmp_path):
    rows = [{"step": i, **C7} for i in range(1, 5)]

    def logger(history):
        return RunLogger(tmp_path, total_steps=8, history=history, tensorboard=False, health=RunHealth())

    with logger([]) as log:
        for row in rows:
            log.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    written = [json.loads(line) for line in (tmp_path / "warnings.jsonl").read_text().splitlines()]
    assert [(w["step"], w["kind"]) for w in written] == [(3, "off_policy")]
    assert "trainer.target_kl" in written[0]["message"] and "ppo_epochs" in written[0]["message"]
    with logger(rows[:4]) as log:  # resumed after step 4: the warning was given already
        log.log(5, dict(C7))
    assert len((tmp_path / "warnings.jsonl").read_text().splitlines()) == 1
    with logger(rows[:2]) as log:  # resumed from step 2: step 3's warning is gone and comes again
        assert (tmp_path / "warnings.jsonl").read_text() == ""
        log.log(3, dict(C7))
    assert len((tmp_path / "warnings.jsonl").read_text().splitlines()) == 1


def test_a_real_run_with_one_reward_for_everything_warns_no_signal(tiny_tokenizer, tmp_path):
    """Built to trip: a task whose every answer scores the same; built not to: the varying-reward task."""

    class Flat(VaryingRewardTask):
        def reward(self, example, response_text):
            return 1.0

    cfg = load_config("grpo", overrides={**TINY_RL, "trainer.warn_steps": 2})
    for task, expected in ((Flat(), ["no_signal"]), (VaryingRewardTask(), [])):
        model = build_tiny_model(tiny_tokenizer, seed=1)
        trainer = RLTrainer(cfg, model, tiny_tokenizer, task, HFEngine(model, tiny_tokenizer, seed=0))
        health = RunHealth.from_config(cfg.trainer)
        fired = [kind for step in (1, 2) for kind, _ in health.check(step, trainer.step())]
        assert fired == expected


def test_a_real_run_reusing_its_samples_hard_warns_far_off_policy(tiny_tokenizer):
    """Built to trip: 4 PPO epochs over one-prompt mini-batches at lr 1e-2 (clip fraction ~40-60% on the
    tiny model); built not to: one epoch at lr 1e-4 (clip fraction 0)."""
    for overrides, expected in (({"trainer.ppo_epochs": 4, "trainer.lr": 1e-2}, ["off_policy"]),
                                ({"trainer.lr": 1e-4}, [])):
        cfg = load_config("grpo", overrides={**TINY_RL, **overrides})
        model = build_tiny_model(tiny_tokenizer, seed=1)
        trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
        health = RunHealth.from_config(cfg.trainer)
        fired = [kind for step in (1, 2, 3) for kind, _ in health.check(step, trainer.step())]
        assert fired == expected, overrides


def test_the_console_line_shows_the_zero_std_share():
    line = RunLogger.format_line(3, {"critic/score/mean": 0.5, "rollout/informative_group_frac": 0.25})
    assert "zero-std 75%" in line
