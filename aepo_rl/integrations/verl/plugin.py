"""The ``verl.plugins`` entry point: verl imports this module inside ``import verl``, in every process.

Loading it costs ``import verl`` nothing measurable: it checks verl's version from the package metadata
and puts one finder on ``sys.meta_path`` (standard library only, no other change). Each change the
plugin makes to verl waits for the verl module it changes and is made right after verl itself has
executed that module (:data:`SEAMS`), so a process that never imports that module never sees the change
nor loads what it needs:

- ``verl.trainer.ppo.core_algos``: the ``aepo``/``gppo`` policy losses, through verl's
  ``register_policy_loss``; each loads :mod:`.loss` on its first call;
- ``verl.workers.utils.losses``: ``ppo_loss`` rebound to a wrapper that hands the current entropies to
  those two losses (verl 0.9 passes them to no policy loss); every other loss mode goes to verl's own;
- ``verl.utils.config``: ``validate_config`` followed by the plugin's start-up check (:mod:`.checks`);
- ``verl.experimental.agent_loop.agent_loop``: the ``aepo_tree``/``aepo_chain`` agent loops, by name
  through verl's ``register`` (verl imports the loops' module when a worker builds one);
- ``verl.trainer.ppo.v1.trainer_sync``: the ``sync`` trainer extended to log AEPO's rollout metrics
  (:mod:`.metrics`).

All or nothing: if one change fails (a verl whose symbol moved), the finder undoes every change it made,
leaves ``sys.meta_path`` and says so on stderr (verl logs a failing plugin at DEBUG level only), so verl
is left as it was; a run that asks for ``aepo`` then stops with verl's own unknown-loss error.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

from aepo_rl.integrations.verl import AGENT_LOOPS, LOSS_MODES, require_verl

PPO_LOSS_BINDERS = ("verl.workers.utils.losses", "verl.workers.engine_workers", "verl.trainer.distillation.losses")
"""verl's module of ``ppo_loss``, and the modules that import the name from it (they import it after
the plugin rebinds it; the others are rebound only when the plugin loads after them)."""


def _say(message: str) -> None:
    print(f"aepo-rl verl plugin {message}", file=sys.stderr)


# ------------------------------------------------------------------------------- the changes
# Each takes the verl module right after it executed, makes its change and returns the function that undoes it.

def _policy_loss(name: str):
    """verl's policy-loss signature; loads :mod:`.loss` (aepo_rl's loss core) on its first call."""

    def policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                    rollout_is_weights=None):
        from aepo_rl.integrations.verl import loss

        return loss.POLICY_LOSSES[name](old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                        rollout_is_weights)

    policy_loss.__name__ = policy_loss.__qualname__ = f"{name}_loss"
    policy_loss.__aepo_loss__ = name
    return policy_loss


def register_losses(core_algos):
    taken = [name for name in LOSS_MODES if name in core_algos.POLICY_LOSS_REGISTRY]
    if taken:
        raise RuntimeError(f"verl's policy-loss registry already has {taken} (another plugin or a second copy)")
    for name in LOSS_MODES:
        core_algos.register_policy_loss(name)(_policy_loss(name))

    def undo():
        for name in LOSS_MODES:
            core_algos.POLICY_LOSS_REGISTRY.pop(name, None)

    return undo


def _ppo_loss_with_entropy(original):
    """verl's ``ppo_loss``; for ``loss_mode`` aepo/gppo, :func:`.loss.ppo_loss_with_entropy` runs it with the
    current entropies visible to the loss."""

    @functools.wraps(original)
    def ppo_loss(config, model_output, data, dp_group=None):
        policy_loss = config.get("policy_loss", None)
        mode = policy_loss.get("loss_mode", "vanilla") if policy_loss is not None else "vanilla"
        if mode not in LOSS_MODES:
            return original(config, model_output, data, dp_group)
        from aepo_rl.integrations.verl import loss

        return loss.ppo_loss_with_entropy(original, config, model_output, data, dp_group)

    ppo_loss.__aepo_wrapper__ = True
    return ppo_loss


def wrap_ppo_loss(losses):
    original = losses.ppo_loss
    if getattr(original, "__aepo_wrapper__", False):
        raise RuntimeError("verl's ppo_loss is already wrapped by another copy of the plugin")
    wrapper = _ppo_loss_with_entropy(original)
    for module in (sys.modules.get(name) for name in PPO_LOSS_BINDERS):
        if module is not None and getattr(module, "ppo_loss", None) is original:
            module.ppo_loss = wrapper

    def undo():
        for module in (sys.modules.get(name) for name in PPO_LOSS_BINDERS):
            if module is not None and getattr(module, "ppo_loss", None) is wrapper:
                module.ppo_loss = original

    return undo


def wrap_validate_config(config_module):
    original = config_module.validate_config
    if getattr(original, "__aepo_wrapper__", False):
        raise RuntimeError("verl's validate_config is already wrapped by another copy of the plugin")

    @functools.wraps(original)
    def validate_config(config, *args, **kwargs):
        result = original(config, *args, **kwargs)
        from aepo_rl.integrations.verl import checks

        checks.check_trainer_config(config)
        return result

    validate_config.__aepo_wrapper__ = True
    config_module.validate_config = validate_config

    def undo():
        if config_module.validate_config is validate_config:
            config_module.validate_config = original

    return undo


def register_agent_loops(agent_loop):
    """verl's ``register(name)`` stores ``{"_target_": <module>.<qualname>}`` of the class it decorates: a
    stand-in with the loop's names gives the same entry without importing the loops' module."""
    taken = [name for name in AGENT_LOOPS if name in agent_loop._agent_loop_registry]
    if taken:
        raise RuntimeError(f"verl's agent-loop registry already has {taken} (another plugin or a second copy)")
    for name, target in AGENT_LOOPS.items():
        module, _, qualname = target.rpartition(".")
        agent_loop.register(name)(type(qualname, (), {"__module__": module, "__qualname__": qualname}))

    def undo():
        for name in AGENT_LOOPS:
            agent_loop._agent_loop_registry.pop(name, None)

    return undo


def extend_sync_trainer(trainer_sync):
    from aepo_rl.integrations.verl import metrics

    return metrics.install(trainer_sync)


SEAMS = {
    "verl.trainer.ppo.core_algos": register_losses,
    "verl.workers.utils.losses": wrap_ppo_loss,
    "verl.utils.config": wrap_validate_config,
    "verl.experimental.agent_loop.agent_loop": register_agent_loops,
    "verl.trainer.ppo.v1.trainer_sync": extend_sync_trainer,
}
"""verl module -> the change made right after verl executes it. One set: all of them or none."""


def _trainer_extended(trainer_sync) -> bool:
    from verl.trainer.ppo.v1 import trainer_base

    return trainer_base.TRAINER_REGISTRY.get("sync") is not trainer_sync.PPOTrainerSync


IN_PLACE = {
    "verl.trainer.ppo.core_algos": lambda m: all(
        getattr(m.POLICY_LOSS_REGISTRY.get(name), "__aepo_loss__", None) == name for name in LOSS_MODES),
    "verl.workers.utils.losses": lambda m: getattr(m.ppo_loss, "__aepo_wrapper__", False),
    "verl.utils.config": lambda m: getattr(m.validate_config, "__aepo_wrapper__", False),
    "verl.experimental.agent_loop.agent_loop": lambda m: all(m._agent_loop_registry.get(name) == {"_target_": target}
                                                             for name, target in AGENT_LOOPS.items()),
    "verl.trainer.ppo.v1.trainer_sync": _trainer_extended,
}
"""verl module -> whether the plugin's change is what verl now holds (:func:`check_registrations`)."""


