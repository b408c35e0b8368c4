"""The ``verl.plugins`` entry point: verl imports this module in every process that imports verl.

It registers the ``aepo``/``gppo`` policy losses, installs the entropy-forwarding ``ppo_loss`` and the
start-up config check (:mod:`.checks`), and registers the ``aepo_tree``/``aepo_chain`` agent loops *by
name*: their entries (``{"_target_": <class path>}``, all verl's ``register`` stores) go into verl's
agent-loop registry when verl's agent-loop module is imported, and verl imports the loops' module only
when a worker instantiates one. Likewise, when verl imports its sync trainer, the plugin extends it to
log AEPO's rollout metrics (:mod:`.metrics`). So a process that never runs an agent loop (vLLM's engine processes,
the FSDP worker, the model merger) never imports the agent-loop stack. Then it checks all of it,
because verl logs a failing plugin only at DEBUG level: a failure is also written to stderr here
before it is raised.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

EXPECTED_LOSSES = ("aepo", "gppo")
AGENT_LOOPS = {"aepo_tree": "aepo_rl.integrations.verl.agent_loop.AEPOTreeAgentLoop",
               "aepo_chain": "aepo_rl.integrations.verl.agent_loop.AEPOChainAgentLoop"}
EXPECTED_AGENT_LOOPS = tuple(AGENT_LOOPS)
VERL_AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
VERL_TRAINER_SYNC_MODULE = "verl.trainer.ppo.v1.trainer_sync"
LOSS_MODULE = "aepo_rl.integrations.verl.loss"


def register_agent_loops(module) -> None:
    """Put the loops' entries in verl's registry (verl's ``register`` stores exactly this)."""
    for name, target in AGENT_LOOPS.items():
        module._agent_loop_registry.setdefault(name, {"_target_": target})


def _install_metrics(module) -> None:
    from aepo_rl.integrations.verl import metrics

    metrics.install(module)


AFTER_IMPORT = {VERL_AGENT_LOOP_MODULE: register_agent_loops, VERL_TRAINER_SYNC_MODULE: _install_metrics}
"""verl modules the plugin extends, and how, right after verl itself imports them (never earlier)."""


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``AFTER_IMPORT[name](module)`` right after the module ``name`` has executed."""

    busy = False

    def find_spec(self, fullname, path, target=None):
        hook = AFTER_IMPORT.get(fullname)
        if hook is None or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


def install_after_import_hooks() -> None:
    """Extend the modules of AFTER_IMPORT now if verl has imported them, else when it does."""
    for name, hook in AFTER_IMPORT.items():
        if name in sys.modules and not _initialising(name):
            hook(sys.modules[name])
    if not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def _agent_loops_pending() -> bool:
    return any(isinstance(finder, _AfterImport) for finder in sys.meta_path)


def check_registrations() -> None:
    """RuntimeError naming what is missing when a registration did not take."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from aepo_rl.integrations.verl import checks, loss

    missing = [f"policy loss '{name}'" for name in EXPECTED_LOSSES if name not in POLICY_LOSS_REGISTRY]
    agent_loop = sys.modules.get(VERL_AGENT_LOOP_MODULE)
    if agent_loop is not None and hasattr(agent_loop, "_agent_loop_registry"):
        missing += [f"agent loop '{name}'" for name in EXPECTED_AGENT_LOOPS if name not in agent_loop._agent_loop_registry]
    elif not _agent_loops_pending():
        missing.append("the agent loops (no registration hook for verl's agent-loop module)")
    if not loss.installed():
        missing.append("the entropy-forwarding ppo_loss (verl.workers.utils.losses.ppo_loss is not the plugin's)")
    if not checks.installed():
        missing.append("the start-up config check (verl.utils.config.validate_config is not the plugin's)")
    if missing:
        raise RuntimeError(f"aepo-rl verl plugin: not registered: {', '.join(missing)}; reinstall it (pip install -e '.[verl]' in the aepo-rl clone) "
                           "at the same version on every node (docs/verl.md)")


def register_resolvers() -> None:
    """``${aepo_reward_file:}`` (config/aepo_trainer.yaml): the path of the plugin's reward function file."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("aepo_reward_file"):
        import os

        here = os.path.dirname(os.path.abspath(__file__))
        OmegaConf.register_new_resolver("aepo_reward_file", lambda: os.path.join(here, "reward.py"))


def _initialising(name: str) -> bool:
    """``name`` is being imported right now (it imported verl, which ran this plugin)."""
    module = sys.modules.get(name)
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)


def _load() -> None:
    from aepo_rl.integrations.verl import require_verl

    require_verl()
    install_after_import_hooks()
    register_resolvers()
    from aepo_rl.integrations.verl import checks

    checks.install()
    if _initialising(LOSS_MODULE):  # loss.py imported verl: it registers and installs itself when it finishes
        return
    from aepo_rl.integrations.verl import loss  # noqa: F401  (registration on import)

    check_registrations()


try:
    _load()
except Exception as error:  # verl swallows it (DEBUG log); say it where a user looks
    print(f"aepo-rl verl plugin failed to load: {type(error).__name__}: {error}", file=sys.stderr)
    raise
