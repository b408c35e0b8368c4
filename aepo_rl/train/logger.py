"""Where a run's metrics go: ``metrics.jsonl``, TensorBoard, Weights & Biases, the console; and its warnings.

``metrics.jsonl`` holds one JSON object per RL step with its ``step`` (verl metric names, §7).
On resume the file is rewritten from the checkpoint's metric history, so a step that was in
flight when the run died never appears twice. The console shows the RL phase's progress
(``aepo_rl.progress``: a bar with an ETA on a terminal, plain lines otherwise) and one compact line
of key metrics per step, with the share of zero-std groups (``zero-std``: groups whose scores are all
equal, which give no GRPO advantage).

Warnings (:mod:`aepo_rl.train.health`: no learning signal, far off-policy, entropy trend, training-rollout
mismatch) are printed once each, with their cause and fix, and appended to ``warnings.jsonl``
(``{"step", "kind", "message"}`` per line); on resume the history replays through the checks, so a
warning already given is not repeated and the file keeps only the checkpoint's steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from aepo_rl.progress import PhaseProgress, get_console
from aepo_rl.train.checkpoint import atomic_write_text
from aepo_rl.train.health import RunHealth

CONSOLE_KEYS = [("critic/score/mean", "score"), ("actor/pg_loss", "pg_loss"), ("actor/entropy", "entropy"),
                ("actor/pg_clipfrac", "clip"), ("tool_call_counts/mean", "tools"),
                ("response_length/mean", "len"), ("rollout/branches_per_prompt", "branches"),
                ("timing_s/step", "s")]
"""(metric, short label) shown on the per-step console line."""


def _jsonable(metrics: dict) -> dict:
    """Floats as JSON allows (NaN/Inf become null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


class RunLogger:
    """Fan a step's metrics out to every sink; use as a context manager."""

    def __init__(self, run_dir: str | Path, *, total_steps: int, history: list[dict], tensorboard: bool = True,
                 wandb_project: str | None = None, run_name: str = "", config: dict | None = None,
                 console: Console | None = None, health: RunHealth | None = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.warnings_path = self.run_dir / "warnings.jsonl"
        self.console = console or get_console()
        atomic_write_text(self.metrics_path, "".join(json.dumps(_jsonable(m)) + "\n" for m in history))
        self._file = open(self.metrics_path, "a")
        self.health = health
        kept = []
        if health is not None:
            for record in history:
                health.check(record["step"], record)
            last = history[-1]["step"] if history else 0
            if self.warnings_path.exists():
                kept = [line for line in self.warnings_path.read_text().splitlines()
                        if line.strip() and json.loads(line)["step"] <= last]
            atomic_write_text(self.warnings_path, "".join(line + "\n" for line in kept))
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.console.print("trainer.tensorboard is on but tensorboard is not installed: pip install -e "
                                   "'.[tensorboard]' in the aepo-rl clone, or set trainer.tensorboard=false "
                                   "(continuing without event files; metrics.jsonl has every metric)",
                                   style="yellow", markup=False)
            else:
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self._wandb = None
        if wandb_project:
            try:
                import wandb
            except ImportError:
                self.console.print(f"trainer.wandb_project={wandb_project!r} is set but wandb is not installed: "
                                   "pip install -e '.[wandb]' in the aepo-rl clone (continuing without W&B)",
                                   style="yellow", markup=False)
            else:
                self._wandb = wandb.init(project=wandb_project, name=run_name, id=run_name or None,
                                         resume="allow", dir=str(self.run_dir), config=config or {})
        self._progress = PhaseProgress("RL", total_steps, completed=len(history), console=self.console)

    def __enter__(self) -> RunLogger:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self, step: int, metrics: dict[str, float]) -> dict:
        """Record step ``step``'s metrics everywhere; returns the record written to metrics.jsonl."""
        record = {"step": step, **metrics}
        self._file.write(json.dumps(_jsonable(record)) + "\n")
        self._file.flush()
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                if self._tb is not None:
                    self._tb.add_scalar(key, value, step)
        if self._tb is not None:
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        self.console.print(self.format_line(step, metrics), markup=False, highlight=False, soft_wrap=True)
        if self.health is not None:
            for kind, message in self.health.check(step, metrics):
                self.console.print(f"WARNING ({kind}) {message}", style="yellow", markup=False, highlight=False,
                                   soft_wrap=True)
                with open(self.warnings_path, "a") as f:
                    f.write(json.dumps({"step": step, "kind": kind, "message": message}) + "\n")
        self._progress.advance()
        return record

    @staticmethod
    def format_line(step: int, metrics: dict[str, float]) -> str:
        parts = [f"step {step:>4}"]
        parts += [f"{label} {metrics[key]:.3g}" for key, label in CONSOLE_KEYS if key in metrics]
        if "rollout/informative_group_frac" in metrics:
            parts.insert(2, f"zero-std {1 - metrics['rollout/informative_group_frac']:.0%}")
        return " | ".join(parts)

    def close(self) -> None:
        self._progress.__exit__(None, None, None)
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