# ------------------------------------------------------------------------------- the finder

class Plugin(importlib.abc.MetaPathFinder):
    """The plugin's one object in a process (on ``sys.meta_path``): it applies :data:`SEAMS` as verl imports
    their modules, remembers how to undo each, and on the first failure undoes all and steps aside."""

    def __init__(self, seams: dict | None = None):
        self.seams = dict(SEAMS if seams is None else seams)
        self.applied: dict[str, object] = {}
        self.failed: BaseException | None = None
        self._resolving: set[str] = set()

    # -- the import hook
    def find_spec(self, fullname, path, target=None):
        if fullname not in self.seams or fullname in self._resolving or self.failed is not None:
            return None
        self._resolving.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._resolving.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.apply(fullname, module)

        spec.loader.exec_module = exec_module
        return spec

    # -- the changes
    def apply(self, name: str, module) -> bool:
        """Make the change of ``name`` (once); on failure undo every change and leave sys.meta_path."""
        if self.failed is not None or name in self.applied:
            return self.failed is None
        try:
            self.applied[name] = self.seams[name](module)
        except Exception as error:  # a verl that moved a symbol: leave verl as it was
            self.fail(name, error)
            return False
        return True

    def fail(self, name: str, error: BaseException) -> None:
        self.failed = error
        undone = self.undo()
        _say(f"failed to extend {name}: {type(error).__name__}: {error}; it undid its changes to verl "
             f"({', '.join(undone) or 'none made yet'}) and makes no more, so verl runs as without it and "
             "loss_mode aepo/gppo and the aepo agent loops are unavailable. It was tested with verl 0.9.1 "
             "(docs/verl.md, \"What the plugin changes in verl\")")

    def undo(self) -> list[str]:
        """Undo every change made, newest first; the names undone."""
        undone = []
        for name, undo in reversed(list(self.applied.items())):
            try:
                undo()
            except Exception as error:  # keep undoing the others
                _say(f"could not undo its change to {name}: {type(error).__name__}: {error}")
            undone.append(name)
        self.applied.clear()
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return undone

    def missing(self) -> list[str]:
        """The changes not in place although verl has imported their module (what :data:`IN_PLACE` sees)."""
        return [name for name in self.seams
                if name in sys.modules and not _initialising(name)
                and (name not in self.applied or not IN_PLACE[name](sys.modules[name]))]


