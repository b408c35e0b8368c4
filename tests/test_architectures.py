"""model.init=random:<name>: real architectures with random weights, sized to the tokenizer in use."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY_RL, TextTask, VaryingRewardTask, tiny_cfg

from aepo_rl import models, registry
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import init_random_model, load_policy
from aepo_rl.registry import UnknownNameError
from aepo_rl.train import pipeline
from aepo_rl.train.rl import RLTrainer

QWEN3_VOCAB = 151936


class Vocabulary:
    """A stand-in tokenizer of ``size`` tokens: all the shape needs."""

    eos_token_id, pad_token_id = 1, 0

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def qwen3_parameters(config) -> int:
    """Parameters of a dense Qwen3, counted from its config: embeddings, per layer the q/k/v/o
    projections, the SwiGLU MLP, two RMSNorms and the q/k norms, the final norm, an untied head."""
    h, d, i, v = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    attention = h * config.num_attention_heads * d * 2 + h * config.num_key_value_heads * d * 2
    layer = attention + 3 * h * i + 2 * h + 2 * d
    return v * h + config.num_hidden_layers * layer + h + (0 if config.tie_word_embeddings else v * h)


@pytest.mark.parametrize("name, published, tied", [("qwen3-0.6b", 596_049_920, True),
                                                   ("qwen3-8b", 8_190_735_360, False)])
def test_qwen3_shapes_have_the_published_sizes_without_allocating_them(name, published, tied):
    model = init_random_model(name, Vocabulary(QWEN3_VOCAB), torch.bfloat16, device="meta")
    params = list(model.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    assert sum(p.numel() for p in params) == qwen3_parameters(model.config) == published
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def test_qwen3_configs_are_the_published_ones():
    small, large = (registry.ARCHITECTURES.lookup(name)(QWEN3_VOCAB) for name in ("qwen3-0.6b", "qwen3-8b"))
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads, small.num_key_value_heads,
            small.head_dim, small.intermediate_size, small.tie_word_embeddings,
            small.max_position_embeddings) == (1024, 28, 16, 8, 128, 3072, True, 40960)
    assert (large.hidden_size, large.num_hidden_layers, large.num_attention_heads, large.num_key_value_heads,
            large.head_dim, large.intermediate_size, large.tie_word_embeddings,
            large.max_position_embeddings) == (4096, 36, 32, 8, 128, 12288, False, 40960)
    for config in (small, large):
        rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
        assert rope["rope_theta"] == 1e6 and config.rms_norm_eps == 1e-6


def test_the_vocabulary_is_sized_to_the_tokenizer(tiny_tokenizer):
    model = init_random_model("qwen3-0.6b", tiny_tokenizer, device="meta")
    assert model.get_input_embeddings().weight.shape == (len(tiny_tokenizer), 1024)
    assert model.config.eos_token_id == tiny_tokenizer.eos_token_id


def test_an_unknown_architecture_is_an_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"model.init='random:llama-70b' is not allowed; choose one of "
                                          r"\['random:qwen3-0.6b', 'random:qwen3-1.7b', "
                                          r"'random:qwen3-4b', 'random:qwen3-8b'\]"):
        load_config(overrides={"model.init": "random:llama-70b"})
    with pytest.raises(ConfigError, match="model.init='qwen3-0.6b' is not allowed"):
        load_config(overrides={"model.init": "qwen3-0.6b"})
    with pytest.raises(UnknownNameError, match="unknown architecture 'llama-70b'; valid names: qwen3-0.6b, "):
        init_random_model("llama-70b", Vocabulary(10), device="meta")


def test_load_policy_builds_the_architecture_with_the_task_tokenizer_and_trains_it(tmp_path, mini_architecture):
    cfg = tiny_cfg(tmp_path, **{"model.init": mini_architecture, **TINY_RL})
    model, tokenizer = load_policy(cfg, TextTask())
    again, _ = load_policy(cfg, TextTask())
    assert model.config.hidden_size == 64 and model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))  # seeded
    assert not (tmp_path / "tiny").exists(), "only the tokenizer is needed: no tiny model is built"
    trainer = RLTrainer(cfg, model, tokenizer, VaryingRewardTask(), HFEngine(model, tokenizer, seed=0))
    metrics = trainer.step()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    bf16, _ = load_policy(tiny_cfg(tmp_path, **{"model.init": mini_architecture, "model.dtype": "bfloat16"}),
                          TextTask())
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}


def test_a_random_model_is_saved_as_the_sft_model_and_later_stages_load_its_weights(tmp_path, mini_architecture,
                                                                                      monkeypatch):
    built = []
    original = models.init_random_model
    monkeypatch.setattr(models.policy, "init_random_model", lambda *a, **k: built.append(a[0]) or original(*a, **k))
    cfg = tiny_cfg(tmp_path, **{"model.init": mini_architecture, "sft.epochs": 0})
    sft_dir = pipeline.run_sft_stage(cfg, tmp_path / "run", task=TextTask())
    assert sft_dir == str(tmp_path / "run" / "checkpoints" / "sft") and built == ["qwen3-mini"]
    model, _ = pipeline._load_policy_from(cfg, sft_dir, TextTask())
    assert built == ["qwen3-mini"] and model.config.hidden_size == 64
