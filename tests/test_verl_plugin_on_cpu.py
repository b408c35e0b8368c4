"""The verl plugin against verl 0.9.1's real code (CPU): registration by a bare ``import verl``, the
version gate, and the aepo/gppo losses through verl's own ``ppo_loss`` compared with aepo_rl's native
losses (values and gradients). Marked ``verl``; runs in .venv-verl (.ci/run), skipped elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.verl
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl (.ci/run, docs/verl.md)")

from aepo_rl.algorithms.aggregation import AGG_MODES  # noqa: E402
from aepo_rl.algorithms.losses import aepo_policy_loss, gppo_policy_loss  # noqa: E402
from aepo_rl.config import AlgorithmConfig  # noqa: E402

TOL = 1e-6


def test_bare_import_of_verl_registers_everything_through_the_entry_point():
    """A fresh interpreter that only imports verl (never aepo_rl) ends up with the plugin's registrations,
    and the ppo_loss that engine_workers and distillation's loss bind is the plugin's wrapper."""
    code = (
        "import sys, verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as L\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as A\n"
        "import verl.workers.engine_workers as ew, verl.trainer.distillation.losses as dl\n"
        "print(sorted(k for k in L if k in ('aepo', 'gppo')), sorted(k for k in A if k.startswith('aepo')),\n"
        "      ew.ppo_loss.__module__, getattr(ew.ppo_loss, '__aepo_wrapper__', False), dl.ppo_loss is ew.ppo_loss)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == ("['aepo', 'gppo'] ['aepo_chain', 'aepo_tree'] "
                                          "aepo_rl.integrations.verl.loss True True"), out.stdout
    # and with verl's plugin discovery switched off, nothing of ours is there: the entry point did it
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert off.returncode == 0, off.stderr[-2000:]
    assert off.stdout.split("\n")[-2].startswith("[] [] verl.workers.utils.losses False True"), off.stdout


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_import_verl_does_not_import_the_agent_loop_stack():
    """The loops are registered by name (review M2): a process that only imports verl (vLLM's engine
    processes, the FSDP worker, the model merger) loads neither verl's agent-loop module nor the plugin's
    loops; the registry entries appear when verl's module is imported, and verl's worker builds a loop."""
    out = _fresh("import sys, verl\n"
                 "print('verl.experimental.agent_loop.agent_loop' in sys.modules,\n"
                 "      'aepo_rl.integrations.verl.agent_loop' in sys.modules)\n"
                 "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as A\n"
                 "print(A['aepo_tree'], 'aepo_rl.integrations.verl.agent_loop' in sys.modules)\n"
                 "import hydra.utils\n"
                 "print(hydra.utils.get_class(A['aepo_tree']['_target_']).__name__)\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-3:] == [
        "False False", "{'_target_': 'aepo_rl.integrations.verl.agent_loop.AEPOTreeAgentLoop'} False",
        "AEPOTreeAgentLoop"], out.stdout


@pytest.mark.parametrize("first", ["aepo_rl.integrations.verl.loss", "aepo_rl.integrations.verl.agent_loop"])
def test_importing_the_plugins_modules_before_verl_raises_no_false_alarm(first):
    """Review L1: importing loss (or agent_loop) first makes verl load the plugin while that module is half
    initialised; the plugin no longer reports it as a failed registration, and the end state is right."""
    out = _fresh(f"import {first}\n"
                 "import verl\n"
                 "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as L\n"
                 "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as A\n"
                 "from aepo_rl.integrations.verl import loss, plugin\n"
                 "plugin.check_registrations()\n"
                 "print('aepo' in L and 'gppo' in L, 'aepo_tree' in A and 'aepo_chain' in A, loss.installed())\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "failed to load" not in out.stderr, out.stderr
    assert out.stdout.splitlines()[-1] == "True True True", out.stdout


def test_version_gate_names_the_range_and_the_fix():
    from aepo_rl.integrations.verl import VerlVersionError, require_verl

    assert require_verl("0.9.1") == "0.9.1"
    assert require_verl("0.9.7.dev0") == "0.9.7.dev0"
    for bad in ("0.9.0", "0.8.5", "0.10.0", "0.10.0rc1", "1.0"):
        with pytest.raises(VerlVersionError, match=r"verl>=0\.9\.1,<0\.10.*pip install"):
            require_verl(bad)


def test_a_verl_outside_the_range_is_refused_loudly_when_verl_loads_the_plugin():
    """verl swallows a failing plugin (DEBUG log): the plugin's own stderr line says what and how to fix."""
    code = ("import importlib.metadata as m\n"
            "real = m.version\n"
            "m.version = lambda name: '0.10.0' if name == 'verl' else real(name)\n"
            "import verl\n"
            "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY\n"
            "print('aepo' in POLICY_LOSS_REGISTRY)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split("\n")[-2] == "False", out.stdout + out.stderr[-2000:]
    assert ("aepo-rl verl plugin failed to load: VerlVersionError: aepo_rl.integrations.verl was tested with "
            "verl>=0.9.1,<0.10, but verl 0.10.0 is installed: pip install") in out.stderr


def test_check_registrations_fails_loudly_when_a_registration_is_missing(monkeypatch):
    from verl.trainer.ppo import core_algos

    from aepo_rl.integrations.verl import plugin

    plugin.check_registrations()
    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "gppo")
    with pytest.raises(RuntimeError, match="policy loss 'gppo'"):
        plugin.check_registrations()


