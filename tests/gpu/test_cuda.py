"""The trainer on a GPU (trainer.device=cuda): placement, CPU/CUDA parity of log-probs, gradients and
the SFT loss, bf16 autocast on CUDA, a random Qwen3-0.6B shape training. Marked ``gpu``; skipped,
with the reason, where torch sees no CUDA device (docs/gpu.md)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import TINY_RL, VaryingRewardTask, build_tiny_model, demo, make_traj

from aepo_rl.config import load_config
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import enable_gradient_checkpointing, init_random_model, model_device, resolve_device
from aepo_rl.train.rl import RLTrainer, collate, response_logprobs
from aepo_rl.train.sft import collate as sft_collate
from aepo_rl.train.sft import masked_lm_loss, tokenize_demonstration

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the gpu tests need one")]


def test_auto_is_cuda_and_two_rl_steps_run_there(tiny_tokenizer):
    cfg = load_config(overrides=TINY_RL)
    assert resolve_device(cfg.trainer.device).type == "cuda"
    model = build_tiny_model(tiny_tokenizer, seed=1).to(resolve_device(cfg.trainer.device))
    engine = HFEngine(model, tiny_tokenizer, seed=0)
    trainer = RLTrainer(cfg, model, tiny_tokenizer, VaryingRewardTask(), engine)
    assert trainer.device.type == engine.generator.device.type == "cuda"
    for _ in range(2):
        metrics = trainer.step()
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert model_device(model).type == "cuda"
    assert 0 < metrics["perf/max_memory_allocated_gb"] <= metrics["perf/max_memory_reserved_gb"]


@pytest.mark.parametrize("bf16", [False, True])
def test_log_probs_and_gradients_on_cuda_match_the_cpu(tiny_tokenizer, bf16):
    trajs = [make_traj([3, 4, 5, 6], [7, 8, 9], [1, 1, 1]), make_traj([3, 4], [10, 11, 12, 13, 14], [1, 0, 0, 1, 1])]
    results = []
    for device in ("cpu", "cuda"):
        model = build_tiny_model(tiny_tokenizer, seed=2).to(device).train()
        batch = collate(trajs, [0, 1], tiny_tokenizer.pad_token_id).to(torch.device(device))
        log_probs, entropy = response_logprobs(model, batch, bf16=bf16 and device == "cuda")
        (log_probs * batch.response_mask).sum().backward()
        results.append((log_probs.detach().cpu(), entropy.cpu(), [p.grad.cpu() for p in model.parameters()]))
    (cpu_lp, cpu_h, cpu_grads), (cuda_lp, cuda_h, cuda_grads) = results
    tolerance = 0.1 if bf16 else 1e-4
    torch.testing.assert_close(cuda_lp, cpu_lp, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(cuda_h, cpu_h, atol=tolerance, rtol=tolerance)
    if not bf16:
        for a, b in zip(cuda_grads, cpu_grads):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_the_sft_loss_on_cuda_matches_the_cpu(tiny_tokenizer):
    samples = [tokenize_demonstration(tiny_tokenizer, demo(f"Who founded Velmora {i}?"), 512) for i in range(4)]
    model = build_tiny_model(tiny_tokenizer, seed=0)
    with torch.no_grad():
        cpu_loss = masked_lm_loss(model, sft_collate(samples, tiny_tokenizer.pad_token_id), bf16=False)[0]
        cuda_model = copy.deepcopy(model).cuda()
        cuda_loss = masked_lm_loss(cuda_model, sft_collate(samples, tiny_tokenizer.pad_token_id, "cuda"), bf16=False)[0]
    assert cuda_loss.item() == pytest.approx(cpu_loss.item(), rel=1e-4)


def test_a_random_qwen3_0_6b_takes_an_adamw_step_in_bf16_with_checkpointing(tiny_tokenizer):
    torch.cuda.reset_peak_memory_stats()
    model = init_random_model("qwen3-0.6b", tiny_tokenizer, torch.bfloat16, "cuda").train()
    enable_gradient_checkpointing(model)
    samples = [tokenize_demonstration(tiny_tokenizer, demo(f"Who founded Velmora {i}?"), 512) for i in range(8)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    loss, _ = masked_lm_loss(model, sft_collate(samples, tiny_tokenizer.pad_token_id, "cuda"), bf16=True)
    loss.backward()
    optimizer.step()
    print(f"qwen3-0.6b bf16 AdamW step: loss {loss.item():.3f}, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    assert math.isfinite(loss.item())
