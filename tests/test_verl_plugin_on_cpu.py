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
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl "
                            "(.ci/run, docs/verl.md)")

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
                                          "verl.workers.utils.losses True True"), out.stdout
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
                 "import verl.workers.engine_workers as ew\n"
                 "from aepo_rl.integrations.verl import plugin\n"
                 "plugin.check_registrations()\n"
                 "print('aepo' in L and 'gppo' in L, 'aepo_tree' in A and 'aepo_chain' in A,\n"
                 "      getattr(ew.ppo_loss, '__aepo_wrapper__', False))\n")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "failed to load" not in out.stderr, out.stderr
    assert out.stdout.splitlines()[-1] == "True True True", out.stdout


def test_a_plain_import_verl_loads_only_the_plugins_finder():
    """The plugin costs ``import verl`` nothing measurable: next to verl's own modules it adds its four
    (aepo_rl, aepo_rl.integrations, aepo_rl.integrations.verl, its plugin module), standard library only,
    and changes only what verl's import already loaded (validate_config)."""
    code = ("import sys, verl\n"
            "print(sorted(sys.modules))\n"
            "plugin = sys.modules.get('aepo_rl.integrations.verl.plugin')\n"
            "print(sorted(plugin.find().applied) if plugin else None)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    env["VERL_USE_EXTERNAL_PLUGINS"] = "none"
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-2000:] + off.stderr[-2000:]
    with_plugin, without = (set(eval(out.stdout.splitlines()[-2])) for out in (on, off))
    assert with_plugin - without == {"aepo_rl", "aepo_rl.integrations", "aepo_rl.integrations.verl",
                                     "aepo_rl.integrations.verl.plugin"}, sorted(with_plugin - without)
    assert without - with_plugin == set(), sorted(without - with_plugin)
    assert on.stdout.splitlines()[-1] == "['verl.utils.config']" and off.stdout.splitlines()[-1] == "None"


def test_a_change_that_fails_leaves_verl_as_it_was():
    """All or nothing: when the last change fails (as on a verl that moved the symbol), the plugin undoes the
    four it made (losses, ppo_loss in every module that bound it, validate_config, agent loops), steps off
    sys.meta_path and says so on stderr; verl then runs as without the plugin."""
    code = ("import sys, verl\n"
            "from aepo_rl.integrations.verl import plugin\n"
            "p = plugin.find()\n"
            "def moved(module):\n"
            "    raise AttributeError(\"module 'trainer_sync' has no attribute 'PPOTrainerSync'\")\n"
            "p.seams['verl.trainer.ppo.v1.trainer_sync'] = moved\n"
            "import verl.workers.engine_workers as ew, verl.trainer.distillation.losses as dl\n"
            "import verl.utils.config as vc, verl.trainer.ppo.core_algos as ca\n"
            "from verl.experimental.agent_loop import agent_loop as al\n"
            "state = lambda: (sorted(k for k in ca.POLICY_LOSS_REGISTRY if k in ('aepo', 'gppo')),\n"
            "                 sorted(k for k in al._agent_loop_registry if k.startswith('aepo')),\n"
            "                 hasattr(ew.ppo_loss, '__aepo_wrapper__'), hasattr(dl.ppo_loss, '__aepo_wrapper__'),\n"
            "                 hasattr(vc.validate_config, '__aepo_wrapper__'), p in sys.meta_path)\n"
            "print(state(), flush=True)\n"
            "from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls\n"
            "print(state(), get_trainer_cls('sync') is PPOTrainerSync, plugin.find())\n"
            "import verl.workers.utils.losses as L\n"
            "print(L.ppo_loss is ew.ppo_loss is dl.ppo_loss, L.ppo_loss.__module__)\n")
    out = _fresh(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-3:] == [
        "(['aepo', 'gppo'], ['aepo_chain', 'aepo_tree'], True, True, True, True)",
        "([], [], False, False, False, False) True None",
        "True verl.workers.utils.losses"], out.stdout
    assert ("aepo-rl verl plugin failed to extend verl.trainer.ppo.v1.trainer_sync: AttributeError: module "
            "'trainer_sync' has no attribute 'PPOTrainerSync'; it undid its changes to verl "
            "(verl.experimental.agent_loop.agent_loop, verl.workers.utils.losses, verl.trainer.ppo.core_algos, "
            "verl.utils.config)") in out.stderr, out.stderr[-2000:]