def test_policy_loss_config_subclass_and_its_checks():
    from aepo_rl.integrations.verl.loss import AEPOPolicyLossConfig

    cfg = AEPOPolicyLossConfig(loss_mode="aepo", entropy_adv_coef=0.3)
    assert cfg.entropy_adv_coef == 0.3 and cfg.loss_mode == "aepo"
    with pytest.raises(ValueError, match="entropy_adv_scope='mini-batch' is not available under verl"):
        AEPOPolicyLossConfig(entropy_adv_scope="mini-batch")
    with pytest.raises(ValueError, match="grad_preserve_entropy_quantile"):
        AEPOPolicyLossConfig(grad_preserve_entropy_quantile=1.5)


# ------------------------------------------------------------------------- loss parity through ppo_loss

def _batch(seed: int = 0, rows: int = 5, prompt: int = 4, response: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 3, 7, 1, 6])[:rows]
    mask = (torch.arange(response)[None, :] < lengths[:, None]).float()
    mask[0, 2:4] = 0  # tool-result tokens inside a response
    mask[2, 5] = 0
    old = -torch.rand(rows, response, generator=g) * 3
    logp = (old + torch.randn(rows, response, generator=g) * 0.4).clamp(max=0)  # ratios on both sides of the clip
    adv = torch.randn(rows, 1, generator=g).expand(rows, response).contiguous()
    entropy = torch.rand(rows, response, generator=g) * 4
    return lengths, mask, old, logp, adv, entropy, prompt


def _flat(values: torch.Tensor, lengths: torch.Tensor, prompt: int) -> torch.Tensor:
    """verl's unpadded model output: one value per token of prompt + response, the log-prob of response
    token t at position prompt - 1 + t of its sequence (the logits that predict it)."""
    pieces = []
    for row, length in enumerate(lengths.tolist()):
        pieces += [values.new_zeros(prompt - 1), values[row, :length], values.new_zeros(1)]
    return torch.cat(pieces)


def _verl_data(lengths, mask, old, adv, prompt):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    rows, response = mask.shape
    attention = torch.cat([torch.ones(rows, prompt), (torch.arange(response)[None, :] < lengths[:, None]).float()], 1)
    data = TensorDict({"prompts": torch.ones(rows, prompt, dtype=torch.long),
                       "responses": torch.ones(rows, response, dtype=torch.long),
                       "attention_mask": attention.long(), "response_mask": mask,
                       "old_log_probs": old, "advantages": adv}, batch_size=[rows])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=rows)
    return data


def _actor_config(mode: str, agg: str, **knobs):
    from verl.workers.config import ActorConfig

    from aepo_rl.integrations.verl.loss import AEPOPolicyLossConfig

    return ActorConfig(strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, rollout_n=1,
                       clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=agg,
                       calculate_entropy=True, policy_loss=AEPOPolicyLossConfig(loss_mode=mode, **knobs))


