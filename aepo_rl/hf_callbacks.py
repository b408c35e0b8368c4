"""Hugging Face ``transformers.TrainerCallback`` objects driven by :class:`aepo_rl.AEPOTrainer`'s events.

A TRL user's callbacks are written for transformers' ``Trainer``: each method is called as
``method(args, state, control, **kwargs)``. :class:`HFCallback` wraps one and calls it that way, with a
real ``TrainingArguments`` (``output_dir`` the run folder, ``learning_rate``, ``max_steps``, ``seed``,
``save_steps``, ``eval_steps`` from the config), a ``TrainerState`` (``global_step``, ``max_steps``,
``log_history``) and a ``TrainerControl``:

==========================  ==========================================================================
AEPOTrainer event           transformers callback methods called
==========================  ==========================================================================
RL starts                   ``on_train_begin(model=, processing_class=, optimizer=)``
RL step ``k`` done          ``on_step_end`` then ``on_log(logs=)``; ``state.global_step = k``
an evaluation               ``on_evaluate(metrics={"eval_<task>/<split>_pass@1": ..., ...})``
a checkpoint                ``on_save``
``train()`` returns         ``on_train_end``
==========================  ==========================================================================

``logs`` is the step's line of metrics.jsonl (verl's names) plus TRL's names for the same quantities
(:data:`TRL_LOG_NAMES`). ``control.should_training_stop`` set by a callback ends RL after that step
(saved, then the final evaluation); the other ``control`` flags are not read: every step is logged, and
checkpoints and evaluations follow ``trainer.save_every`` and ``trainer.eval_every``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRL_LOG_NAMES = {
    "reward": "critic/score/mean",
    "completions/mean_length": "response_length/mean",
    "completions/max_length": "response_length/max",
    "entropy": "actor/entropy",
    "learning_rate": "actor/lr",
    "grad_norm": "actor/grad_norm",
    "loss": "actor/pg_loss",
}
"""TRL's name of a logged quantity → the metric of metrics.jsonl it copies. TRL's ``frac_reward_zero_std`` (the
share of groups whose rewards are all equal) is also given, as 1 − ``rollout/informative_group_frac`` when the
step logs that metric."""


def is_hf_callback(callback: Any) -> bool:
    """Whether ``callback`` (an object or a class) is a ``transformers.TrainerCallback``, without importing
    transformers."""
    cls = callback if isinstance(callback, type) else type(callback)
    return any(base.__name__ == "TrainerCallback" and base.__module__.startswith("transformers.")
               for base in cls.__mro__)


def trl_logs(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with TRL's names added (:data:`TRL_LOG_NAMES`, ``frac_reward_zero_std``)."""
    logs = dict(metrics)
    for trl_name, ours in TRL_LOG_NAMES.items():
        if ours in metrics:
            logs[trl_name] = metrics[ours]
    if "rollout/informative_group_frac" in metrics:
        logs["frac_reward_zero_std"] = 1.0 - metrics["rollout/informative_group_frac"]
    return logs


class HFCallback:
    """One ``transformers.TrainerCallback`` (an object, or a class built without arguments) as an
    :class:`aepo_rl.TrainerCallback`. Built when the AEPOTrainer is, so a callback that cannot be adapted
    is refused then, not mid-run."""

    def __init__(self, callback: Any, cfg, index: int):
        from transformers import TrainerControl, TrainerState

        if isinstance(callback, type):
            try:
                callback = callback()
            except TypeError as err:
                raise TypeError(f"callbacks[{index}]: the class {callback.__name__} cannot be built without arguments "
                                f"({err}); pass an instance") from None
        self.callback = callback
        trainer = cfg.trainer
        try:
            from transformers import TrainingArguments

            self.args = TrainingArguments(
                output_dir=str(Path(trainer.run_dir) / (trainer.run_name or "")), learning_rate=trainer.lr,
                max_steps=trainer.steps, seed=trainer.seed, save_steps=trainer.save_every, logging_steps=1,
                eval_steps=trainer.eval_every or None, weight_decay=trainer.weight_decay,
                max_grad_norm=trainer.grad_clip, warmup_steps=trainer.warmup_steps,
                per_device_train_batch_size=trainer.batch_size * cfg.rollout.n, run_name=trainer.run_name,
                report_to=[], use_cpu=trainer.device == "cpu")
        except ImportError as err:  # transformers' TrainingArguments needs accelerate
            raise TypeError(f"callbacks[{index}] ({_name(callback)}) is a transformers.TrainerCallback, whose "
                            f"arguments are transformers' TrainingArguments, which cannot be built here ({err}); "
                            "pip install accelerate, or subclass aepo_rl.TrainerCallback instead") from None
        self.state = TrainerState(max_steps=trainer.steps, logging_steps=1, save_steps=trainer.save_every,
                                  is_local_process_zero=True, is_world_process_zero=True)
        self.control = TrainerControl()

    @property
    def stop_requested(self) -> bool:
        return bool(self.control.should_training_stop)

    def _call(self, event: str, **kwargs) -> None:
        method = getattr(self.callback, event, None)
        if method is not None:
            result = method(self.args, self.state, self.control, **kwargs)
            if result is not None:  # transformers' Trainer takes a returned control as the new one
                self.control = result

    def _models(self, trainer) -> dict:
        rl = trainer._rl
        return {"model": rl.model, "processing_class": rl.tokenizer, "optimizer": getattr(rl, "optimizer", None)} \
            if rl is not None else {}

    def on_train_begin(self, trainer) -> None:
        self.args.output_dir = str(trainer.run_dir)
        self.state.global_step = trainer._rl.global_step if trainer._rl is not None else 0
        self._call("on_train_begin", **self._models(trainer))

    def on_step_end(self, trainer, step: int, metrics: dict[str, float]) -> None:
        self.state.global_step = step
        self._call("on_step_end", **self._models(trainer))
        logs = trl_logs(metrics)
        self.state.log_history.append({**logs, "step": step})
        self._call("on_log", logs=logs, **self._models(trainer))

    def on_evaluate(self, trainer, step: int, results: dict) -> None:
        metrics = {f"eval_{key}_{name}": value for key, result in results.items()
                   for name, value in result.items() if isinstance(value, (int, float))}
        self.state.log_history.append({**metrics, "step": step})
        self._call("on_evaluate", metrics=metrics, **self._models(trainer))

    def on_save(self, trainer, step: int, path: Path) -> None:
        self._call("on_save", **self._models(trainer))

    def on_train_end(self, trainer, results: dict) -> None:
        self._call("on_train_end", **self._models(trainer))


def _name(callback: Any) -> str:
    return callback.__name__ if isinstance(callback, type) else type(callback).__name__
