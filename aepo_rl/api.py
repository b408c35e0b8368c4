"""The Python API of the whole pipeline, in the shape of TRL's trainers; ``aepo train`` runs on it.

::

    from aepo_rl import AEPOTrainer

    trainer = AEPOTrainer("aepo", train_dataset=train, eval_dataset=test, reward_funcs=[correct, short],
                          reward_weights=[1.0, 0.2], tools=["search", "python"],
                          overrides={"trainer.steps": 20}, output_dir="runs/mine")
    trainer.train()          # SFT when the task has demonstrations, evaluation, RL, evaluation, plots
    trainer.evaluate()       # {"dataset/test": {"pass@1": ..., "pass@k": ..., ...}}
    trainer.save_model("models/mine")

Datasets: a ``datasets.Dataset`` (or a list of dicts) with verl's columns (``prompt`` messages,
``reward_model.ground_truth``), TRL's (``prompt``, ``answer``) or ``question`` / ``answer``
(:mod:`aepo_rl.tasks.dataset`). Reward functions follow TRL's convention
(:class:`aepo_rl.rewards.WeightedRewards`); registered reward names work too. Without a dataset the
task is the config's (``task.name``), as on the command line. docs/python-api.md has a complete example.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import shutil
import time
from pathlib import Path
from typing import Any

from aepo_rl.config import (
    TRL_ALIASES,
    Config,
    ConfigError,
    carry_mini_batch,
    load_config,
    set_key,
    to_dict,
    to_yaml,
    validate,
)
from aepo_rl.evaluate import evaluate
from aepo_rl.hf_callbacks import HFCallback, is_hf_callback
from aepo_rl.models import check_model_dir, save_policy
from aepo_rl.progress import get_console
from aepo_rl.rewards import WeightedRewards
from aepo_rl.tasks.base import Task
from aepo_rl.tasks.common import ToolOptions
from aepo_rl.tasks.dataset import BUILT_WITH_CONFIG, DatasetTask, dataset_rows
from aepo_rl.train import checkpoint as ckpt
from aepo_rl.train.pipeline import (
    RunInterrupted,
    StageHooks,
    _eval_examples,
    _forget_stale_results,
    _get_task,
    _lookup,
    _read_json,
    _rl_trainer,
    _sigterm_like_ctrl_c,
    _undo_failed_start,
    before_after_table,
    check_rl_engine,
    evaluate_model,
    evaluation_title,
    load_run_config,
    new_run_dir,
    resume_config,
    run_rl_stage,
    run_sft_stage,
    run_started,
    write_plots,
)
from aepo_rl.train.sft_data import load_sft_data
from aepo_rl.trl_config import Mapped, explicit_fields, known, map_trl_args

DATASET_RUN = "dataset_run.json"
"""In a run folder made from Python datasets: their row counts, the reward functions and the tools, which
config.yaml cannot hold; its presence tells a resume that the run needs them again."""
START_MODEL = "start_model"
"""The run folder's copy of a ``model=`` object (and its ``processing_class``): the run's ``model.path``."""

__all__ = ["AEPOTrainer", "TrainerCallback", "train_main"]

CALLBACK_EVENTS = ("on_train_begin", "on_step_end", "on_evaluate", "on_save", "on_train_end")


class TrainerCallback:
    """Base class of callbacks (subclass it and override what you need; any object with some of these methods
    works too). Each method receives the :class:`AEPOTrainer` first."""

    def on_train_begin(self, trainer: AEPOTrainer) -> None:
        """RL is about to start (after SFT and the first evaluation); ``trainer.model`` is the policy."""

    def on_step_end(self, trainer: AEPOTrainer, step: int, metrics: dict[str, float]) -> None:
        """RL step ``step`` (1, 2, …) is done; ``metrics`` is its line of metrics.jsonl."""

    def on_evaluate(self, trainer: AEPOTrainer, step: int, results: dict) -> None:
        """The policy after ``step`` RL steps (0: the starting policy) was evaluated: ``{"<task>/<split>": {...}}``."""

    def on_save(self, trainer: AEPOTrainer, step: int, path: Path) -> None:
        """The checkpoint of step ``step`` is complete in ``path`` (``path / "model"`` is a Hugging Face folder)."""

    def on_train_end(self, trainer: AEPOTrainer, results: dict) -> None:
        """``train()`` is about to return ``results`` (``{"sft": ..., "rl": ...}``, as eval.json)."""


class _Callbacks(StageHooks):
    """The pipeline's stage hooks, passed on to the user's callbacks with the trainer."""

    def __init__(self, trainer: AEPOTrainer, callbacks: list):
        self.trainer, self.callbacks = trainer, callbacks

    def fire(self, event: str, *args) -> None:
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None:
                method(self.trainer, *args)

    def rl_ready(self, rl) -> None:
        self.trainer._rl = rl
        self.fire("on_train_begin")

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        self.fire("on_step_end", step, dict(metrics))

    def evaluated(self, step: int, results: dict) -> None:
        self.fire("on_evaluate", step, results)

    def saved(self, step: int, path: Path) -> None:
        self.fire("on_save", step, Path(path))

    def should_stop(self) -> bool:
        return any(getattr(callback, "stop_requested", False) for callback in self.callbacks)


def _check_callbacks(callbacks, cfg: Config) -> list:
    callbacks = list(callbacks or [])
    for i, callback in enumerate(callbacks):
        if is_hf_callback(callback):
            callbacks[i] = HFCallback(callback, cfg, i)
        elif not any(callable(getattr(callback, event, None)) for event in CALLBACK_EVENTS):
            raise TypeError(f"callbacks[{i}] ({type(callback).__name__}) has none of the methods "
                            f"{', '.join(CALLBACK_EVENTS)}: subclass aepo_rl.TrainerCallback and override one")
    return callbacks


def _build_config(config: Config | str | None, overrides: dict[str, Any] | None) -> Config:
    if config is None or isinstance(config, str):
        return load_config(config or "aepo", overrides=overrides)
    if not isinstance(config, Config):
        raise TypeError(f"config must be an aepo_rl Config or a preset name, got {type(config).__name__} "
                        "(aepo_rl.config.load_config(preset, yaml_path, overrides) builds one)")
    cfg = copy.deepcopy(config)
    for key, value in (overrides or {}).items():
        set_key(cfg, key, value)
    validate(cfg)
    return cfg


class AEPOTrainer:
    """The whole pipeline: task → policy → cold-start SFT (when the task has demonstrations) → evaluation →
    RL → evaluation → plots, in one run folder (docs/training.md, "The run folder").

    ``config``: a :class:`~aepo_rl.config.Config` or a preset name (default ``aepo``); ``overrides``:
    dotted keys (``{"trainer.steps": 40, "rollout.n": 4}``), applied on top. ``model``: ``model.path``
    (a Hugging Face folder, or ``smollm2``); ``output_dir``: the run folder (default
    ``trainer.run_dir/trainer.run_name``).

    With ``train_dataset`` (and optionally ``eval_dataset``, the split evaluated before and after RL)
    the task is those rows with ``tools`` (registered names, :class:`~aepo_rl.tools.Tool` objects or
    functions of one string; default ``search`` and ``python``, built from ``task.*``) and
    ``reward_funcs`` with ``reward_weights`` (default: the registered reward ``task.reward``). Without
    one it is the config's ``task.name``, and ``reward_funcs`` and ``tools`` must be left unset.
    ``callbacks``: :class:`TrainerCallback` objects, or ``transformers.TrainerCallback`` ones
    (:mod:`aepo_rl.hf_callbacks`). ``sft_dataset``: your demonstrations for cold-start SFT (rows or a
    file, :mod:`aepo_rl.train.sft_data`; docs/training.md) instead of the task's.

    TRL's habits: ``model`` may be a loaded ``transformers`` model with its tokenizer as
    ``processing_class`` (both are saved into the run folder, which trains from that copy);
    ``args=GRPOConfig(...)`` (or a dict of TRL's names) and TRL's argument names as keyword arguments
    (``learning_rate``, ``num_generations``, ``beta``, ``report_to``, …) become config keys, and what
    cannot be honoured is refused naming each field (:mod:`aepo_rl.trl_config`; keyword arguments win
    over ``args``); a run folder that already holds a run is continued with
    ``train(resume_from_checkpoint=True)`` or replaced with ``overwrite_output_dir=True``.
    """

    def __init__(self, config: Config | str | None = None, *, args=None, train_dataset=None, eval_dataset=None,
                 reward_funcs=None, reward_weights=None, tools=None, callbacks=None, model=None,
                 processing_class=None, output_dir: str | Path | None = None, overwrite_output_dir: bool = False,
                 overrides: dict[str, Any] | None = None, sft_dataset=None, **trl_args):
        cfg = _build_config(config, overrides)
        trl = _apply_trl_args(cfg, args, trl_args, overrides)
        if output_dir is None and args is not None:  # TRL's run folder is GRPOConfig.output_dir
            output_dir = args.get("output_dir") if isinstance(args, dict) else getattr(args, "output_dir", None)
        if reward_weights is None:
            reward_weights = trl.reward_weights
        if isinstance(sft_dataset, (str, Path)):  # a file: sft.data, so config.yaml names it
            set_key(cfg, "sft.data", [str(sft_dataset)])
            sft_dataset = None
        self._model_object, self._processing_class = _model_object(model, processing_class)
        if model is not None and self._model_object is None:
            set_key(cfg, "model.path", str(model))
        if output_dir is not None:
            output_dir = Path(output_dir)
            set_key(cfg, "trainer.run_dir", str(output_dir.parent))
            set_key(cfg, "trainer.run_name", output_dir.name)
        validate(cfg)
        if self._model_object is None and cfg.model.path not in (None, "smollm2"):
            check_model_dir(cfg.model.path)  # a wrong path fails now, not after the task is built
        self.cfg = cfg
        self._sft_data = load_sft_data(cfg, sft_dataset)
        self.overwrite_output_dir = overwrite_output_dir
        self.callbacks = _check_callbacks(callbacks, cfg)
        self._hooks = _Callbacks(self, self.callbacks)
        self._dataset_run: dict | None = None
        self._task = self._dataset_task(train_dataset, eval_dataset, reward_funcs, reward_weights, tools)
        self.run_dir: Path | None = None
        """The run folder, once the run has started (``train()``, or ``evaluate()`` before it)."""
        self.results: dict = {}
        """What ``train()`` returned: the evaluations before (``sft``) and after (``rl``) RL, as eval.json."""
        self._resumed: list[str] | None = None
        self._rl = None

    def _dataset_task(self, train_dataset, eval_dataset, reward_funcs, reward_weights, tools) -> Task | None:
        if train_dataset is None and eval_dataset is None:
            if reward_funcs is not None or reward_weights is not None or tools is not None:
                raise ValueError("reward_funcs, reward_weights and tools go with train_dataset: "
                                 "without a dataset the task is the config's "
                                 f"(task.name={self.cfg.task.name!r}) with its own reward and tools")
            return None
        task_cfg = self.cfg.task
        tools = BUILT_WITH_CONFIG if tools is None else list(tools)
        if "search" in tools and not (task_cfg.corpus or task_cfg.search_url):
            raise ConfigError("tools: the search tool needs documents: set task.corpus=<corpus.jsonl | wiki> or "
                              "task.search_url=<a Search-R1 server> in overrides, or leave 'search' out of tools "
                              "(tools=['python'])")
        rewards = WeightedRewards(reward_funcs if reward_funcs is not None else [task_cfg.reward], reward_weights,
                                  judge_url=task_cfg.judge_url, judge_model=task_cfg.judge_model)
        train = dataset_rows(train_dataset, "train_dataset") if train_dataset is not None else []
        evaluation = dataset_rows(eval_dataset, "eval_dataset") if eval_dataset is not None else []
        self._dataset_run = {"train_rows": len(train), "eval_rows": len(evaluation), "reward_funcs": rewards.names,
                             "tools": [tool if isinstance(tool, str) else getattr(tool, "name", None)
                                       or getattr(tool, "__name__", type(tool).__name__) for tool in tools]}
        return DatasetTask("dataset", train, evaluation, rewards, tools=tools, task_cfg=task_cfg,
                           tool_options=ToolOptions.from_config(self.cfg))

    @classmethod
    def resume(cls, run_dir: str | Path, overrides: dict[str, Any] | None = None, **kwargs) -> AEPOTrainer:
        """A trainer that continues the run in ``run_dir`` with its own config.yaml, changed by ``overrides`` (only
        ``aepo_rl.train.pipeline.RESUME_SAFE_KEYS``); give a dataset run its datasets, rewards and tools again."""
        run_dir = Path(run_dir)
        check_datasets_given(run_dir, kwargs.get("train_dataset") is not None or kwargs.get("eval_dataset") is not None)
        cfg, changed = resume_config(run_dir, overrides or {})
        trainer = cls(cfg, **kwargs)
        trainer.run_dir, trainer._resumed = run_dir, changed
        return trainer

    # -- what a run is made of ------------------------------------------------------------------

    @property
    def task(self) -> Task:
        """The task: the datasets' (:class:`~aepo_rl.tasks.dataset.DatasetTask`), else the config's ``task.name``."""
        if self._task is None:
            self._task = _get_task(self.cfg)
        return self._task

    @property
    def model(self):
        """The policy being trained (built, from the run's newest checkpoint or its starting model, when needed)."""
        return self._policy().model

    @property
    def tokenizer(self):
        return self._policy().tokenizer

    def _start_run(self) -> Path:
        """The run folder: created (with config.yaml) on first use, unless the run is resumed."""
        if self.run_dir is None:
            check_rl_engine(self.cfg)
            planned = Path(self.cfg.trainer.run_dir) / (self.cfg.trainer.run_name or "")
            if self.overwrite_output_dir and self.cfg.trainer.run_name and (planned / "config.yaml").is_file():
                get_console().print(f"overwrite_output_dir: deleting the run in {planned}")
                shutil.rmtree(planned)
            self.run_dir = new_run_dir(self.cfg)
            if self._model_object is not None:
                start = self.run_dir / START_MODEL
                self._model_object.save_pretrained(start)
                self._processing_class.save_pretrained(start)
                set_key(self.cfg, "model.path", str(start))
            if self._dataset_run is not None:
                ckpt.atomic_write_text(self.run_dir / DATASET_RUN, json.dumps(self._dataset_run, indent=2))
            ckpt.atomic_write_text(self.run_dir / "config.yaml", to_yaml(self.cfg))
            get_console().print(f"[bold]run folder[/] {self.run_dir}")
        return self.run_dir

    def _continue_existing_run(self) -> None:
        """``train(resume_from_checkpoint=True)``: continue the run already in the output folder, as
        :meth:`resume` would, when there is one; the trainer's config may differ from the run's only in
        :data:`~aepo_rl.train.pipeline.RESUME_SAFE_KEYS`."""
        run_dir = Path(self.cfg.trainer.run_dir) / (self.cfg.trainer.run_name or "")
        if not self.cfg.trainer.run_name or not (run_dir / "config.yaml").is_file() or not run_started(run_dir):
            get_console().print(f"resume_from_checkpoint: no run in {run_dir} yet; starting one")
            return
        check_datasets_given(run_dir, self._task is not None)
        saved = to_dict(load_run_config(run_dir))
        mine = to_dict(self.cfg)
        if self._model_object is not None:  # the run trains from its own copy of the model object
            mine["model"]["path"] = saved["model"]["path"]
        differing = {key: _lookup(mine, key) for key in _flat_keys(mine) if _lookup(mine, key) != _lookup(saved, key)}
        self.cfg, self._resumed = resume_config(run_dir, differing)
        self.run_dir = run_dir

    def _policy(self):
        """The RL trainer over the current policy: the one of ``train()``, or one built from the run's newest
        checkpoint (or its SFT model) for ``evaluate()`` / ``save_model()`` outside it."""
        if self._rl is None:
            run_dir = self._start_run()
            init_model_dir = run_sft_stage(self.cfg, run_dir, task=self.task, sft_data=self._sft_data)
            self._rl, _ = _rl_trainer(self.cfg, init_model_dir, run_dir / "checkpoints", self.task)
        return self._rl

    # -- train, evaluate, save ------------------------------------------------------------------

    def train(self, resume_from_checkpoint: bool | None = None) -> dict:
        """Run the pipeline to the end, reusing every stage the run folder already holds; returns
        ``{"sft": {...}, "rl": {...}}``, the evaluations before and after RL (eval.json; empty entries
        without evaluation questions). Ctrl-C or SIGTERM: RL saves its step and
        :class:`~aepo_rl.train.pipeline.RunInterrupted` (a KeyboardInterrupt) is raised; ``AEPOTrainer.resume``
        or ``train(resume_from_checkpoint=True)`` continues. ``resume_from_checkpoint=True``: continue the
        run already in ``output_dir`` (from its newest checkpoint), or start it when there is none."""
        if resume_from_checkpoint not in (None, False, True):
            raise TypeError(f"resume_from_checkpoint={resume_from_checkpoint!r}: give True (continue the run in "
                            "output_dir from its newest checkpoint); a run is continued whole, not from one of its "
                            "checkpoint folders; AEPOTrainer.resume(run_dir) continues another folder")
        if resume_from_checkpoint and self.overwrite_output_dir:
            raise TypeError("resume_from_checkpoint=True continues the run in output_dir and overwrite_output_dir=True "
                            "deletes it: choose one")
        if resume_from_checkpoint and self.run_dir is None:
            self._continue_existing_run()
        cfg, resumed = self.cfg, self._resumed is not None
        check_rl_engine(cfg)
        if resumed:
            get_console().print(f"[bold]resuming[/] {self.run_dir}")
            _forget_stale_results(self.run_dir, self._resumed, cfg.trainer.steps)
        run_dir = self._start_run()
        t_start = time.perf_counter()
        seconds: dict[str, float] = {}
        try:
            with _sigterm_like_ctrl_c():
                t0 = time.perf_counter()
                task = self.task
                init_model_dir = run_sft_stage(cfg, run_dir, task=task, sft_data=self._sft_data)
                seconds["task+model+SFT"] = time.perf_counter() - t0
                results = _read_json(run_dir / "eval.json")
                has_eval = bool(_eval_examples(cfg, task))
                if "sft" not in results:
                    t0 = time.perf_counter()
                    results["sft"] = evaluate_model(cfg, init_model_dir, task) if has_eval else {}
                    ckpt.atomic_write_text(run_dir / "eval.json", json.dumps(results, indent=2))
                    if has_eval:
                        self._hooks.evaluated(0, results["sft"])
                    seconds["SFT eval"] = time.perf_counter() - t0
                if "rl" not in results:
                    t0 = time.perf_counter()
                    self._rl = None
                    results["rl"] = run_rl_stage(cfg, init_model_dir, run_dir, task=task, hooks=self._hooks)
                    seconds["RL+eval"] = time.perf_counter() - t0
        except KeyboardInterrupt:  # RunInterrupted (RL saved its last step), Ctrl-C or SIGTERM in SFT/eval
            raise
        except BaseException:
            if not resumed and not run_started(run_dir):
                (run_dir / DATASET_RUN).unlink(missing_ok=True)
                shutil.rmtree(run_dir / START_MODEL, ignore_errors=True)
                _undo_failed_start(run_dir)
            raise
        write_plots(run_dir)
        if results.get("sft") or results.get("rl"):
            get_console().print(before_after_table(results, evaluation_title(cfg, task, self._sft_data)))
        stages = ", ".join(f"{stage} {value:.0f} s" for stage, value in seconds.items())
        get_console().print(f"done in {time.perf_counter() - t_start:.0f} s ({stages}); results in {run_dir}")
        self.results = results
        self._hooks.fire("on_train_end", results)
        return results

    def evaluate(self, split: str | None = None) -> dict:
        """pass@1 / pass@k of the current policy on ``split`` (default ``eval.split``, the eval_dataset's rows
        for a dataset task), with the ``eval.*`` settings: ``{"<task>/<split>": {"pass@1", "pass@k", ...}}``."""
        cfg = copy.deepcopy(self.cfg)
        if split is not None:
            cfg.eval.split = split
        examples = _eval_examples(cfg, self.task)
        if not examples:
            raise ValueError(f"no questions to evaluate in {self.task.name}/{cfg.eval.split}"
                             + (": give the trainer an eval_dataset" if self._task is not None else ""))
        rl = self._policy()
        results = evaluate(rl.engine, self.task, examples, cfg, cfg.eval.split)
        self._hooks.evaluated(rl.global_step, results)
        return results

    def save_model(self, path: str | Path | None = None) -> Path:
        """Save the current policy as a Hugging Face folder (LoRA adapters merged) at ``path`` (default
        ``<run folder>/model``); returns the folder."""
        rl = self._policy()
        return Path(save_policy(rl.model, rl.tokenizer, Path(path) if path is not None else self.run_dir / "model"))


def check_datasets_given(run_dir: Path, given: bool) -> None:
    """Refuse to continue a run made from Python datasets without them (its config.yaml holds the config's
    task, not the rows, reward functions and tools), naming what the run used and how to resume it."""
    path = Path(run_dir) / DATASET_RUN
    if given or not path.is_file():
        return
    made = json.loads(path.read_text())
    raise ConfigError(
        f"{run_dir} was made by AEPOTrainer from Python datasets ({made['train_rows']} training rows, "
        f"{made['eval_rows']} evaluation rows, reward functions {made['reward_funcs']}, tools {made['tools']}), "
        "which its config.yaml cannot hold, so the command line cannot continue it; continue it from Python with "
        f"the same ones: AEPOTrainer.resume({str(run_dir)!r}, train_dataset=..., eval_dataset=..., "
        "reward_funcs=[...], reward_weights=[...], tools=[...])")


def _flat_keys(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.extend(_flat_keys(value, dotted + ".") if isinstance(value, dict) else [dotted])
    return keys


def _apply_trl_args(cfg: Config, args, trl_args: dict[str, Any], overrides: dict | None) -> Mapped:
    """TRL's training arguments (``args``, a ``GRPOConfig`` or a dict, then the keyword arguments ``trl_args``) set
    config keys (:func:`aepo_rl.trl_config.map_trl_args`), with one note naming what was set, what has no effect
    and which of ``args``' TRL defaults were left to the preset. Everything that cannot be honoured is refused at
    once, each with its reason; a keyword argument that is no TRL name gets a suggestion."""
    for name in trl_args:
        if not known(name):
            known_names = [p for p in inspect.signature(AEPOTrainer.__init__).parameters
                           if p not in ("self", "trl_args")]
            match = difflib.get_close_matches(name, known_names + list(TRL_ALIASES), n=1, cutoff=0.6)
            hint = f"; did you mean {match[0]!r}?" if match else (
                "; config keys go in overrides={'section.key': value} (`aepo config show` lists them)")
            raise TypeError(f"AEPOTrainer got an unexpected keyword argument {name!r}{hint}")
    values, left = explicit_fields(args) if args is not None else ({}, {})
    values.pop("output_dir", None)
    values.update(trl_args)
    if not values:
        return Mapped()
    mapped = map_trl_args(values, steps=cfg.trainer.steps, n=cfg.rollout.n)
    if mapped.refused:
        where = "args and keyword arguments" if args is not None and trl_args else "args" if args is not None else \
            "keyword arguments"
        raise TypeError(f"AEPOTrainer: TRL {where} that aepo-rl cannot honour (set them back to TRL's default, or "
                        "use what each names; docs/python-api.md, \"Coming from TRL\"):\n"
                        + "\n".join(f"  {name}={reason}" for name, reason in mapped.refused.items()))
    for key, value in mapped.overrides.items():
        set_key(cfg, key, value)
    carry_mini_batch(cfg, "trainer.mini_batch_size" in {**(overrides or {}), **mapped.overrides})
    validate(cfg)
    notes = [f"TRL's arguments set {', '.join(f'{k}={v!r}' for k, v in mapped.overrides.items())}"] \
        if mapped.overrides else []
    notes += mapped.notes
    ours = {name: _lookup(to_dict(cfg), key) for name, key in TRL_ALIASES.items() if name in left}
    kept = [f"{name} {left[name]!r} (here {TRL_ALIASES[name]}={value!r})" for name, value in ours.items()
            if value != left[name] and not (value == 0 and left[name] is None)]
    if kept:
        notes.append(f"left at TRL's defaults, so the preset's values stand: {', '.join(kept)}")
    get_console().print("[dim]" + "; ".join(notes) + "[/]")
    return mapped


def _model_object(model, processing_class):
    """``(model, tokenizer)`` when ``model`` is a loaded model (kept, to be saved into the run folder), else
    ``(None, None)`` for a path; refuses what cannot be used, with the fix."""
    if model is None or isinstance(model, (str, Path)):
        if processing_class is not None:
            raise TypeError("processing_class goes with a model object "
                            "(model=AutoModelForCausalLM.from_pretrained(...)); with a model "
                            "folder or 'smollm2' the folder's own tokenizer is used: save yours "
                            "into it (tokenizer.save_pretrained(folder)) and drop processing_class")
        return None, None
    if not (hasattr(model, "save_pretrained") and hasattr(model, "config")):
        raise TypeError(f"model must be a Hugging Face model folder, 'smollm2', or a loaded transformers model, got "
                        f"{type(model).__name__}")
    if hasattr(model, "peft_config"):
        raise TypeError("model is a PEFT model: merge its adapters first (model = model.merge_and_unload()), or pass "
                        "the base model and set model.lora_rank in overrides to train LoRA adapters here")
    if processing_class is None:
        raise TypeError(f"model is a loaded {type(model).__name__}: also pass its tokenizer as processing_class= "
                        "(AutoTokenizer.from_pretrained(...)); both are saved into the run folder, which trains "
                        "from that copy")
    if not hasattr(processing_class, "save_pretrained") or not hasattr(processing_class, "encode"):
        raise TypeError(f"processing_class must be a transformers tokenizer, got {type(processing_class).__name__}")
    return model, processing_class


def train_main(cfg: Config | None, resume: str | None = None, overrides: dict | None = None) -> int:
    """``aepo train``: :meth:`AEPOTrainer.train` of ``cfg``, or of the run in ``resume`` with ``overrides``;
    returns the process exit code (130 after Ctrl-C or SIGTERM)."""
    if resume is not None:
        trainer = AEPOTrainer.resume(resume, overrides)
    else:
        if overrides:
            raise ConfigError("train_main: overrides go with resume; apply them to cfg")
        trainer = AEPOTrainer(cfg)
    try:
        trainer.train()
    except KeyboardInterrupt as stop:
        where = f"after RL step {stop.step}" if isinstance(stop, RunInterrupted) else "before RL finished"
        get_console().print(f"[yellow]stopped {where}; continue with: aepo train --resume {trainer.run_dir}[/]")
        return 130
    return 0
