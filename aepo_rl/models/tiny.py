"""The default tiny model: a Qwen3-architecture model with a byte-level BPE tokenizer trained on the task's
own text, started from a written-in induction circuit and given a short copy warm-up
(:mod:`aepo_rl.models.copy_warmup`) in place of pretraining. It is built deterministically and cached
under ``cfg.model.cache_dir``, keyed by a hash of the model config and the text."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from aepo_rl.models.copy_warmup import CIRCUIT_STEPS, COPY_TARGET, copy_warmup, induction_circuit
from aepo_rl.models.hf import save_policy
from aepo_rl.progress import PhaseProgress
from aepo_rl.protocol import token_tags

if TYPE_CHECKING:
    from aepo_rl.config import ModelConfig

TOOL_TAGS = token_tags()
"""The protocol's built-in tags (§1.1 and Hermes), in a fixed order; each becomes one token of the tiny model."""

CHATML_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_TINY_BUILD_VERSION = 5
"""Bumped whenever the tiny build changes, so stale caches are not reused."""


def tiny_cache_key(model_cfg: ModelConfig, texts: list[str], seed: int) -> str:
    """sha256 over the tiny model's config, the init seed, the build version and the text."""
    sizes = {k: v for k, v in vars(model_cfg).items() if k.startswith("tiny_")}
    digest = hashlib.sha256(json.dumps({"sizes": sizes, "seed": seed, "version": _TINY_BUILD_VERSION},
                                       sort_keys=True).encode())
    for text in texts:
        digest.update(len(text).to_bytes(8, "little"))
        digest.update(text.encode())
    return digest.hexdigest()[:16]


def build_tiny_model(model_cfg: ModelConfig, texts: list[str], seed: int = 0) -> Path:
    """Build (or find in the cache) the tiny model for ``texts``; returns its HF directory."""
    root = Path(model_cfg.cache_dir).expanduser() / "tiny"
    folder = root / tiny_cache_key(model_cfg, texts, seed)
    if (folder / "config.json").is_file():
        return folder
    tokenizer = train_tiny_tokenizer(texts, model_cfg.tiny_vocab_size)
    model = init_tiny_model(model_cfg, tokenizer, seed)
    circuit = model_cfg.tiny_init == "induction"
    if circuit:
        induction_circuit(model, seed)
    if model_cfg.tiny_copy_steps:
        min_steps = CIRCUIT_STEPS if circuit else 0
        label = f"tiny model: copy warm-up to copy accuracy {COPY_TARGET} (cached after)"
        with PhaseProgress(label, model_cfg.tiny_copy_steps) as progress:
            steps = len(copy_warmup(model, tokenizer, model_cfg.tiny_copy_steps, seed, min_steps,
                                    on_step=lambda loss, accuracy:
                                    progress.advance(info=f"loss {loss:.3f}, copy accuracy {accuracy:.2f}")))
        reached = "reached its target" if steps < model_cfg.tiny_copy_steps else "ran all"
        progress.console.print(f"tiny model: copy warm-up {reached} after {steps} steps")
    save_policy(model, tokenizer, folder)
    return folder


def train_tiny_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on ``texts``; ChatML specials, tool tags as single tokens, ChatML template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not texts:
        raise ValueError("the tiny tokenizer needs text: task.texts() returned nothing")
    bpe = Tokenizer(models.BPE())
    # GPT-2 style pieces (a word carries its leading space, so a name copied from the question or
    # a result is the same tokens: " Vela" in both), except that a number never takes the space:
    # "{1995}" and " 1995" share the token "1995". Copying is then an identity map a tiny model
    # learns fast.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHATML_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token=None, unk_token=None)
    tokenizer.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TOOL_TAGS])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tiny_config(model_cfg: ModelConfig, vocab_size: int, eos_token_id: int | None, pad_token_id: int | None):
    """The transformers config of the tiny model: a Qwen3 with the ``tiny_*`` sizes and tied embeddings."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=model_cfg.tiny_hidden_size,
        intermediate_size=model_cfg.tiny_intermediate_size, num_hidden_layers=model_cfg.tiny_num_layers,
        num_attention_heads=model_cfg.tiny_num_heads, num_key_value_heads=model_cfg.tiny_num_kv_heads,
        head_dim=model_cfg.tiny_head_dim, max_position_embeddings=model_cfg.tiny_max_positions,
        tie_word_embeddings=True, eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None)


def init_tiny_model(model_cfg: ModelConfig, tokenizer, seed: int):
    """A randomly initialised tiny model (:func:`tiny_config`) for ``tokenizer``."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = tiny_config(model_cfg, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    return model.eval()