def test_every_change_is_where_verl_keeps_it():
    """The version gate's other half: what the plugin changes is where verl 0.9.1 has it, with the signature the
    plugin calls. A verl release that moves or reshapes one of them fails here, naming it, before any run."""
    import inspect

    import verl
    import verl.trainer.distillation.losses as distillation_losses
    import verl.trainer.main_ppo as main_ppo
    import verl.workers.engine_workers as engine_workers
    from verl.experimental.agent_loop import agent_loop
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import trainer_base, trainer_sync
    from verl.utils import config as verl_config
    from verl.workers.utils import losses

    from aepo_rl.integrations.verl import plugin, require_verl

    assert require_verl(verl.__version__) == verl.__version__
    assert set(plugin.SEAMS) == set(plugin.IN_PLACE)
    params = lambda fn: list(inspect.signature(inspect.unwrap(fn)).parameters)  # noqa: E731
    # policy losses: verl's registry, and the keywords verl's ppo_loss calls them with
    assert params(core_algos.register_policy_loss) == ["name"] and isinstance(core_algos.POLICY_LOSS_REGISTRY, dict)
    assert params(plugin._policy_loss("aepo")) == ["old_log_prob", "log_prob", "advantages", "response_mask",
                                                   "loss_agg_mode", "config", "rollout_is_weights"]
    assert "policy_loss_fn(\n        old_log_prob=old_log_prob," in inspect.getsource(inspect.unwrap(losses.ppo_loss))
    # ppo_loss: its signature; the two modules that import it by name; engine_workers builds its loss on the name
    assert params(losses.ppo_loss) == ["config", "model_output", "data", "dp_group"]
    assert "from verl.workers.utils.losses import ppo_loss" in inspect.getsource(engine_workers)
    assert "partial(ppo_loss, config=actor_config)" in inspect.getsource(engine_workers)
    assert "from verl.workers.utils.losses import ppo_loss" in inspect.getsource(distillation_losses)
    # validate_config: main_ppo imports it by name (after import verl) and calls it in its driver
    assert params(verl_config.validate_config) == ["config", "use_reference_policy", "use_critic"]
    assert "from verl.utils.config import validate_config" in inspect.getsource(main_ppo)
    # agent loops: verl's register stores {"_target_": module.qualname} in the registry its worker instantiates
    assert "_agent_loop_registry[agent_name] = {\"_target_\": fqdn}" in inspect.getsource(agent_loop.register)
    assert "_agent_loop_registry[agent_name]" in inspect.getsource(agent_loop.AgentLoopWorker)
    # the sync trainer: verl's registry entry, and the _compute_metrics hook the subclass extends
    assert trainer_sync.PPOTrainerSync.__name__ in repr(trainer_base.TRAINER_REGISTRY["sync"].__mro__)
    assert params(trainer_sync.PPOTrainerSync._compute_metrics) == ["self", "batch", "metrics", "timing_raw",
                                                                    "global_steps", "epoch"]
    plugin.check_registrations()


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
    from verl.utils import config as verl_config

    from aepo_rl.integrations.verl import plugin

    plugin.check_registrations()
    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "gppo")
    with pytest.raises(RuntimeError, match=r"not applied to verl\.trainer\.ppo\.core_algos;"):
        plugin.check_registrations()
    monkeypatch.undo()
    monkeypatch.setattr(verl_config, "validate_config", verl_config.validate_config.__wrapped__)
    with pytest.raises(RuntimeError, match=r"not applied to verl\.utils\.config;"):
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
    from verl.workers.utils import losses as verl_losses

    lengths, mask, old, logp, adv, entropy, prompt = _batch()
    args = (_actor_config("vanilla", "token-mean"),
            {"log_probs": _flat(logp, lengths, prompt), "entropy": _flat(entropy, lengths, prompt)})
    wrapped, _ = verl_losses.ppo_loss(*args, _verl_data(lengths, mask, old, adv, prompt))
    original, _ = verl_losses.ppo_loss.__wrapped__(*args, _verl_data(lengths, mask, old, adv, prompt))
    assert verl_losses.ppo_loss.__aepo_wrapper__ and not hasattr(verl_losses.ppo_loss.__wrapped__, "__aepo_wrapper__")
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
