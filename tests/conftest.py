"""Shared fixtures: a tiny random Qwen3 with a locally trained byte-level BPE tokenizer."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import _trl_missing, _verl_missing, _vllm_missing, build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_tiny_model(tiny_tokenizer)


@pytest.fixture(scope="module")
def untied_model(tiny_model):
    """The tiny Qwen3 with an untied output layer: its greedy text varies (the tied one repeats its input)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(tiny_model.config)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


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
