"""AEPO inside verl (docs/verl.md): the ``aepo``/``gppo`` policy losses, the ``aepo_tree``/``aepo_chain``
agent loops, ``compute_score`` and ``aepo verl-data``.

verl loads :mod:`aepo_rl.integrations.verl.plugin` itself through the ``verl.plugins`` entry point,
in every process that imports verl; the plugin defers every change until verl imports the module it
changes (docs/verl.md, "What the plugin changes in verl"). The modules that import verl at their top
(``loss``, ``agent_loop``) call :func:`require_verl` first; ``reward`` and ``data`` work without verl.
This module imports nothing beyond the standard library: the plugin reads its names during ``import verl``.
"""

from __future__ import annotations

import importlib.metadata

VERL_MIN = (0, 9, 1)
VERL_BELOW = (0, 10)
TESTED_RANGE = "verl>=0.9.1,<0.10"

LOSS_MODES = ("aepo", "gppo")
"""The policy losses the plugin registers (``actor.policy_loss.loss_mode``); verl's ``ppo_loss`` hands the
current entropies to these only."""
AGENT_LOOPS = {"aepo_tree": "aepo_rl.integrations.verl.agent_loop.AEPOTreeAgentLoop",
               "aepo_chain": "aepo_rl.integrations.verl.agent_loop.AEPOChainAgentLoop"}
"""The agent loops the plugin registers by name (``agent_name``, ``rollout.agent.default_agent_loop``)."""


class VerlVersionError(ImportError):
    """verl is missing or outside the range the plugin was tested against."""


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+", 1)[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():  # 0.10.0rc1: stop after the first non-numeric piece
            break
    return tuple(parts)


def require_verl(version: str | None = None) -> str:
    """The installed verl version; VerlVersionError naming the range and the fix outside it.

    ``version`` overrides the installed one (tests). The check reads the package metadata only, so it
    is safe while verl's own ``__init__`` is loading the plugin."""
    if version is None:
        try:
            version = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            raise VerlVersionError(f"aepo_rl.integrations.verl needs verl ({TESTED_RANGE}), which is not installed: "
                                   'pip install -e ".[verl]" in the aepo-rl clone') from None
    release = _release(version)
    if not VERL_MIN <= release < VERL_BELOW:
        raise VerlVersionError(f"aepo_rl.integrations.verl was tested with {TESTED_RANGE}, but verl {version} is "
                               f'installed: pip install "verl>=0.9.1,<0.10" (or pip install -e ".[verl]" in the '
                               "aepo-rl clone). The plugin uses "
                               "verl internals (the ppo_loss name binding, the agent-loop registry) that other "
                               "versions may change")
    return version
