"""The stages of the main job, task → tiny model → cold-start SFT → eval → RL → eval → plots (§5), and its run folder.

:class:`aepo_rl.api.AEPOTrainer` composes them (``aepo train`` runs it; ``aepo compare`` runs the SFT
and RL stages for each preset and seed).

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
complete checkpoint; it accepts the overrides of :data:`RESUME_SAFE_KEYS` (more steps, other
evaluation and logging settings) and refuses any other. The first Ctrl-C or SIGTERM (what a job
scheduler sends) finishes the step in flight, saves and exits; a second one aborts at once (the
last checkpoint on disk stays valid).

A run starts when its first stage finishes (the SFT model, or the first evaluation when SFT is
skipped). A start that fails before that removes the ``config.yaml`` it wrote (and the folder when
nothing else is in it); a folder holding only a config, as a run killed during SFT leaves, is not
a run yet, and the same command reuses it. So a corrected command always runs.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import json
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from rich.table import Table

from aepo_rl import registry
from aepo_rl.config import Config, ConfigError, from_dict, set_key, to_dict, to_yaml, uses_rollout_log_probs, validate
from aepo_rl.engines import build_engine, check_entropy_measure, check_logprobs_mode, check_sampling_options
from aepo_rl.evaluate import evaluate
from aepo_rl.models import apply_lora, load_policy, save_policy
from aepo_rl.progress import get_console
from aepo_rl.report import plot_runs
from aepo_rl.tasks import get_task
from aepo_rl.tasks.base import Task
from aepo_rl.train import checkpoint as ckpt
from aepo_rl.train.health import RunHealth
from aepo_rl.train.logger import RunLogger
from aepo_rl.train.rl import RLTrainer
from aepo_rl.train.sft import check_demonstrations, run_sft, sft_demonstrations
from aepo_rl.train.sft_data import SFTData, load_sft_data

# ----------------------------------------------------------------------------------------------
# The run folder (the whole job itself is aepo_rl.api.AEPOTrainer.train; `aepo train` runs it)


def run_started(run_dir: Path) -> bool:
    """Whether a stage of the run in ``run_dir`` has finished: its SFT, an evaluation or an RL step is on disk."""
    return any((run_dir / name).exists() for name in ("sft_metrics.json", "eval.json", "metrics.jsonl", "checkpoints"))


def new_run_dir(cfg: Config) -> Path:
    """``<trainer.run_dir>/<trainer.run_name or preset-timestamp>``; refuses a folder holding a started run
    and reuses one that holds only the config of a start that never finished a stage."""
    name = cfg.trainer.run_name or f"{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.trainer.run_dir) / name
    if (run_dir / "config.yaml").exists():
        if run_started(run_dir):
            raise FileExistsError(
                f"{run_dir} already holds a run: continue it with `aepo train --resume {run_dir}` (which accepts "
                f"{', '.join(RESUME_SAFE_KEYS)}; in Python: trainer.train(resume_from_checkpoint=True)), start over "
                "with AEPOTrainer(..., overwrite_output_dir=True) or by deleting the folder, or choose another "
                "trainer.run_name")
        get_console().print(f"{run_dir} holds only the config of a run that never finished a stage: starting it anew")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _undo_failed_start(run_dir: Path) -> None:
    """After a failure before the run's first stage finished: remove its config.yaml, and the folder if empty,
    so that the corrected command starts cleanly."""
    if run_started(run_dir):
        return
    (run_dir / "config.yaml").unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:  # something else is in it; without a config it blocks nothing
        pass


def load_run_config(run_dir: str | Path) -> Config:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there (is it a run folder made by `aepo train`?)")
    return from_dict(yaml.safe_load(path.read_text()))


RESUME_SAFE_KEYS = ("trainer.steps", "trainer.eval_every", "trainer.save_every", "trainer.keep_checkpoints",
                    "trainer.rollouts_to_save", "trainer.tensorboard", "trainer.wandb_project", "eval.*")
"""Config keys (``fnmatch`` patterns) that ``aepo train --resume`` may change. None of them enters an RL
step's computation, so the steps already taken stay those of the continued run:

- ``trainer.steps``: where RL stops; more steps continue from the last checkpoint (not fewer than
  are done). With ``trainer.lr_schedule=cosine`` the remaining steps follow the cosine to the new end.
- ``trainer.eval_every``, ``trainer.save_every``, ``trainer.keep_checkpoints``,
  ``trainer.rollouts_to_save``: when to evaluate, checkpoint and write rollouts; they read the
  policy and never change it or the random streams of training.
- ``trainer.tensorboard``, ``trainer.wandb_project``: where metrics are logged.
- ``eval.*``: how the SFT and final policies are evaluated; both are evaluated again with the new
  settings so that the before/after table compares like with like.

Every other key (algorithm, rollout, model, task, SFT, optimizer, batch sizes, seeds) shaped the
steps already taken; changing it would silently mix two runs, so it is refused."""


def resume_config(run_dir: Path, overrides: dict) -> tuple[Config, list[str]]:
    """The config of the run in ``run_dir`` with ``overrides`` applied, and the keys whose value changed.

    Raises ConfigError naming every key outside :data:`RESUME_SAFE_KEYS` that would change, and for
    ``trainer.steps`` below the steps already done. A change is written to the run's config.yaml.
    """
    cfg = load_run_config(run_dir)
    before = to_dict(cfg)
    for key, value in overrides.items():
        set_key(cfg, key, value)
    validate(cfg)
    after = to_dict(cfg)
    changed = [key for key in overrides if _lookup(before, key) != _lookup(after, key)]
    refused = [key for key in changed if not any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUME_SAFE_KEYS)]
    if refused:
        raise ConfigError(f"--resume {run_dir}: {', '.join(refused)} cannot change when continuing a run (the steps "
                          f"already taken used the run's values); --resume accepts {', '.join(RESUME_SAFE_KEYS)}. "
                          "For other settings start a new run with another trainer.run_name")
    done = steps_done(run_dir)
    if cfg.trainer.steps < done:
        raise ConfigError(f"--resume {run_dir}: trainer.steps={cfg.trainer.steps} is below the {done} RL steps "
                          f"already done; give trainer.steps >= {done}")
    if changed:
        ckpt.atomic_write_text(Path(run_dir) / "config.yaml", to_yaml(cfg))
        get_console().print("resume changes " + ", ".join(
            f"{key}: {_lookup(before, key)!r} → {_lookup(after, key)!r}" for key in changed))
    return cfg, changed


def _lookup(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def steps_done(run_dir: str | Path) -> int:
    """The step of the run's newest complete checkpoint (0 without one)."""
    latest = ckpt.latest_checkpoint(Path(run_dir) / "checkpoints")
    return int(ckpt.STEP_DIR.match(latest.name).group(1)) if latest else 0


def _forget_stale_results(run_dir: Path, changed: list[str], steps: int) -> None:
    """Drop the stored evaluations that ``changed`` settings make stale: the final one after any change
    (more steps, or other evaluation settings) or when RL stopped before ``steps`` (a callback stopped it),
    the SFT one after an ``eval.*`` change."""
    results = _read_json(run_dir / "eval.json")
    if not results or not (changed or steps_done(run_dir) < steps):
        return
    results.pop("rl", None)
    if any(key.startswith("eval.") for key in changed):
        results.pop("sft", None)
    ckpt.atomic_write_text(run_dir / "eval.json", json.dumps(results, indent=2))


# ----------------------------------------------------------------------------------------------
# Stages


