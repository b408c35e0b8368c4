"""Shared fixtures: a tiny random Qwen3 with a locally trained byte-level BPE tokenizer."""

from __future__ import annotations

import pytest
import torch

from aepo_rl.protocol import token_tags


_SAMPLE_TEXT = (
    "<think>I need to find who founded Velmora.</think> <search>Velmora founder</search>"
    " <result>\nPage 1: Velmora — Velmora was founded in 1874 by Ada Korrin.\n</result>"
    " <python>print(2024 - 1874)</python> <result>\n150\n</result>"
    " <answer>\\boxed{Ada Korrin}</answer> The quick brown fox jumps over the lazy dog 0123456789."
)


def build_tiny_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_SAMPLE_TEXT] * 20, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 bos_token=None, unk_token=None)
    hf.add_tokens(token_tags())
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return hf


def build_tiny_model(tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer)


@pytest.fixture
def mini_architecture():
    """A registered Qwen3 shape small enough to train here (the way a plugin adds one)."""
    from aepo_rl import registry
    from aepo_rl.architectures import qwen3_config

    registry.register_architecture("qwen3-mini")(lambda vocab_size: qwen3_config(
        vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True))
    yield "random:qwen3-mini"
    del registry.ARCHITECTURES["qwen3-mini"]


def _vllm_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed here: the vllm tests run in .venv-vllm (.ci/run, docs/engines.md)"
    return None


def _verl_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        return "verl is not installed here: the verl tests run in .venv-verl (.ci/run, docs/verl.md)"
    return None


def _trl_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return 'trl is not installed here: pip install -e ".[dev]" (or ".[trl]") installs it (docs/trl.md)'
    return None


def _missing() -> dict[str, str]:
    """Marker -> why its tests are skipped here (an optional stack that is not installed)."""
    checks = (("vllm", _vllm_missing), ("verl", _verl_missing), ("trl", _trl_missing))
    return {marker: reason for marker, check in checks if (reason := check())}


def pytest_report_header(config):
    return [f"{marker} tests skipped: {reason}" for marker, reason in _missing().items()]


def pytest_collection_modifyitems(config, items):
    for marker, reason in _missing().items():
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
