"""TRL's training arguments on aepo-rl's config: ``AEPOTrainer(args=GRPOConfig(...))`` and TRL's keyword arguments.

Every ``GRPOConfig`` field (TRL 1.16, with transformers' ``TrainingArguments``) that aepo-rl's trainer can honour
becomes config keys (docs/python-api.md, "Coming from TRL"):

- the names with an exact counterpart (:data:`aepo_rl.config.TRL_ALIASES`: ``learning_rate`` → ``trainer.lr``, …);
- the ones that need a translation (:data:`TRANSLATED`): ``beta`` → a k3 KL loss term, ``report_to`` → TensorBoard /
  Weights & Biases, TRL's batch arithmetic → prompts per step and per optimizer step, ``loss_type``,
  ``scale_rewards``, ``lr_scheduler_type``, ``warmup_ratio``, ``use_vllm``, ``use_cpu``, AEPOGRPOConfig's ``aepo_*``;
- the ones with nothing to do here (:data:`NO_EFFECT`: ``logging_steps``, …) are accepted and named in a note.

Anything else set away from TRL's default is refused, every such field at once, each with its reason. From a
``GRPOConfig`` object only the fields that differ from a fresh ``GRPOConfig``'s are read (TRL's defaults are not the
user's choice and keep the preset's values; the note names them), plus ``report_to``, whose default "none" is one.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from aepo_rl.config import TRL_ALIASES, TRL_NEAR

NO_EFFECT: dict[str, str] = {
    **{name: "every RL step is logged (metrics.jsonl, TensorBoard, the console)" for name in (
        "logging_steps", "logging_strategy", "logging_first_step", "logging_dir", "logging_nan_inf_filter",
        "log_level", "log_level_replica", "log_on_each_node", "disable_tqdm", "log_completions",
        "num_completions_to_print", "log_unique_prompts", "log_multimodal", "include_num_input_tokens_seen")},
    "per_device_eval_batch_size": "evaluation runs eval.batch_size questions per rollout call",
    "eval_strategy": "evaluations follow eval_steps (trainer.eval_every)",
    "save_strategy": "checkpoints follow save_steps (trainer.save_every)",
    "overwrite_output_dir": "AEPOTrainer(overwrite_output_dir=True)",
    "remove_unused_columns": "every column reaches the reward functions",
    "dataloader_num_workers": "rows are read in memory", "dataloader_pin_memory": "rows are read in memory",
    "dataloader_drop_last": "rows are read in memory", "dataloader_persistent_workers": "rows are read in memory",
    "do_train": "train() trains", "do_eval": "eval_dataset is evaluated before and after RL", "do_predict": "unused",
    "use_cache": "the engine keeps its own key/value cache", "ds3_gather_for_generation": "one process, no DeepSpeed",
    "cast_lm_head_to_fp32": "the policy's forward is float32 unless trainer.bf16",
    "num_train_epochs": "RL counts steps (max_steps, trainer.steps); TRL too ignores it when max_steps is set",
}
"""Fields accepted because they change nothing here, with why."""

LOSS_TYPES = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}
"""TRL's ``loss_type`` → ``algorithm.loss_agg_mode`` (docs/algorithm.md §2.5)."""
AEPO_FIELDS = {"aepo_sg_upper_clip": "algorithm.sg_upper_clip", "aepo_entropy_adv_coef": "algorithm.entropy_adv_coef",
               "aepo_entropy_adv_clamp": "algorithm.entropy_adv_clamp",
               "aepo_grad_preserve_entropy_quantile": "algorithm.grad_preserve_entropy_quantile"}
"""``AEPOGRPOConfig``'s AEPO keys (aepo_rl.integrations.trl) → this trainer's."""
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                "generation_batch_size")
TRANSLATED = ("beta", "report_to", "optim", "loss_type", "scale_rewards", "lr_scheduler_type", "warmup_ratio",
              "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length", "use_cpu",
              "reward_weights", "project", *BATCH_FIELDS, *AEPO_FIELDS)
"""Fields mapped by a translation rather than one key."""