def run_sft_stage(cfg: Config, run_dir: str | Path, *, task: Task | None = None,
                  sft_data: SFTData | None = None) -> str:
    """Cold-start SFT (§5) into ``<run_dir>/checkpoints/sft``; reused when it already exists.

    It trains on ``sft_data`` (the user's demonstrations), else on the files ``sft.data``, else on the
    task's own demonstrations, checked before the model is built; the tiny model's tokenizer learns the
    user's demonstrations' text with the task's. A real model (``model.path``
    set, no ``model.init``) with ``sft.epochs == 0`` skips SFT: its own path is returned. A
    ``model.init=random:<name>`` model is saved there like an SFT model, so every later stage loads the
    same weights.
    """
    if cfg.model.path is not None and cfg.model.init is None and cfg.sft.epochs == 0:
        return cfg.model.path
    sft_dir = Path(run_dir) / "checkpoints" / "sft"
    if (sft_dir / "config.json").is_file():
        get_console().print(f"SFT model found: {sft_dir}")
        return str(sft_dir)

    task = task or _get_task(cfg)
    if cfg.sft.epochs > 0:
        sft_data = sft_data or load_sft_data(cfg)
        check_demonstrations(cfg, task, sft_data)
    model, tokenizer = load_policy(cfg, sft_data.with_texts(task) if sft_data else task)
    metrics: dict = {}
    if cfg.sft.epochs > 0:
        demonstrations, dev = sft_demonstrations(cfg, task, sft_data, tokenizer)
        source = f" from {sft_data.source}" if sft_data else ""
        get_console().print(f"[bold]cold-start SFT[/] on {len(demonstrations)} demonstrations{source}, "
                            f"{cfg.sft.epochs} epochs")
        metrics = run_sft(cfg, model, tokenizer, demonstrations, dev)
    ckpt.atomic_write_text(Path(run_dir) / "sft_metrics.json", json.dumps(metrics, indent=2, default=float))
    save_policy(model, tokenizer, sft_dir)
    return str(sft_dir)


class StageHooks:
    """What the stages report while they run, to the callbacks of :class:`aepo_rl.api.AEPOTrainer`; every
    method is a no-op here."""

    def rl_ready(self, trainer: RLTrainer) -> None:
        """The RL trainer is built (fresh, or as it was at the newest checkpoint)."""

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        """RL step ``step`` is done; ``metrics`` as written to metrics.jsonl."""

    def evaluated(self, step: int, results: dict) -> None:
        """The policy after ``step`` RL steps was evaluated: ``{"<task>/<split>": {"pass@1", ...}}``."""

    def saved(self, step: int, path: Path) -> None:
        """The checkpoint of step ``step`` is complete at ``path``."""

    def should_stop(self) -> bool:
        """Whether RL should end after the step just reported (it is saved; the final evaluation follows)."""
        return False


class RunInterrupted(KeyboardInterrupt):
    """RL stopped by Ctrl-C or SIGTERM; ``step`` is the last completed (and, after a first Ctrl-C, saved) step."""

    def __init__(self, step: int):
        super().__init__(f"interrupted after step {step}")
        self.step = step


def run_rl_stage(cfg: Config, init_model_dir: str, run_dir: str | Path, *, task: Task | None = None,
                 hooks: StageHooks | None = None) -> dict:
    """RL from ``init_model_dir``, then evaluation of the final policy on ``eval.split`` (none when the task
    has no question there: ``{}``).

    Resumes from the newest ``<run_dir>/checkpoints/step_<k>`` when there is one. Returns
    ``{"<task>/<split>": {"pass@1", "pass@k", "k", "num_questions", ...}}``, also stored as
    ``eval.json["rl"]``. Raises :class:`RunInterrupted` after Ctrl-C. ``hooks`` hear of every step,
    evaluation and checkpoint.
    """
    check_rl_engine(cfg)
    run_dir = Path(run_dir)
    task = task or _get_task(cfg)
    hooks = hooks or StageHooks()
    trainer, history = _rl_trainer(cfg, init_model_dir, run_dir / "checkpoints", task)
    hooks.rl_ready(trainer)
    eval_examples = _eval_examples(cfg, task)
    _rl_steps(cfg, trainer, run_dir, init_model_dir, history, eval_examples, hooks)
    results = evaluate(trainer.engine, task, eval_examples, cfg, cfg.eval.split) if eval_examples else {}
    if results:
        hooks.evaluated(trainer.global_step, results)
    stored = _read_json(run_dir / "eval.json")
    stored["rl"] = results
    ckpt.atomic_write_text(run_dir / "eval.json", json.dumps(stored, indent=2))
    return results


