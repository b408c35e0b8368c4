"""The main job, ``aepo train``: task → tiny model → cold-start SFT → eval → RL → eval → plots (§5).

A run lives in ``runs/<run_name>/`` (docs/architecture.md, Contracts: run folder)::

    config.yaml              the fully resolved config (``aepo_rl.config.from_dict`` reads it back)
    metrics.jsonl            one JSON object per RL step, verl metric names (§7), with "step"
    eval.json                {"sft": {"<task>/<split>": {...}}, "rl": {...}}
    sft_metrics.json         what cold-start SFT reported
    checkpoints/sft/         the SFT model (HF folder); every preset of `aepo compare` starts here
    checkpoints/step_<k>/    model/ (HF folder) + trainer_state.pt, the newest trainer.keep_checkpoints
    rollouts/step_<k>.jsonl  trainer.rollouts_to_save trajectories of step k, with score and advantage
    plots/*.png              reward, pass@1, entropy, clip fractions, branching, tool calls, length
    tensorboard/             event files (trainer.tensorboard)

``aepo train --resume runs/X`` reuses every finished stage and continues RL from the last
complete checkpoint. The first Ctrl-C finishes the step in flight, saves and exits; a second
one aborts at once (the last checkpoint on disk stays valid).
"""

from __future__ import annotations

import copy
import json
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from rich.console import Console
from rich.table import Table

from aepo_rl import registry
from aepo_rl.config import Config, ConfigError, from_dict, to_dict, to_yaml
from aepo_rl.engines import build_engine
from aepo_rl.evaluate import evaluate
from aepo_rl.models import apply_lora, load_policy, save_policy
from aepo_rl.tasks.base import Task
from aepo_rl.train import checkpoint as ckpt
from aepo_rl.train.logger import RunLogger
from aepo_rl.train.rl import RLTrainer

console = Console()


# ----------------------------------------------------------------------------------------------
# The main job


def train_main(cfg: Config | None, resume: str | None = None) -> int:
    """``aepo train``: the whole pipeline in one run folder; returns the process exit code."""
    if resume is not None:
        run_dir = Path(resume)
        cfg = load_run_config(run_dir)
        console.print(f"[bold]resuming[/] {run_dir}")
    else:
        run_dir = new_run_dir(cfg)
        ckpt.atomic_write_text(run_dir / "config.yaml", to_yaml(cfg))
        console.print(f"[bold]run folder[/] {run_dir}")
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}

    def timed(stage: str, start: float) -> None:
        seconds[stage] = time.perf_counter() - start

    try:
        t0 = time.perf_counter()
        task = _get_task(cfg)
        init_model_dir = run_sft_stage(cfg, run_dir, task=task)
        timed("task+model+SFT", t0)
        results = _read_json(run_dir / "eval.json")
        if "sft" not in results:
            t0 = time.perf_counter()
            results["sft"] = evaluate_model(cfg, init_model_dir, task)
            ckpt.atomic_write_text(run_dir / "eval.json", json.dumps(results, indent=2))
            timed("SFT eval", t0)
        if "rl" not in results:
            t0 = time.perf_counter()
            results["rl"] = run_rl_stage(cfg, init_model_dir, run_dir, task=task)
            timed("RL+eval", t0)
    except KeyboardInterrupt as stop:  # RunInterrupted (RL saved its last step) or Ctrl-C in SFT/eval
        where = f"after RL step {stop.step}" if isinstance(stop, RunInterrupted) else "before RL finished"
        console.print(f"[yellow]stopped {where}; continue with: aepo train --resume {run_dir}[/]")
        return 130
    write_plots(run_dir)
    console.print(before_after_table(results))
    stages = ", ".join(f"{stage} {value:.0f} s" for stage, value in seconds.items())
    console.print(f"done in {time.perf_counter() - t_start:.0f} s ({stages}); results in {run_dir}")
    return 0


def new_run_dir(cfg: Config) -> Path:
    """``<trainer.run_dir>/<trainer.run_name or preset-timestamp>``; refuses to overwrite a run."""
    name = cfg.trainer.run_name or f"{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.trainer.run_dir) / name
    if (run_dir / "config.yaml").exists():
        raise FileExistsError(f"{run_dir} already holds a run: continue it with `aepo train --resume {run_dir}` "
                              "or choose another trainer.run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def load_run_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there (is it a run folder made by `aepo train`?)")
    return from_dict(yaml.safe_load(path.read_text()))


# ----------------------------------------------------------------------------------------------
# Stages


