"""AEPO inside TRL's ``GRPOTrainer`` (docs/trl.md): the entropy-balanced loss and the tree rollout.

- :class:`AEPOGRPOConfig` / :class:`AEPOGRPOTrainer`: ``GRPOConfig`` / ``GRPOTrainer`` whose policy
  loss is aepo_rl's ``aepo`` loss (entropy-aware advantage §2.2, stop-gradient upper clip §2.3)
  on the entropies of the training forward itself, aggregated the way TRL's ``loss_type`` says.
- :class:`TreeRolloutFunc`: a ``rollout_func`` that grows one aepo_rl tree (§1) per prompt over
  the trainer's own model, one leaf per row, tool results masked through ``env_mask``.

Only the tested TRL range is accepted (``TRL_RANGE``): this adapter overrides a private method of
``GRPOTrainer`` (``_compute_loss``) and reads its batch layout, which change between releases.
"""

from __future__ import annotations

from packaging.version import Version

TRL_RANGE = (Version("1.16"), Version("1.17"))
"""Tested TRL versions: from the first (inclusive) to the second (exclusive); pyproject's ``[trl]``."""


def check_trl_version(version: str) -> None:
    """Raise ImportError, naming the installed version and the fix, outside :data:`TRL_RANGE`."""
    low, high = TRL_RANGE
    if not low <= Version(version) < high:
        raise ImportError(f"aepo_rl.integrations.trl supports trl>={low},<{high} (it overrides "
                          f"GRPOTrainer._compute_loss and reads its batch layout); trl {version} "
                          "is installed. Install the tested range with pip install -e \".[trl]\" "
                          f"in the aepo-rl clone (or pip install \"trl>={low},<{high}\")")


try:
    import trl as _trl
except ImportError as err:  # the extra is not installed
    raise ImportError("aepo_rl.integrations.trl needs TRL: pip install -e \".[trl]\" in the aepo-rl clone "
                      f"(trl>={TRL_RANGE[0]},<{TRL_RANGE[1]})") from err

check_trl_version(_trl.__version__)

from .rollout import TreeRolloutFunc  # noqa: E402  (after the version gate)
from .trainer import AEPOGRPOConfig, AEPOGRPOTrainer  # noqa: E402

__all__ = ["AEPOGRPOConfig", "AEPOGRPOTrainer", "TRL_RANGE", "TreeRolloutFunc", "check_trl_version"]