def check_rl_engine(cfg: Config) -> None:
    """Refuse, before any work, an engine the built-in RL trainer cannot train with: one that neither
    shares the policy's weights nor syncs them after each update, cannot give the configured
    step-entropy measure, or does not honour a configured sampling option or `rollout.logprobs_mode`."""
    capabilities = registry.ENGINES.capabilities(cfg.rollout.engine)
    if not (capabilities["shares_weights"] or capabilities["syncs_weights"]):
        usable = [name for name in registry.ENGINES if registry.ENGINES.capabilities(name)["shares_weights"]
                  or registry.ENGINES.capabilities(name)["syncs_weights"]]
        raise ConfigError(f"rollout.engine={cfg.rollout.engine!r}: the built-in RL trainer needs an engine that shares "
                          f"the policy's weights or syncs them after each update (a server would keep sampling the "
                          f"old policy): one of {usable}")
    if uses_rollout_log_probs(cfg) and not capabilities["behaviour_logprobs"]:
        usable = [name for name in registry.ENGINES if registry.ENGINES.capabilities(name)["behaviour_logprobs"]]
        raise ConfigError("algorithm.rollout_correction needs the rollout engine's log-probs of "
                          f"every sampled token, which rollout.engine={cfg.rollout.engine!r} "
                          "does not declare (registry capability behaviour_logprobs): use one "
                          f"of {usable}, or turn rollout_is, rollout_rs and bypass_mode off")
    check_entropy_measure(cfg)
    check_sampling_options(cfg)
    check_logprobs_mode(cfg)


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
    get_console().print(f"resuming RL after step {trainer.global_step} from {latest}")
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
              eval_examples: list, hooks: StageHooks) -> None:
    """RL steps up to ``trainer.steps``: log each, write its rollouts, evaluate every ``trainer.eval_every``
    and checkpoint every ``trainer.save_every`` steps and at the end.

    The first Ctrl-C or SIGTERM finishes the step in flight, saves it and raises :class:`RunInterrupted`;
    a second one aborts mid-step (the last complete checkpoint stays valid).
    """
    health = RunHealth.from_config(cfg.trainer, cfg.algorithm.rollout_correction)
    with RunLogger(run_dir, total_steps=cfg.trainer.steps, history=history, tensorboard=cfg.trainer.tensorboard,
                   wandb_project=cfg.trainer.wandb_project, run_name=run_dir.name, config=to_dict(cfg),
                   console=get_console(), health=health) as logger, StopOnSignals() as stop:
        try:
            while trainer.global_step < cfg.trainer.steps:
                metrics = trainer.step()
                step = trainer.global_step
                results = None
                if cfg.trainer.eval_every and step % cfg.trainer.eval_every == 0 and step < cfg.trainer.steps \
                        and eval_examples:  # the last step's evaluation is the final one (eval.json)
                    results = evaluate_aside(trainer, eval_examples, cfg)
                    for key, result in results.items():
                        metrics.update({f"eval/{key}/{name}": float(result[name]) for name in ("pass@1", "pass@k")})
                history.append(logger.log(step, metrics))
                _write_rollouts(run_dir, step, trainer.last_rollout)
                hooks.step_end(step, history[-1])
                if results is not None:
                    hooks.evaluated(step, results)
                asked_to_stop = hooks.should_stop()
                if step % cfg.trainer.save_every == 0 or step == cfg.trainer.steps or stop.requested or asked_to_stop:
                    path = _save_rl_checkpoint(cfg, trainer, run_dir / "checkpoints", init_model_dir, history)
                    hooks.saved(step, path)
                if stop.requested:
                    raise RunInterrupted(step)
                if asked_to_stop:
                    get_console().print(f"[yellow]a callback stopped RL after step {step}[/]")
                    break
        except RunInterrupted:
            raise
        except KeyboardInterrupt:
            get_console().print("[yellow]aborted mid-step; the last complete checkpoint is kept[/]")
            raise RunInterrupted(trainer.global_step) from None


