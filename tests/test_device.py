"""trainer.device (validation, resolution, the CPU results of `auto` on a machine without a GPU) and
model.gradient_checkpointing in training."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import TINY_RL, TextTask, VaryingRewardTask, build_tiny_model, demo, tiny_cfg

from aepo_rl import models
from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import enable_gradient_checkpointing, load_policy, model_device, resolve_device
from aepo_rl.models.forward import recomputes_layers
from aepo_rl.train.rl import RLTrainer
from aepo_rl.train.sft import run_sft


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_names_are_accepted(name):
    assert load_config(overrides={"trainer.device": name}).trainer.device == name


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "mps", ""])
def test_other_device_names_are_refused_naming_the_key_and_the_choices(name):
    with pytest.raises(ConfigError, match=r"trainer.device=.*choose one of \['auto', 'cpu', 'cuda', 'cuda:N'\]"):
        load_config(overrides={"trainer.device": name})


def test_auto_is_cuda_when_torch_sees_a_gpu_else_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_a_gpu_torch_does_not_see_is_an_error_naming_the_key(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError,
                       match=r"trainer.device='cuda', but torch sees 0 CUDA device.*trainer.device=auto or cpu"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"trainer.device='cuda:2', but torch sees 2 CUDA device"):
        resolve_device("cuda:2")


def test_load_policy_puts_the_model_on_the_resolved_device_with_checkpointing_as_asked(tmp_path, monkeypatch):
    placed = []
    monkeypatch.setattr(models.policy, "resolve_device", lambda name: placed.append(name) or torch.device("cpu"))
    model, _ = load_policy(tiny_cfg(tmp_path, **{"trainer.device": "cpu"}), TextTask())
    assert placed == ["cpu"] and model_device(model) == torch.device("cpu")
    assert not recomputes_layers(model.train())
    model, _ = load_policy(tiny_cfg(tmp_path, **{"model.gradient_checkpointing": True}), TextTask())
    assert recomputes_layers(model.train()) and not recomputes_layers(model.eval())


def _rl_and_sft_numbers(tokenizer, device: str) -> dict:
    """Two RL steps (with a KL term, so the reference model is used) and two SFT epochs of the tiny
    model on ``trainer.device=device``: every metric but timings, and the trained weights."""
    cfg = load_config(overrides={**TINY_RL, "algorithm.use_kl_loss": True, "trainer.device": device})
    model = build_tiny_model(tokenizer, seed=1).to(resolve_device(cfg.trainer.device))
    trainer = RLTrainer(cfg, model, tokenizer, VaryingRewardTask(), HFEngine(model, tokenizer, seed=0))
    assert trainer.device == model_device(trainer.ref_model) == model_device(model)
    numbers = {}
    for step in range(2):
        numbers.update({f"{step}/{key}": value for key, value in trainer.step().items()
                        if not key.startswith("timing_s/") and not key.endswith("per_s")})
    sft_model = build_tiny_model(tokenizer, seed=0).to(resolve_device(cfg.trainer.device))
    sft_cfg = load_config(overrides={"sft.epochs": 2, "sft.batch_size": 4, "trainer.device": device})
    sft = run_sft(sft_cfg, sft_model, tokenizer, [demo(f"Who founded Velmora {i}?") for i in range(8)], [demo()])
    numbers.update(sft_loss=sft["loss_curve"], dev=sft["dev/token_accuracy"])
    weights = [p.detach().cpu() for p in [*model.parameters(), *sft_model.parameters()]]
    return numbers, weights


@pytest.mark.skipif(torch.cuda.is_available(), reason="trainer.device=auto is cuda on this machine")
def test_auto_on_a_machine_without_gpu_gives_the_cpu_numbers_exactly(tiny_tokenizer):
    cpu_numbers, cpu_weights = _rl_and_sft_numbers(copy.deepcopy(tiny_tokenizer), "cpu")
    auto_numbers, auto_weights = _rl_and_sft_numbers(copy.deepcopy(tiny_tokenizer), "auto")
    assert auto_numbers == cpu_numbers  # exact: same floats, not approximately
    assert all(torch.equal(a, b) for a, b in zip(auto_weights, cpu_weights))


def test_an_rl_step_and_sft_with_gradient_checkpointing_match_the_plain_ones(tiny_tokenizer):
    """Same rollout, and an update equal up to float summation order (the rows run whole instead of
    sharing their prefix, models/forward.py)."""
    results = []
    for checkpointing in (False, True):
        cfg = load_config(overrides=TINY_RL)
        model = build_tiny_model(tiny_tokenizer, seed=1)
        if checkpointing:
            enable_gradient_checkpointing(model)
        trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), HFEngine(model, tiny_tokenizer, seed=0))
        metrics = {k: v for k, v in trainer.step().items() if not k.startswith("timing_s/") and not k.endswith("per_s")}
        sft_model = build_tiny_model(tiny_tokenizer, seed=0)
        if checkpointing:
            enable_gradient_checkpointing(sft_model)
        sft = run_sft(load_config(overrides={"sft.epochs": 1, "sft.batch_size": 4}), sft_model, tiny_tokenizer,
                      [demo(f"Who founded Velmora {i}?") for i in range(8)])
        results.append((metrics, sft["loss_curve"], [p.detach().clone() for p in model.parameters()]))
    (plain, plain_sft, plain_weights), (checkpointed, checkpointed_sft, checkpointed_weights) = results
    assert checkpointed.keys() == plain.keys()
    for key, value in plain.items():
        assert checkpointed[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert checkpointed_sft == pytest.approx(plain_sft, rel=1e-5)
    for a, b in zip(checkpointed_weights, plain_weights):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
