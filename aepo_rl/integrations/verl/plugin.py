"""The ``verl.plugins`` entry point: verl imports this module in every process that imports verl.

It registers the ``aepo``/``gppo`` policy losses and the ``aepo_tree``/``aepo_chain`` agent loops,
installs the entropy-forwarding ``ppo_loss`` and then checks all of it, because verl logs a failing
plugin only at DEBUG level: a failure is also written to stderr here before it is raised.
"""

from __future__ import annotations

import sys

EXPECTED_LOSSES = ("aepo", "gppo")
EXPECTED_AGENT_LOOPS = ("aepo_tree", "aepo_chain")


def check_registrations() -> None:
    """RuntimeError naming what is missing when a registration did not take."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    from aepo_rl.integrations.verl import loss

    missing = [f"policy loss '{name}'" for name in EXPECTED_LOSSES if name not in POLICY_LOSS_REGISTRY]
    missing += [f"agent loop '{name}'" for name in EXPECTED_AGENT_LOOPS if name not in _agent_loop_registry]
    if not loss.installed():
        missing.append("the entropy-forwarding ppo_loss (verl.workers.utils.losses.ppo_loss is not the plugin's)")
    if missing:
        raise RuntimeError(f"aepo-rl verl plugin: not registered: {', '.join(missing)}; reinstall it (pip install -e '.[verl]' in the aepo-rl clone) "
                           "at the same version on every node (docs/verl.md)")


def _load() -> None:
    from aepo_rl.integrations.verl import require_verl

    require_verl()
    from aepo_rl.integrations.verl import agent_loop, loss  # noqa: F401  (registration on import)

    check_registrations()


try:
    _load()
except Exception as error:  # verl swallows it (DEBUG log); say it where a user looks
    print(f"aepo-rl verl plugin failed to load: {type(error).__name__}: {error}", file=sys.stderr)
    raise
