"""Warnings that a run is going wrong, each with its cause and its fix (docs/training.md "Staying on-policy").

:class:`RunHealth` reads each RL step's metrics and returns a warning the first time a condition has held
for ``trainer.warn_steps`` consecutive steps (entropy: over ``trainer.warn_entropy_window`` steps); each
kind fires once per run. It is pure bookkeeping: :class:`aepo_rl.train.logger.RunLogger` prints what it
returns and appends it to the run folder's ``warnings.jsonl``. The thresholds and their measured basis
are in docs/training.md; the defaults come from the multi-hop study's autopsy (clip fraction 0.02–0.4% and
``actor/ppo_kl`` < 0.01 in regimes that improved, 2–6% and 0.08–0.10 in the collapsing C7 regime).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

ENTROPY_CHANGE = 0.5
"""Entropy warning: the mean of the window's last third is below (1 − this) or above (1 + this) times the mean
of its first third."""
ENTROPY_MONOTONE = 0.7
"""Entropy warning: at least this share of the window's step-to-step changes go the same way."""


@dataclass
class RunHealth:
    """The warning conditions of one run over its steps' metrics (``trainer.warn_*``)."""

    warn_steps: int = 3
    clipfrac: float = 0.02
    ppo_kl: float = 0.02
    mismatch_kl: float = 0.001
    entropy_window: int = 10
    target_kl: float | None = None
    bypass: bool = False
    """Rollout Correction's bypass mode: ``rollout_corr/*`` then compares π_rollout with the policy being updated."""
    fired: set[str] = field(default_factory=set)
    streaks: dict[str, int] = field(default_factory=dict)
    entropies: deque = field(default_factory=deque)

    @classmethod
    def from_config(cls, trainer, rollout_correction=None) -> RunHealth:
        """From ``cfg.trainer`` (a TrainerConfig) and, when given, ``cfg.algorithm.rollout_correction``."""
        return cls(trainer.warn_steps, trainer.warn_clipfrac, trainer.warn_ppo_kl, trainer.warn_mismatch_kl,
                   trainer.warn_entropy_window, trainer.target_kl,
                   bypass=bool(rollout_correction is not None and rollout_correction.bypass_mode))

    def check(self, step: int, metrics: dict[str, float]) -> list[tuple[str, str]]:
        """(kind, message) of every warning that fires at ``step`` (each kind once per run)."""
        out = []
        for kind, message in self._conditions(metrics):
            self.streaks[kind] = self.streaks.get(kind, 0) + 1 if message else 0
            if message and self.streaks[kind] >= self.warn_steps and kind not in self.fired:
                self.fired.add(kind)
                out.append((kind, f"step {step}: {message}"))
        entropy = self._entropy_trend(metrics)
        if entropy and "entropy" not in self.fired:
            self.fired.add("entropy")
            out.append(("entropy", f"step {step}: {entropy}"))
        return out

    def _conditions(self, m: dict[str, float]) -> list[tuple[str, str | None]]:
        """(kind, message if its condition holds at this step, else None) of the streak-counted warnings."""
        n = self.warn_steps
        no_signal = None
        if m.get("rollout/informative_group_frac", 1.0) == 0 or m.get("actor/grad_norm", 1.0) == 0 \
                or m.get("actor/skipped_update", 0.0) > 0:
            no_signal = (f"no learning signal for {n} steps: every group's scores were equal (zero std, so the GRPO "
                         "advantage is 0 everywhere) or the gradient norm was 0; the optimizer moves the weights on "
                         "Adam's momentum alone. Fix: give the policy a reachable task (a better SFT model, an easier "
                         "task, more samples per prompt: rollout.n), or algorithm.dynamic_sampling=true to train only "
                         "on groups with distinct scores")
        clip, kl = m.get("actor/pg_clipfrac"), m.get("actor/ppo_kl")
        off_policy = None
        if (clip is not None and clip > self.clipfrac) or (kl is not None and kl > self.ppo_kl):
            off_policy = (f"far off-policy for {n} steps: actor/pg_clipfrac {clip or 0:.2%} (warns above "
                          f"{self.clipfrac:.2%}; normal 0.1-0.5%), actor/ppo_kl {kl or 0:.3g} (warns above "
                          f"{self.ppo_kl:g}): the samples are being reused too hard. {self._reuse_fix(m)}")
        mismatch, k3 = None, m.get("rollout_corr/k3_kl")
        if k3 is not None and k3 > self.mismatch_kl:
            seen = f"for {n} steps: rollout_corr/k3_kl {k3:.3g} (warns above {self.mismatch_kl:g})"
            mismatch = (f"training-rollout drift {seen}. In bypass mode this compares the rollout's log-probs with "
                        "the policy being updated, so it measures how far the step's own updates moved the policy "
                        f"(an engine disagreement adds to it). {self._reuse_fix(m)}" if self.bypass else
                        f"training-rollout mismatch {seen}: the engine that sampled and the trainer disagree on the "
                        "sampled tokens' log-probs (precision, another implementation, stale weights), or the engine "
                        "records the tempered distribution it sampled from "
                        "(rollout.logprobs_mode=processed_logprobs) and the trainer trains the untempered policy, a "
                        "real temperature gap. Fix: algorithm.rollout_correction.rollout_is=token (truncated "
                        "importance weights), rollout_rs to reject the worst tokens, or bypass_mode=true; or align "
                        "them (trainer.bf16, weight sync, algorithm.tempered_logprobs=true for the temperature)")
        return [("no_signal", no_signal), ("off_policy", off_policy), ("mismatch", mismatch)]

    def _reuse_fix(self, m: dict[str, float]) -> str:
        """The fix for samples reused too hard; with the target-KL guard on, that the guard is already there and
        bounds the drift, not its cause (in the C7 runs it raised every seed, none back to its SFT model)."""
        fix = ("fewer optimizer steps per RL step (trainer.ppo_epochs=1, a larger trainer.mini_batch_size), "
               "a lower trainer.lr")
        if self.target_kl is None:
            return f"Fix: {fix}, or trainer.target_kl (e.g. 0.02) to stop an RL step's updates once they drift that far"
        cut = m.get("actor/early_stop_frac")
        cut = f", leaving out {cut:.0%} of this step's mini-batches" if cut is not None else ""
        return (f"trainer.target_kl={self.target_kl:g} is on{cut}: it stops each step's drift at its bound but not "
                f"what causes it. Fix: {fix}")

    def _entropy_trend(self, m: dict[str, float]) -> str | None:
        """A message when ``actor/entropy`` halved or grew by half over the window (its last third's mean against
        its first third's), moving that way in at least :data:`ENTROPY_MONOTONE` of its steps."""
        entropy = m.get("actor/entropy")
        if entropy is None:
            return None
        self.entropies.append(entropy)
        if len(self.entropies) > self.entropy_window:
            self.entropies.popleft()
        if len(self.entropies) < self.entropy_window:
            return None
        values = list(self.entropies)
        # The ends are the means of the window's first and last thirds, not single steps: one noisy step at an
        # end (a spike before a short dip inside a long climb, the C7 run's step 49) cannot make the change.
        third = max(1, len(values) // 3)
        first, last = sum(values[:third]) / third, sum(values[-third:]) / third
        steps = [b - a for a, b in zip(values, values[1:])]
        if first > 0 and last <= (1 - ENTROPY_CHANGE) * first \
                and sum(d < 0 for d in steps) >= ENTROPY_MONOTONE * len(steps):
            return (f"entropy collapsing: actor/entropy fell from {first:.3g} to {last:.3g} (means of {third} steps) "
                    f"over {len(values)} steps; "
                    "the policy stops exploring and its groups stop differing. Fix: clip-higher "
                    "(algorithm.clip_ratio_high=0.28), a lower trainer.lr, or a small algorithm.entropy_coeff")
        if last >= (1 + ENTROPY_CHANGE) * first and sum(d > 0 for d in steps) >= ENTROPY_MONOTONE * len(steps):
            return (f"entropy climbing: actor/entropy rose from {first:.3g} to {last:.3g} (means of {third} steps) "
                    f"over {len(values)} steps; "
                    "in the study's collapsing runs this came with lower-bound clipping from reused samples, "
                    f"flattening the distribution. {self._reuse_fix(m)}")
        return None
