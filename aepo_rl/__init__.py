"""aepo-rl: Agentic Entropy-Balanced Policy Optimization (arXiv 2510.14545) and its baselines."""

__version__ = "0.1.0"

__all__ = ["AEPOTrainer", "TrainerCallback", "__version__"]


def __getattr__(name: str):
    """``aepo_rl.AEPOTrainer`` and ``aepo_rl.TrainerCallback``, imported on first use (``import aepo_rl`` stays
    light: the command line reads its config before torch is imported)."""
    if name in ("AEPOTrainer", "TrainerCallback"):
        from aepo_rl import api

        return getattr(api, name)
    raise AttributeError(f"module 'aepo_rl' has no attribute {name!r}")