def _through_verl(mode: str, agg: str, with_entropy: bool = True, **knobs):
    """Loss and d loss / d log π of verl's own ppo_loss (the name engine_workers calls) on one batch."""
    import verl.workers.engine_workers as engine_workers

    lengths, mask, old, logp, adv, entropy, prompt = _batch()
    leaf = logp.clone().requires_grad_(True)
    output = {"log_probs": _flat(leaf, lengths, prompt)}
    if with_entropy:
        output["entropy"] = _flat(entropy, lengths, prompt)
    loss, metrics = engine_workers.ppo_loss(_actor_config(mode, agg, **knobs), output,
                                            _verl_data(lengths, mask, old, adv, prompt))
    loss.backward()
    return loss.detach(), leaf.grad, metrics


def _native(loss_fn, agg: str, **knobs):
    lengths, mask, old, logp, adv, entropy, _ = _batch()
    leaf = logp.clone().requires_grad_(True)
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, entropy_adv_scope="micro-batch",
                          **knobs)
    loss, _ = loss_fn(old, leaf, adv, mask, agg, cfg, entropy)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("coef", [0.0, 0.2])
def test_aepo_through_verls_ppo_loss_equals_the_native_loss(agg, coef):
    loss, grad, metrics = _through_verl("aepo", agg, entropy_adv_coef=coef)
    ref_loss, ref_grad = _native(aepo_policy_loss, agg, entropy_adv_coef=coef)
    assert torch.allclose(loss, ref_loss, atol=TOL, rtol=0), (loss, ref_loss)
    assert torch.allclose(grad, ref_grad, atol=TOL, rtol=0)
    assert grad.abs().sum() > 0
    assert "actor/entropy_adv_scale/mean" in metrics and "actor/pg_clipfrac" in metrics
    if coef:  # the forwarded entropy matters: without the term the loss differs
        off, _ = _native(aepo_policy_loss, agg, entropy_adv_coef=0.0)
        assert not torch.allclose(loss, off, atol=1e-4)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aepo_high_entropy_gradient_preservation_and_gppo_match(agg):
    loss, grad, _ = _through_verl("aepo", agg, entropy_adv_coef=0.2, grad_preserve_entropy_quantile=0.5)
    ref_loss, ref_grad = _native(aepo_policy_loss, agg, entropy_adv_coef=0.2, grad_preserve_entropy_quantile=0.5)
    assert torch.allclose(loss, ref_loss, atol=TOL, rtol=0) and torch.allclose(grad, ref_grad, atol=TOL, rtol=0)
    loss, grad, _ = _through_verl("gppo", agg)
    ref_loss, ref_grad = _native(gppo_policy_loss, agg)
    assert torch.allclose(loss, ref_loss, atol=TOL, rtol=0) and torch.allclose(grad, ref_grad, atol=TOL, rtol=0)


def test_aepo_without_entropy_says_which_key_to_set():
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.calculate_entropy=true"):
        _through_verl("aepo", "token-mean", with_entropy=False, entropy_adv_coef=0.2)
    loss, _, _ = _through_verl("aepo", "token-mean", with_entropy=False, entropy_adv_coef=0.0)
    assert torch.isfinite(loss)


def test_other_loss_modes_pass_through_verls_ppo_loss_untouched():
    """vanilla through the wrapper = verl's original ppo_loss."""
    from aepo_rl.integrations.verl import loss as plugin_loss

    lengths, mask, old, logp, adv, entropy, prompt = _batch()
    args = (_actor_config("vanilla", "token-mean"),
            {"log_probs": _flat(logp, lengths, prompt), "entropy": _flat(entropy, lengths, prompt)})
    wrapped, _ = plugin_loss.ppo_loss(*args, _verl_data(lengths, mask, old, adv, prompt))
    original, _ = plugin_loss._ORIGINAL_PPO_LOSS(*args, _verl_data(lengths, mask, old, adv, prompt))
    assert plugin_loss._ORIGINAL_PPO_LOSS is not plugin_loss.ppo_loss
    assert torch.equal(wrapped, original)


