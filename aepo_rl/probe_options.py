"""What ``aepo probe`` measures and the options it takes (docs/mechanisms.md): the command line's parser reads
them without loading the probes themselves (torch, the trainer)."""

from __future__ import annotations

from dataclasses import dataclass

from aepo_rl.config import Config, ConfigError

CLAIMS = {
    "premonitor": "paper §1.3: a prompt whose root entropy is high relative to its tool-call entropy gets more "
                  "global samples (m rises with H_root − H_tool_avg); otherwise the budget goes to branching",
    "branch-penalty": "paper §1.4: the penalty (1 − λ·l) curbs consecutive high-entropy branching along one path, "
                      "so fewer branch events at l ≥ 2, a smaller largest subtree and more distinct answers per tree",
    "fork-choice": "ARPO/AEPO §1.4: forking where the step entropy is high finds better continuations than forking "
                   "at random, so the entropy-chosen children succeed more often",
    "clip-gradient": "paper §2.3: keeping the gradient of upper-clipped (high-entropy) tokens sustains exploration: "
                     "the kept gradient raises the entropy and the high-entropy tokens' log-probs",
}
PROBES = tuple(CLAIMS)


@dataclass
class ProbeOptions:
    """What ``aepo probe`` takes besides the config (docs/mechanisms.md gives the defaults' reasons)."""

    prompts: int = 32
    """Prompts to probe (premonitor, branch-penalty, fork-choice)."""
    batches: int = 8
    """clip-gradient: RL batches of trainer.batch_size prompts, each probed on all its mini-batches."""
    seeds: int = 2
    """Rollout seeds per prompt (rollout.seed, rollout.seed + 1, ...)."""
    split: str = "train"
    penalty: float | None = None
    """branch-penalty: λ of the penalised arm (the other has λ = 0); None: rollout.branch_penalty."""
    n: int = 16
    """branch-penalty: trajectories per tree."""
    global_samples: int = 2
    """branch-penalty: global samples m per tree (the rest is the branching budget)."""
    children: int = 4
    """fork-choice: children per fork point."""
    stale_steps: int = 4
    """clip-gradient: k, the optimizer steps between π_old and the probed policy."""

    def check(self, probe: str, cfg: Config) -> None:
        """Refuse bad values before any model is built."""
        if probe not in PROBES:
            raise ConfigError(f"unknown probe '{probe}'; choose one of: {', '.join(PROBES)}")
        for name in ("prompts", "batches", "seeds", "children", "stale_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if probe == "branch-penalty":
            penalty = cfg.rollout.branch_penalty if self.penalty is None else self.penalty
            if not 0 < penalty:
                raise ConfigError(f"the penalty must be > 0 (the other arm has λ = 0), got {penalty} "
                                  f"({'rollout.branch_penalty' if self.penalty is None else '--penalty'})")
            if not 1 <= self.global_samples < self.n:
                raise ConfigError(f"--global-samples must be in [1, --n): got {self.global_samples} with --n {self.n}; "
                                  "the rest of the n trajectories is the branching budget")