def _initialising(name: str) -> bool:
    module = sys.modules.get(name)
    return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)


def find() -> Plugin | None:
    """This process's plugin (on sys.meta_path), if it loaded and has not failed."""
    return next((f for f in sys.meta_path if isinstance(f, Plugin)), None)


def install(seams: dict | None = None) -> Plugin:
    """Put the plugin on sys.meta_path (once) and apply the changes of the verl modules already imported
    (``import verl`` itself imports ``verl.utils.config``); the rest wait for their module."""
    plugin = find()
    if plugin is not None:
        return plugin
    plugin = Plugin(seams)
    sys.meta_path.insert(0, plugin)
    for name in plugin.seams:
        if name in sys.modules and not _initialising(name) and not plugin.apply(name, sys.modules[name]):
            break  # it undid what it made and said why on stderr
    return plugin


def check_registrations() -> None:
    """RuntimeError naming what is missing of the changes whose verl module is imported."""
    plugin = find()
    if plugin is None:
        raise RuntimeError("aepo-rl verl plugin: not loaded (or failed: see its line on stderr); reinstall it "
                           "(pip install -e '.[verl]' in the aepo-rl clone) at the same version on every node "
                           "(docs/verl.md)")
    missing = plugin.missing()
    if missing:
        raise RuntimeError(f"aepo-rl verl plugin: not applied to {', '.join(missing)}; reinstall it (pip install -e "
                           "'.[verl]' in the aepo-rl clone) at the same version on every node (docs/verl.md)")


def _load() -> None:
    require_verl()
    install()


try:
    _load()
except Exception as error:  # verl swallows it (DEBUG log); say it where a user looks
    _say(f"failed to load: {type(error).__name__}: {error}")
    raise
