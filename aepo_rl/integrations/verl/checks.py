"""What the plugin refuses before verl builds anything: checks of main_ppo's config in its driver.

verl's ``main_ppo`` calls ``verl.utils.config.validate_config`` on the composed config before it starts
Ray. The plugin wraps it (:func:`aepo_rl.integrations.verl.plugin.wrap_validate_config`): verl's checks
first, then :func:`check_trainer_config`, which refuses the settings the plugin cannot honour
(docs/verl.md, "Support matrix") and resolves ``rollout.custom.aepo`` with the agent loop's own rules, so
a bad key stops the run at start instead of failing every session later.
"""

from __future__ import annotations

from aepo_rl.integrations.verl import AGENT_LOOPS, LOSS_MODES

ROLLOUT = "actor_rollout_ref.rollout"
ROLLOUT_N_COLUMN = "__rollout_n__"


def _get(config, dotted: str, default=None):
    node = config
    for key in dotted.split("."):
        node = node.get(key, None) if hasattr(node, "get") else None
        if node is None:
            return default
    return node


def uses_aepo_loss(config) -> bool:
    return _get(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla") in LOSS_MODES


def uses_aepo_loops(config) -> bool:
    """The agent loops are in use: the default loop is one of them, or their settings are given (rows
    name their loop in ``agent_name``, which the driver does not see)."""
    return (_get(config, f"{ROLLOUT}.agent.default_agent_loop") in AGENT_LOOPS
            or _get(config, f"{ROLLOUT}.custom.aepo") is not None)


def files_with_rollout_n(config) -> list[str]:
    """The local parquet files of ``data.train_files`` with a per-row ``__rollout_n__`` column (review L4); remote
    or missing paths are left to verl's own loader."""
    from pathlib import Path

    files = _get(config, "data.train_files") or []
    files = [files] if isinstance(files, str) else list(files)
    found = []
    for path in files:
        if str(path).endswith(".parquet") and Path(path).is_file():
            import pyarrow.parquet as pq

            if ROLLOUT_N_COLUMN in pq.read_schema(path).names:
                found.append(str(path))
    return found


def refusals(config) -> list[str]:
    """Why this config cannot run with the plugin: one message per problem, each naming the key and the fix."""
    problems = []
    loops, loss = uses_aepo_loops(config), uses_aepo_loss(config)
    if not (loops or loss):
        return []
    name = _get(config, f"{ROLLOUT}.name", "vllm")
    if loops and name == "sglang":
        problems.append(
            f"{ROLLOUT}.name=sglang: the aepo agent loops need string stop sequences with the stop string kept "
            "in the output; they send vLLM's include_stop_str_in_output, which SGLang's SamplingParams rejects, "
            "and verl's default rollout.skip_tokenizer_init=true makes SGLang refuse string stops. Use "
            f"{ROLLOUT}.name=vllm (docs/verl.md, Support matrix)")
    mode = _get(config, "trainer.v1.trainer_mode", "sync")
    if loops and mode != "sync":
        problems.append(
            f"trainer.v1.trainer_mode={mode}: verl's async modes abort in-flight requests at every weight sync, "
            "and an aborted request fails the whole AEPO tree (all rollout.n leaves); use trainer.v1.trainer_mode=sync")
    if loops and not _get(config, "trainer.use_v1", True):
        problems.append("trainer.use_v1=false: aepo_tree needs verl's V1 agent-loop worker, which runs a prompt's "
                        "n sessions in one process; the legacy trainer may split them. Use trainer.use_v1=true")
    if loops and _get(config, f"{ROLLOUT}.full_determinism", False):
        problems.append(f"{ROLLOUT}.full_determinism=true: verl then forwards the caller's request id, so all the "
                        "concurrent branches of a tree share one id (SGLang refuses duplicates) and the tree's thread "
                        "timing makes the run non-deterministic anyway; set it to false")
    if loops:
        problems += [f"data.train_files: {path} has a {ROLLOUT_N_COLUMN} column: verl reads it as that row's number "
                     "of sessions, which aepo_tree never sees (verl pops it first); the tree grows rollout.n leaves, "
                     "so extra sessions fail and missing ones leave leaves unclaimed and the group biased. Drop the "
                     f"column (aepo verl-data never writes it)" for path in files_with_rollout_n(config)]
    if (loss and _get(config, "algorithm.rollout_correction.bypass_mode", False)
            and not _get(config, "trainer.use_v1", True)):
        problems.append("algorithm.rollout_correction.bypass_mode=true with trainer.use_v1=false: verl's legacy "
                        "trainer then replaces actor.policy_loss.loss_mode with its own bypass_mode loss, so the "
                        "aepo/gppo loss would silently not run; use trainer.use_v1=true (its bypass keeps the "
                        "loss, with π_old = the rollout log-probs) or bypass_mode=false (decoupled correction)")
    if loss and _get(config, "distillation.enabled", False):
        problems.append("distillation.enabled=true with actor.policy_loss.loss_mode=aepo/gppo: verl's distillation "
                        "loss calls the policy loss without the entropies and with its own config; not supported")
    return problems


def check_trainer_config(config) -> None:
    """ConfigError listing every refusal; then ``rollout.custom.aepo`` resolved as the agent loop will. A
    config without AEPO's losses or loops passes without loading more of aepo-rl than this module."""
    problems = refusals(config)
    if problems:
        from aepo_rl.config import ConfigError

        raise ConfigError("aepo-rl verl plugin refuses this config:\n  - " + "\n  - ".join(problems))
    if uses_aepo_loops(config):
        from aepo_rl.integrations.verl.agent_loop import loop_settings

        loop_settings(config.actor_rollout_ref.rollout)
