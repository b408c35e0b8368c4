"""The launch overrides of examples/verl/*.sh, parsed out of the scripts themselves, composed with
Hydra against verl 0.9.1's own ``ppo_trainer`` config and checked by verl's ``validate_config``, the
actor and rollout configs built as main_ppo's workers build them. Marked ``verl``; runs in .venv-verl."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl", reason="verl is not installed here: the verl tests run in .venv-verl "
                            "(.ci/run, docs/verl.md)")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "verl"
VALUES = {"DATA": "/data/aepo", "MODEL": "Qwen/Qwen3-8B", "REWARD": "/site/aepo_rl/integrations/verl/reward.py",
          "HERE": str(EXAMPLES)}


def command_block(script: Path, starts: str) -> list[str]:
    """The arguments of the command line that starts with ``starts`` (backslash continuations joined) up
    to its ``"$@"``, shell variables replaced by test values."""
    lines = script.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith(starts))
    block = []
    for line in lines[first:]:
        block.append(line.rstrip().rstrip("\\"))
        if not line.rstrip().endswith("\\"):
            break
    text = " ".join(block)[len(lines[first]) - len(lines[first].lstrip()) + len(starts):]
    default = re.search(r'TASK_OVERRIDES:-([^}]*)}', script.read_text())
    text = text.replace('"${TASK_OVERRIDES[@]}"', default.group(1) if default else "").split('"$@"')[0]
    text = re.sub(r"\$(\w+)", lambda m: VALUES[m.group(1)], text)
    return shlex.split(text)


def script_overrides(name: str) -> list[str]:
    return command_block(EXAMPLES / name, "python -m verl.trainer.main_ppo")


def smoke_overrides() -> list[str]:
    """run_qwen3_0.6b_1gpu.sh's overrides followed by those smoke_1gpu.sh appends."""
    extra = command_block(EXAMPLES / "smoke_1gpu.sh", 'bash "$HERE/run_qwen3_0.6b_1gpu.sh"')
    return script_overrides("run_qwen3_0.6b_1gpu.sh") + extra


def compose(overrides: list[str]):
    import verl.trainer.main_ppo as main_ppo
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    config_dir = str(Path(main_ppo.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


SCRIPTS = {"run_qwen3_0.6b_1gpu.sh": (1, 8, 4), "run_qwen3_8b_8gpu.sh": (8, 12, 6)}  # GPUs, n, global samples


@pytest.mark.parametrize("name", [*SCRIPTS, "smoke_1gpu.sh"])
def test_example_overrides_compose_and_pass_verls_validation(name):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from aepo_rl.integrations.verl.agent_loop import loop_settings
    from aepo_rl.integrations.verl.loss import AEPOPolicyLossConfig

    overrides = smoke_overrides() if name == "smoke_1gpu.sh" else script_overrides(name)
    assert len(overrides) > 30 and all("=" in o for o in overrides), overrides
    config = compose(overrides)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert not need_reference_policy(config) and not need_critic(config)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, AEPOPolicyLossConfig)
    assert actor.policy_loss.loss_mode == "aepo" and actor.policy_loss.entropy_adv_coef == 0.2
    assert actor.calculate_entropy and actor.clip_ratio_c == 3.0
    assert actor.fsdp_config.entropy_from_logits_with_chunking  # fp32 entropies (review M3)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    settings = loop_settings(rollout)  # the agent loop's own check of custom.aepo
    assert settings.rollout.entropy_measure == "surprisal" and settings.tools == ("search", "python")
    assert settings.task.name == "synthetic"
    assert config.reward.custom_reward_function.name == "compute_score"
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "aepo_tree"
    if name == "smoke_1gpu.sh":
        assert config.trainer.total_training_steps == 2 and settings.task.num_train == 32
        assert settings.rollout.max_response_length == 1024
    else:
        gpus, n, m = SCRIPTS[name]
        assert config.trainer.n_gpus_per_node == gpus and rollout.n == n and settings.rollout.global_samples == m
        assert settings.rollout.n == n and settings.rollout.max_response_length == config.data.max_response_length


def test_the_8gpu_script_has_the_release_hyper_parameters():
    config = compose(script_overrides("run_qwen3_8b_8gpu.sh"))
    actor = config.actor_rollout_ref.actor
    assert (config.data.train_batch_size, actor.ppo_mini_batch_size, actor.optim.lr) == (64, 8, 1e-6)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, config.actor_rollout_ref.rollout.n) == (0.2, 0.2, 12)
    assert config.actor_rollout_ref.rollout.custom.aepo.global_samples == 6
    assert config.actor_rollout_ref.rollout.custom.aepo.call_limit == 6
    assert config.data.max_response_length == 6192 and actor.use_kl_loss is False