def run_sft_stage(cfg: Config, run_dir: str | Path, *, task: Task | None = None) -> str:
    """Cold-start SFT (§5) into ``<run_dir>/checkpoints/sft``; reused when it already exists.

    A real model (``model.path`` set) with ``sft.epochs == 0`` skips SFT: its own path is returned.
    """
    if cfg.model.path is not None and cfg.sft.epochs == 0:
        return cfg.model.path
    sft_dir = Path(run_dir) / "checkpoints" / "sft"
    if (sft_dir / "config.json").is_file():
        console.print(f"SFT model found: {sft_dir}")
        return str(sft_dir)
    from aepo_rl.train.sft import dev_demonstrations, run_sft

    task = task or _get_task(cfg)
    model, tokenizer = load_policy(cfg, task)
    metrics: dict = {}
    if cfg.sft.epochs > 0:
        demonstrations = task.demonstrations()
        if not demonstrations:
            raise ValueError(f"task {task.name!r} has no demonstrations for cold-start SFT; set sft.epochs=0 "
                             "and model.path to a model that already follows the tool protocol")
        console.print(f"[bold]cold-start SFT[/] on {len(demonstrations)} demonstrations, {cfg.sft.epochs} epochs")
        metrics = run_sft(cfg, model, tokenizer, demonstrations, dev_demonstrations(task))
    ckpt.atomic_write_text(Path(run_dir) / "sft_metrics.json", json.dumps(metrics, indent=2, default=float))
    save_policy(model, tokenizer, sft_dir)
    return str(sft_dir)


class RunInterrupted(KeyboardInterrupt):
    """RL stopped by Ctrl-C; ``step`` is the last completed (and, after a first Ctrl-C, saved) step."""

    def __init__(self, step: int):
        super().__init__(f"interrupted after step {step}")
        self.step = step


def run_rl_stage(cfg: Config, init_model_dir: str, run_dir: str | Path, *, task: Task | None = None) -> dict:
    """RL from ``init_model_dir``, then evaluation of the final policy on ``eval.split``.

    Resumes from the newest ``<run_dir>/checkpoints/step_<k>`` when there is one. Returns
    ``{"<task>/<split>": {"pass@1", "pass@k", "k", "num_questions", ...}}``, also stored as
    ``eval.json["rl"]``. Raises :class:`RunInterrupted` after Ctrl-C.
    """
    if not registry.ENGINES.capabilities(cfg.rollout.engine)["shares_weights"]:
        sharing = [name for name in registry.ENGINES if registry.ENGINES.capabilities(name)["shares_weights"]]
        raise ConfigError(f"rollout.engine={cfg.rollout.engine!r}: the built-in RL trainer needs an engine that shares "
                          f"the policy's weights (a server would keep sampling the old policy): one of {sharing}")
    run_dir = Path(run_dir)
    task = task or _get_task(cfg)
    trainer, history = _rl_trainer(cfg, init_model_dir, run_dir / "checkpoints", task)
    eval_examples = _eval_examples(cfg, task)
    _rl_steps(cfg, trainer, run_dir, init_model_dir, history, eval_examples)
    results = evaluate(trainer.engine, task, eval_examples, cfg, cfg.eval.split)
    stored = _read_json(run_dir / "eval.json")
    stored["rl"] = results
    ckpt.atomic_write_text(run_dir / "eval.json", json.dumps(stored, indent=2))
    return results


def _rl_trainer(cfg: Config, init_model_dir: str, checkpoint_dir: Path, task: Task) -> tuple[RLTrainer, list[dict]]:
    """The trainer, fresh from ``init_model_dir`` or as it was at the newest complete checkpoint, and the
    metrics of the steps done so far."""
    ckpt.remove_partial_checkpoints(checkpoint_dir)
    latest = ckpt.latest_checkpoint(checkpoint_dir)
    state = ckpt.load_trainer_state(latest) if latest else None
    model, tokenizer = _rl_policy(cfg, init_model_dir, latest, state["adapter"] if state else None, task)
    engine = build_engine(cfg, model, tokenizer)
    kl_on = cfg.algorithm.use_kl_loss or cfg.algorithm.use_kl_in_reward
    ref_model = _load_policy_from(cfg, init_model_dir, task)[0] if kl_on else None
    trainer = RLTrainer(cfg, model, tokenizer, task, engine, ref_model=ref_model)
    if state is None:
        return trainer, []
    trainer.load_state_dict(state["trainer"])
    ckpt.set_rng_state(state["rng"], engine)
    console.print(f"resuming RL after step {trainer.global_step} from {latest}")
    return trainer, state["metrics"]


def _rl_policy(cfg: Config, init_model_dir: str, latest: Path | None, adapter: dict | None, task: Task):
    """The policy to train (with LoRA adapters when ``model.lora_rank`` > 0) and its tokenizer: the model
    of ``latest`` (the newest checkpoint) or else ``init_model_dir``.

    A LoRA checkpoint's folder holds the adapters merged into the weights, so base and ``adapter``
    (the checkpoint's adapter weights) are rebuilt exactly instead.
    """
    random.seed(cfg.trainer.seed)  # before LoRA initialises its adapters; a resumed run restores its own state
    np.random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    if adapter is not None:
        model, tokenizer = _load_policy_from(cfg, init_model_dir, task)
        model = apply_lora(model, cfg.model)
        model.load_state_dict(adapter, strict=False)
        return model, tokenizer
    model, tokenizer = _load_policy_from(cfg, str(latest / "model") if latest else init_model_dir, task)
    return apply_lora(model, cfg.model), tokenizer


