"""Real model architectures without their weights, for ``model.init=random:<name>`` (docs/gpu.md).

An entry of :data:`aepo_rl.registry.ARCHITECTURES` is a factory ``(vocab_size) -> transformers
config``: the published shape of a model with the vocabulary sized to the tokenizer in use, so
that speed and memory can be measured where no weights can be downloaded. ``load_policy`` builds
it with random weights (:func:`aepo_rl.models.init_random_model`); ``@register_architecture(name)``
adds another.
"""

from __future__ import annotations

from aepo_rl.registry import register_architecture

QWEN3_SHAPES = {
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-1.7b": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": True},
    "qwen3-8b": {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": False},
}
"""The dense Qwen3 models' sizes, from their Hugging Face ``config.json`` files (Qwen/Qwen3-<size>);
what they share is :data:`QWEN3_COMMON`."""


QWEN3_COMMON = {"head_dim": 128, "num_key_value_heads": 8, "rope_theta": 1e6, "max_position_embeddings": 40960,
                "rms_norm_eps": 1e-6, "attention_bias": False, "use_sliding_window": False}
"""What every dense Qwen3 shares (same source)."""


def qwen3_config(vocab_size: int, **shape):
    """A Qwen3 config: :data:`QWEN3_COMMON` with ``shape`` on top, the vocabulary ``vocab_size``."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=vocab_size, **{**QWEN3_COMMON, **shape})


def _register_qwen3(name: str, shape: dict) -> None:
    @register_architecture(name)
    def config(vocab_size: int):
        return qwen3_config(vocab_size, **shape)


for _name, _shape in QWEN3_SHAPES.items():
    _register_qwen3(_name, _shape)
