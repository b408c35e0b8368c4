"""LoRA adapters (peft, the ``[lora]`` extra) around a policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aepo_rl.errors import MissingExtraError

if TYPE_CHECKING:
    from aepo_rl.config import ModelConfig


def is_peft(model) -> bool:
    """Whether ``model`` is a peft model (LoRA adapters around a base model)."""
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def apply_lora(model, model_cfg: ModelConfig):
    """Wrap ``model`` with LoRA adapters (peft) when ``model_cfg.lora_rank > 0``; else return it as is.

    Only the adapters (rank r, scale alpha / r, on ``lora_target_modules``) are trainable.
    Applying it to a model that already has adapters returns the model unchanged.
    """
    if model_cfg.lora_rank <= 0 or is_peft(model):
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise MissingExtraError("model.lora_rank > 0 needs peft: pip install -e "
                                "'.[lora]' in the aepo-rl clone") from None
    lora = LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                      target_modules=list(model_cfg.lora_target_modules), lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")
    return get_peft_model(model, lora)