def evaluate_aside(trainer: RLTrainer, eval_examples: list, cfg: Config) -> dict:
    """An evaluation between RL steps that leaves training as it was: the random states it draws from (Python's,
    numpy's, torch's and the engine's sampler) are put back afterwards, so ``trainer.eval_every`` changes what is
    measured, not what is trained."""
    state = ckpt.rng_state(trainer.engine)
    try:
        return evaluate(trainer.engine, trainer.task, eval_examples, cfg, cfg.eval.split)
    finally:
        ckpt.set_rng_state(state, trainer.engine)


def _save_rl_checkpoint(cfg: Config, trainer: RLTrainer, checkpoint_dir: Path, init_model_dir: str,
                        history: list[dict]) -> Path:
    """``checkpoints/step_<k>``: the policy, the trainer's state, the RNG states, the metrics so far and,
    with LoRA, the adapter weights."""
    model = trainer.model
    adapter = ({k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
               if cfg.model.lora_rank > 0 else None)
    state = {"trainer": trainer.state_dict(), "rng": ckpt.rng_state(trainer.engine), "metrics": history,
             "init_model_dir": init_model_dir, "adapter": adapter}
    return ckpt.save_checkpoint(checkpoint_dir, trainer.global_step, model, trainer.tokenizer, state,
                                keep=cfg.trainer.keep_checkpoints)


class StopOnSignals:
    """First Ctrl-C (SIGINT) or SIGTERM: ask the loop to stop after the current step (it saves);
    a second one: KeyboardInterrupt."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        get_console().print(f"[yellow]{name}: finishing this step, then saving and exiting (Ctrl-C or SIGTERM "
                            "again aborts)[/]")

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handler) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def _sigterm_like_ctrl_c():
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does (outside the RL steps, where there is nothing to save)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------------------------
# Evaluation, plots, table


def evaluate_model(cfg: Config, model_dir: str, task: Task) -> dict:
    """``{"<task>/<split>": {"pass@1", "pass@k", "k", "num_questions", ...}}`` of the model in ``model_dir``."""
    model, tokenizer = _load_policy_from(cfg, model_dir, task)
    get_console().print(f"evaluating {model_dir} on {task.name}/{cfg.eval.split}")
    return evaluate(build_engine(cfg, model, tokenizer), task, _eval_examples(cfg, task), cfg, cfg.eval.split)


def write_plots(run_dir: Path) -> None:
    plot_runs([str(run_dir)], str(run_dir / "plots"))


def evaluation_title(cfg: Config, task: Task, sft_data: SFTData | None = None) -> str:
    """What the evaluation of ``eval.split`` is: "held-out" only when none of its questions is a training
    question (one of the task's train split or of the user's demonstrations ``sft_data``); otherwise how
    many are (a train-fit check, e.g. ``task.val_files`` drawn from the training questions)."""
    def key(question: str) -> str:
        return " ".join(question.split()).casefold()

    try:
        seen = {key(ex.question) for ex in task.examples("train")}
    except KeyError:  # a task without a train split
        seen = set()
    if sft_data is not None:
        seen |= {key(next(m["content"] for m in reversed(demo.prompt) if m["role"] == "user"))
                 for demo in sft_data.demos}
    evaluated = [key(ex.question) for ex in _eval_examples(cfg, task)]
    trained = sum(question in seen for question in evaluated)
    if not trained:
        return f"held-out evaluation ({cfg.eval.split}): cold-start SFT → RL"
    return (f"evaluation on {cfg.eval.split}, not held out: {trained} of its {len(evaluated)} questions are training "
            "questions: cold-start SFT → RL")


def before_after_table(results: dict, title: str = "evaluation: cold-start SFT → RL") -> Table:
    """One row per task/split and metric: SFT, RL and the change; ``title`` from :func:`evaluation_title`."""
    table = Table(title=title)
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
    return get_task(cfg)


def _load_policy_from(cfg: Config, model_path: str, task: Task):
    """``load_policy`` of the weights in ``model_path`` (an HF folder or 'smollm2'), not ``model.init``'s."""
    local = copy.deepcopy(cfg)
    local.model.path, local.model.init = model_path, None
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