def known(name: str) -> bool:
    """Whether ``name`` is a TRL / transformers argument this module knows (mapped, translated, without effect, or
    named in :data:`~aepo_rl.config.TRL_NEAR`)."""
    return name in TRL_ALIASES or name in TRANSLATED or name in NO_EFFECT or name in TRL_NEAR


@dataclasses.dataclass
class Mapped:
    """What TRL's arguments become: ``overrides`` (dotted keys), ``reward_weights`` (None: not given), one-line
    ``notes`` for the console, and ``refused`` (field → reason)."""

    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    reward_weights: list | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    refused: dict[str, str] = dataclasses.field(default_factory=dict)


def explicit_fields(args: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The fields of ``args`` (a ``GRPOConfig``, any ``TrainingArguments`` dataclass, or a mapping) the user set: those
    that differ from a fresh object of its class built with the same ``output_dir`` and ``use_cpu`` (TRL's
    ``__post_init__`` fills some fields, so the dataclass defaults alone would not do), plus ``report_to``, and all
    of TRL's batch arithmetic (:data:`BATCH_FIELDS`) when it or ``num_generations`` was set; and the fields left
    at TRL's defaults, with their values."""
    if isinstance(args, Mapping):
        return dict(args), {}
    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise TypeError(f"args must be a GRPOConfig (or another transformers TrainingArguments), or a dict of TRL's "
                        f"argument names, got {type(args).__name__}")
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = type(args)(**{k: values[k] for k in ("output_dir", "use_cpu") if k in values})
    explicit = {name: value for name, value in values.items()
                if name == "report_to" or value != getattr(fresh, name, dataclasses.MISSING)}
    if any(name in explicit for name in (*BATCH_FIELDS, "num_generations")):
        explicit.update({name: values[name] for name in (*BATCH_FIELDS, "num_generations") if name in values})
    return explicit, {name: value for name, value in values.items() if name not in explicit}


def map_trl_args(values: dict[str, Any], *, steps: int, n: int) -> Mapped:
    """``values`` (TRL's names → the user's values) as config keys; ``steps`` and ``n`` are ``trainer.steps`` and
    ``rollout.n`` before (for ``warmup_ratio`` without ``max_steps``, a batch size without ``num_generations``)."""
    out = Mapped()
    set_ = out.overrides
    for name, value in values.items():
        if name in TRL_ALIASES:
            if name == "max_steps" and value is not None and value <= 0:
                out.refused[name] = f"{value} (TRL: train by epochs); RL here counts steps: give max_steps > 0"
            elif name == "top_k" and value is None:
                set_[TRL_ALIASES[name]] = 0
            elif name in ("min_p", "num_generations_eval", "save_total_limit", "eval_steps") and value is None:
                continue  # TRL's None: off / the default
            else:
                set_[TRL_ALIASES[name]] = value
        elif name in AEPO_FIELDS:
            set_[AEPO_FIELDS[name]] = value
        elif name in NO_EFFECT:
            out.notes.append(f"{name} has no effect here: {NO_EFFECT[name]}")
    _translate(values, out, steps, n)
    for name, value in values.items():
        if not (name in TRL_ALIASES or name in TRANSLATED or name in NO_EFFECT) and not _is_off(value):
            out.refused.setdefault(name, f"{value!r}: {TRL_NEAR.get(name, 'aepo-rl has no counterpart')}")
    return out


def _is_off(value: Any) -> bool:
    """A value that asks for nothing (None, False, empty), which an unsupported field may keep."""
    return value is None or value is False or value == [] or value == {} or value == ""


def _translate(values: dict[str, Any], out: Mapped, steps: int, n: int) -> None:
    set_, refused = out.overrides, out.refused
    if "beta" in values:  # TRL: β·KL(π_θ‖π_ref) per token, k3 estimator, in the loss (docs/algorithm.md §2.8)
        beta = float(values["beta"])
        set_.update({"algorithm.use_kl_loss": beta > 0, **({"algorithm.kl_loss_coef": beta,
                                                           "algorithm.kl_loss_type": "k3"} if beta > 0 else {})})
    if "report_to" in values:
        report = values["report_to"]
        report = [] if report in (None, "none") else [report] if isinstance(report, str) else list(report)
        if "all" in report:
            report = ["tensorboard", "wandb"]
        others = [r for r in report if r not in ("tensorboard", "wandb")]
        if others:
            refused["report_to"] = (f"{others}: metrics go to metrics.jsonl, TensorBoard and Weights & Biases here; "
                                    "pass a transformers callback of that integration as callbacks=[...] instead")
        set_["trainer.tensorboard"] = "tensorboard" in report
        set_["trainer.wandb_project"] = (values.get("project") or os.environ.get("WANDB_PROJECT") or "huggingface") \
            if "wandb" in report else None
    if "optim" in values:
        optim = str(getattr(values["optim"], "value", values["optim"]))
        if not optim.startswith("adamw_torch"):
            refused["optim"] = f"{optim!r}: the optimizer here is torch's AdamW (adamw_torch, adamw_torch_fused)"
    if "loss_type" in values:
        if values["loss_type"] in LOSS_TYPES:
            set_["algorithm.loss_agg_mode"] = LOSS_TYPES[values["loss_type"]]
        else:
            refused["loss_type"] = (f"{values['loss_type']!r}: the aggregations here are verl's (§2.5); TRL's "
                                    f"{', '.join(f'{k} = {v}' for k, v in LOSS_TYPES.items())}")
    if "scale_rewards" in values:
        scale = values["scale_rewards"]
        if scale in (True, "group", False, "none"):
            set_["algorithm.norm_adv_by_std"] = scale in (True, "group")
        else:
            refused["scale_rewards"] = f"{scale!r}: advantages are normalised per group ('group') or not ('none')"
    if "lr_scheduler_type" in values:
        kind = str(getattr(values["lr_scheduler_type"], "value", values["lr_scheduler_type"]))
        if kind in ("constant", "constant_with_warmup", "cosine"):
            set_["trainer.lr_schedule"] = "cosine" if kind == "cosine" else "constant"
        else:
            refused["lr_scheduler_type"] = f"{kind!r}: trainer.lr_schedule is constant or cosine (with warmup_steps)"
    if values.get("warmup_ratio"):
        set_["trainer.warmup_steps"] = math.ceil(values["warmup_ratio"] * set_.get("trainer.steps", steps))
    if values.get("use_vllm"):
        if values.get("vllm_mode", "colocate") == "colocate":
            set_["rollout.engine"] = "vllm"
        else:
            refused["vllm_mode"] = (f"{values['vllm_mode']!r}: RL here runs vLLM in the trainer's process "
                                    "(rollout.engine=vllm, TRL's colocate)")
    if values.get("vllm_gpu_memory_utilization") is not None:
        set_["rollout.vllm_gpu_memory_utilization"] = values["vllm_gpu_memory_utilization"]
    if values.get("vllm_max_model_length") is not None:
        set_["rollout.vllm_max_model_len"] = values["vllm_max_model_length"]
    if values.get("use_cpu"):
        set_["trainer.device"] = "cpu"
    if values.get("reward_weights") is not None:
        out.reward_weights = list(values["reward_weights"])
    _batch(values, out, set_.get("rollout.n", n))


def _batch(values: dict[str, Any], out: Mapped, n: int) -> None:
    """TRL counts completions: per_device_train_batch_size per forward, × gradient_accumulation_steps per optimizer
    step, × steps_per_generation (default: the same) per generation. Here: trainer.micro_batch_size sequences per
    forward, trainer.mini_batch_size prompts per optimizer step, trainer.batch_size prompts per RL step (one
    generation); a prompt is num_generations completions (one process)."""
    if not any(values.get(name) for name in BATCH_FIELDS):
        return
    per_device = values.get("per_device_train_batch_size") or 8
    accumulation = values.get("gradient_accumulation_steps") or 1
    generation = (values.get("generation_batch_size")
                  or per_device * (values.get("steps_per_generation") or accumulation))
    per_step = per_device * accumulation
    if per_step % n or generation % n:
        out.refused["per_device_train_batch_size"] = (
            f"{per_device} × gradient_accumulation_steps {accumulation} = {per_step} completions per optimizer step "
            f"and {generation} per generation must both be multiples of num_generations={n} (whole groups)")
        return
    out.overrides.update({"trainer.batch_size": generation // n, "trainer.mini_batch_size": per_step // n,
                          "trainer.micro_batch_size": per_device})
