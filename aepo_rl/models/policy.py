"""The policy ``cfg.model.path`` names, loaded on ``trainer.device`` (docs/algorithm.md §5)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from aepo_rl.models.hf import (
    check_model_dir,
    enable_gradient_checkpointing,
    init_random_model,
    load_hf_dir,
    load_tokenizer,
    resolve_device,
    torch_dtype,
)
from aepo_rl.models.smollm2 import smollm2_dir
from aepo_rl.models.tiny import build_tiny_model, train_tiny_tokenizer

if TYPE_CHECKING:
    from aepo_rl.config import Config, ModelConfig


class Texts(Protocol):
    """What building the tiny model (or its tokenizer) needs of a task: the text to train the tokenizer on."""

    def texts(self) -> list[str]: ...


def load_policy(cfg: Config, task: Texts | None = None) -> tuple[Any, Any]:
    """The policy ``(model, tokenizer)`` named by ``cfg.model.path`` (HF dir | "smollm2" | None = tiny),
    in ``model.dtype``, on ``trainer.device``, with gradient checkpointing when ``model.gradient_checkpointing``.

    The tiny model needs ``task``: its tokenizer is trained on ``task.texts()``; it is built and
    cached on the CPU whatever the device, so the cached build is the same on every machine.
    With ``model.init=random:<name>`` the weights are random ones of that architecture
    (:func:`init_random_model`) and only the tokenizer comes from ``model.path`` (unset: the tiny
    tokenizer, trained without building the tiny model). LoRA is not applied here; call
    :func:`apply_lora` on the result (it is a no-op when ``lora_rank`` is 0).
    """
    path, dtype = cfg.model.path, torch_dtype(cfg.model.dtype)
    device = resolve_device(cfg.trainer.device)
    if path is None and task is None:
        raise ValueError("model.path is None (the tiny default model or tokenizer), which trains its tokenizer on "
                         "the task's text: pass the task to load_policy(cfg, task)")
    if cfg.model.init is not None:
        tokenizer = (train_tiny_tokenizer(task.texts(), cfg.model.tiny_vocab_size) if path is None
                     else load_tokenizer(_policy_dir(cfg.model, task, seed=cfg.trainer.seed)))
        model = init_random_model(cfg.model.init.removeprefix("random:"), tokenizer, dtype, device,
                                  seed=cfg.trainer.seed)
    else:
        model, tokenizer = load_hf_dir(_policy_dir(cfg.model, task, seed=cfg.trainer.seed), dtype)
        model = model.to(device)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model, tokenizer


def _policy_dir(model_cfg: ModelConfig, task: Texts | None, seed: int) -> Path:
    """The HF folder ``model.path`` names: the (cached) tiny build, SmolLM2's converted folder, or the path."""
    if model_cfg.path is None:
        return build_tiny_model(model_cfg, task.texts(), seed=seed)
    if model_cfg.path == "smollm2":
        return smollm2_dir(model_cfg)
    return check_model_dir(model_cfg.path)