def _rl_steps(cfg: Config, trainer: RLTrainer, run_dir: Path, init_model_dir: str, history: list[dict],
              eval_examples: list) -> None:
    """RL steps up to ``trainer.steps``: log each, write its rollouts, evaluate every ``trainer.eval_every``
    and checkpoint every ``trainer.save_every`` steps and at the end.

    The first Ctrl-C finishes the step in flight, saves it and raises :class:`RunInterrupted`; a
    second one aborts mid-step (the last complete checkpoint stays valid).
    """
    with RunLogger(run_dir, total_steps=cfg.trainer.steps, history=history, tensorboard=cfg.trainer.tensorboard,
                   wandb_project=cfg.trainer.wandb_project, run_name=run_dir.name, config=to_dict(cfg),
                   console=console) as logger, StopOnSigint() as stop:
        try:
            while trainer.global_step < cfg.trainer.steps:
                metrics = trainer.step()
                step = trainer.global_step
                if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0:
                    for key, result in evaluate(trainer.engine, trainer.task, eval_examples, cfg,
                                                cfg.eval.split).items():
                        metrics.update({f"eval/{key}/{name}": float(result[name]) for name in ("pass@1", "pass@k")})
                history.append(logger.log(step, metrics))
                _write_rollouts(run_dir, step, trainer.last_rollout)
                if step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps or stop.requested:
                    _save_rl_checkpoint(cfg, trainer, run_dir / "checkpoints", init_model_dir, history)
                if stop.requested:
                    raise RunInterrupted(step)
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            console.print("[yellow]aborted mid-step; the last complete checkpoint is kept[/]")
            raise RunInterrupted(trainer.global_step) from None


def _save_rl_checkpoint(cfg: Config, trainer: RLTrainer, checkpoint_dir: Path, init_model_dir: str,
                        history: list[dict]) -> None:
    """``checkpoints/step_<k>``: the policy, the trainer's state, the RNG states, the metrics so far and,
    with LoRA, the adapter weights."""
    model = trainer.model
    adapter = ({k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
               if cfg.model.lora_rank > 0 else None)
    state = {"trainer": trainer.state_dict(), "rng": ckpt.rng_state(trainer.engine), "metrics": history,
             "init_model_dir": init_model_dir, "adapter": adapter}
    ckpt.save_checkpoint(checkpoint_dir, trainer.global_step, model, trainer.tokenizer, state,
                         keep=cfg.trainer.keep_checkpoints)


class StopOnSigint:
    """First Ctrl-C: ask the loop to stop after the current step (it saves); second: KeyboardInterrupt."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        console.print("[yellow]Ctrl-C: finishing this step, then saving and exiting (Ctrl-C again aborts)[/]")

    def __enter__(self) -> StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


# ----------------------------------------------------------------------------------------------
# Evaluation, plots, table


def evaluate_model(cfg: Config, model_dir: str, task: Task) -> dict:
    """``{"<task>/<split>": {"pass@1", "pass@k", "k", "num_questions", ...}}`` of the model in ``model_dir``."""
    model, tokenizer = _load_policy_from(cfg, model_dir, task)
    console.print(f"evaluating {model_dir} on {task.name}/{cfg.eval.split}")
    return evaluate(build_engine(cfg, model, tokenizer), task, _eval_examples(cfg, task), cfg, cfg.eval.split)


def write_plots(run_dir: Path) -> None:
    from aepo_rl.report import plot_runs

    plot_runs([str(run_dir)], str(run_dir / "plots"))


def before_after_table(results: dict) -> Table:
    """One row per task/split and metric: SFT, RL and the change."""
    table = Table(title="held-out evaluation: cold-start SFT → RL")
    for column, justify in (("task/split", "left"), ("metric", "left"), ("SFT", "right"), ("RL", "right"),
                            ("Δ", "right")):
        table.add_column(column, justify=justify)
    for key, before in results.get("sft", {}).items():
        after = results.get("rl", {}).get(key, {})
        for metric in ("pass@1", "pass@k", "tool_calls/mean", "response_length/mean"):
            if metric not in before:
                continue
            label = f"pass@{before['k']}" if metric == "pass@k" else metric
            old, new = before[metric], after.get(metric, float("nan"))
            table.add_row(key, label, f"{old:.3f}", f"{new:.3f}", f"{new - old:+.3f}")
    return table


# ----------------------------------------------------------------------------------------------
# Helpers


def _get_task(cfg: Config) -> Task:
    from aepo_rl.tasks import get_task

    return get_task(cfg)


def _load_policy_from(cfg: Config, model_path: str, task: Task):
    """``load_policy`` with ``model.path`` pointed at ``model_path`` (an HF folder or 'smollm2')."""
    local = copy.deepcopy(cfg)
    local.model.path = model_path
    return load_policy(local, task)


def _eval_examples(cfg: Config, task: Task) -> list:
    examples = task.examples(cfg.eval.split)
    return examples[:cfg.eval.num_questions] if cfg.eval.num_questions else examples


def _write_rollouts(run_dir: Path, step: int, records: list[dict]) -> None:
    if records:
        lines = "".join(json.dumps(r, default=float) + "\n" for r in records)
        ckpt.atomic_write_text(run_dir / "rollouts" / f"step_{step}.jsonl", lines)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