def test_bf16_log_probs_and_entropies_are_upcast_before_the_entropy_statistics():
    """Under bf16 mixed precision verl hands the loss bf16 log-probs and entropies (review M3). The plugin
    computes the entropy-aware advantage and the ratio in fp32: the masked mean of 1 + a·z stays 1 (it is
    1 by construction of z), and the loss equals the native fp32 loss on the same bf16-rounded values."""
    import verl.workers.engine_workers as engine_workers

    lengths, mask, old, logp, adv, entropy, prompt = _batch()
    old, logp, entropy = (x.to(torch.bfloat16) for x in (old, logp, entropy))
    leaf = logp.clone().requires_grad_(True)
    output = {"log_probs": _flat(leaf, lengths, prompt), "entropy": _flat(entropy, lengths, prompt)}
    loss, metrics = engine_workers.ppo_loss(_actor_config("aepo", "token-mean", entropy_adv_coef=1.0), output,
                                            _verl_data(lengths, mask, old, adv, prompt))
    scale = metrics["actor/entropy_adv_scale/mean"]
    assert abs(float(scale.values[0]) - 1.0) < 1e-5, scale.values
    cfg = AlgorithmConfig(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, entropy_adv_scope="micro-batch",
                          entropy_adv_coef=1.0)
    ref, _ = aepo_policy_loss(old.float(), logp.float(), adv, mask, "token-mean", cfg, entropy.float())
    assert loss.dtype == torch.float32 and torch.allclose(loss, ref, atol=TOL, rtol=0), (loss, ref)
    loss.backward()
    assert leaf.grad.dtype == torch.bfloat16 and leaf.grad.abs().sum() > 0


def test_rollout_metrics_reduce_the_leaves_extra_fields():
    from aepo_rl.integrations.verl.metrics import rollout_metrics

    def leaf(traj, parent, depth, m, branches, calls, errors, reason):
        return {"aepo_traj_id": traj, "aepo_parent_id": parent, "aepo_depth": depth, "aepo_global_samples": m,
                "aepo_branches": branches, "aepo_num_tool_calls": calls, "aepo_tool_errors": errors,
                "aepo_finish_reason": reason}

    uids = ["a"] * 4 + ["b"] * 4 + ["c"]
    extra = [leaf(0, -1, 0, 2, 2, 1, 0, "answer"), leaf(1, -1, 0, 2, 2, 2, 1, "answer"),
             leaf(2, 0, 1, 2, 2, 2, 0, "length"), leaf(3, 2, 2, 2, 2, 3, 1, "answer"),
             leaf(0, -1, 0, 4, 0, 0, 0, "eos"), leaf(1, -1, 0, 4, 0, 0, 0, "eos"),
             leaf(2, -1, 0, 4, 0, 1, 1, "answer"), leaf(3, -1, 0, 4, 0, 0, 0, "eos"),
             {"turn_scores": []}]  # a leaf of another agent loop: ignored
    out = rollout_metrics(uids, extra)
    assert out == {"rollout/aepo/global_samples": 3.0, "rollout/aepo/branches_per_prompt": 1.0,
                   "rollout/aepo/depth/mean": 3 / 8, "rollout/aepo/depth/max": 2.0,
                   "rollout/aepo/tool_calls_per_leaf": 9 / 8, "rollout/aepo/tool_errors_per_leaf": 3 / 8,
                   "rollout/aepo/tool_error_share": 3 / 9, "rollout/aepo/finish/answer": 4 / 8,
                   "rollout/aepo/finish/length": 1 / 8, "rollout/aepo/finish/eos": 3 / 8}
    assert rollout_metrics(["x"], [{"turn_scores": []}]) == {}


def test_verls_sync_trainer_logs_the_rollout_metrics():
    """After a plain import verl, the trainer main_ppo gets for trainer_mode=sync is verl's, extended by the
    plugin (only once verl itself imports it) to add the rollout metrics when the AEPO loops are in use."""
    out = _fresh("import sys, verl\n"
                 "print('verl.trainer.ppo.v1.trainer_sync' in sys.modules)\n"
                 "from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls\n"
                 "cls = get_trainer_cls('sync')\n"
                 "print(cls.__name__, cls.__mro__[1] is PPOTrainerSync, '_compute_metrics' in vars(cls))\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-2:] == ["False", "AEPOMetricsPPOTrainerSync True True"], out.stdout