def test_a_plain_policy_loss_config_without_the_plus_is_refused_by_hydra():
    """Why the scripts write ``+`` before AEPO's keys: verl's YAML does not have them."""
    from hydra.errors import ConfigCompositionException

    overrides = [o.lstrip("+") if "entropy_adv_coef" in o else o for o in script_overrides("run_qwen3_0.6b_1gpu.sh")]
    with pytest.raises(ConfigCompositionException):
        compose(overrides)


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.name=sglang", "rollout.name=sglang: .*include_stop_str_in_output.*name=vllm"),
    ("trainer.v1.trainer_mode=colocate_async", "trainer_mode=colocate_async: .*aborted request fails the whole"),
    ("trainer.v1.trainer_mode=separate_async", "trainer_mode=separate_async"),
    ("trainer.use_v1=false", "trainer.use_v1=false: aepo_tree needs"),
    ("actor_rollout_ref.rollout.full_determinism=true", "full_determinism=true: .*share one id"),
    ("distillation.enabled=true", "distillation.enabled=true with actor.policy_loss.loss_mode=aepo"),
    ("trainer.use_v1=false algorithm.rollout_correction.bypass_mode=true",
     "bypass_mode=true with trainer.use_v1=false: .*loss would silently not run"),
    ("+actor_rollout_ref.rollout.custom.aepo.branch_thresold=0.5", "unknown key.*custom.aepo.branch_thresold"),
])
def test_main_ppos_validate_config_refuses_what_the_plugin_cannot_run(override, message):
    """The plugin wraps verl's validate_config (what main_ppo calls before it starts Ray): SGLang (review H1),
    the async trainer modes (M1), the legacy trainer (and its bypass mode, which swaps the loss), full
    determinism (L2), distillation (L7) and a bad custom.aepo key stop the run at start with the key and the fix."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from aepo_rl.config import ConfigError

    config = compose(smoke_overrides() + override.split())
    with pytest.raises(ConfigError, match=message):
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))


def test_main_ppo_itself_uses_the_checked_validate_config():
    import verl.trainer.main_ppo as main_ppo

    assert getattr(main_ppo.validate_config, "__aepo_wrapper__", False)


def _leaves(node, prefix=""):
    from omegaconf import DictConfig

    for key, value in node.items():
        if isinstance(value, DictConfig):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_the_hydra_config_extends_ppo_trainer_with_the_8gpu_scripts_settings():
    """config/aepo_trainer.yaml (defaults: [ppo_trainer, _self_]) composes with one --config-name, passes
    verl's validate_config and the plugin's check, and sets every key it names as the release script does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    import aepo_rl.integrations.verl as plugin_package
    from aepo_rl.integrations.verl.loss import AEPOPolicyLossConfig

    config_dir = Path(plugin_package.__file__).parent / "config"
    own = OmegaConf.load(config_dir / "aepo_trainer.yaml")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = hydra_compose(config_name="aepo_trainer", overrides=[
            "data.train_files=/data/aepo/train.parquet", "data.val_files=/data/aepo/val.parquet",
            "actor_rollout_ref.model.path=Qwen/Qwen3-8B", "trainer.n_gpus_per_node=8"])
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from aepo_rl.integrations.verl import reward

    assert config.reward.custom_reward_function.path == "pkg://aepo_rl.integrations.verl.reward"
    assert get_custom_reward_fn(config).args[0] is reward.compute_score  # verl's own loader finds it by name
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, AEPOPolicyLossConfig) and actor.policy_loss.entropy_adv_coef == 0.2
    script = compose(script_overrides("run_qwen3_8b_8gpu.sh"))
    keys = [k for k in _leaves(own)
            if not k.startswith(("hydra.", "defaults", "trainer.")) and k != "reward.custom_reward_function.path"]
    assert len(keys) > 35
    defaults = AEPOPolicyLossConfig()  # the knobs the script leaves at their defaults

    def scripted(key):
        value = OmegaConf.select(script, key)
        if value is None and key.startswith("actor_rollout_ref.actor.policy_loss."):
            return getattr(defaults, key.rsplit(".", 1)[1])
        return value

    differ = {k: (OmegaConf.select(config, k), scripted(k)) for k in keys if OmegaConf.select(config, k) != scripted(k)}
    assert not differ, differ
    # and every key the script sets, the config sets alike (paths, the model and trainer.* aside)
    skip = ("trainer.", "data.train_files", "data.val_files", "actor_rollout_ref.model.path",
            "reward.custom_reward_function.path")
    missing = {k: (OmegaConf.select(config, k), OmegaConf.select(script, k))
               for k in (o.split("=", 1)[0].lstrip("+") for o in script_overrides("run_qwen3_8b_8gpu.sh"))
               if not k.startswith(skip) and OmegaConf.select(config, k) != OmegaConf.select(script, k)}
    assert not missing, missing


def test_custom_aepo_logprobs_mode_is_refused_for_verls_own_key():
    """What verl's servers record is verl's rollout.logprobs_mode (processed_logprobs by default), not the tree's."""
    from omegaconf import OmegaConf

    from aepo_rl.config import ConfigError
    from aepo_rl.integrations.verl.agent_loop import loop_settings

    rollout = OmegaConf.create({"custom": {"aepo": {"logprobs_mode": "processed_logprobs"}}, "n": 2,
                                "prompt_length": 64, "response_length": 64})
    with pytest.raises(ConfigError, match=r"custom.aepo.logprobs_mode .*actor_rollout_ref.rollout.logprobs_mode"):
        loop_settings(rollout)
