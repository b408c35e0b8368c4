"""Memory and speed of one training step of real architectures with random weights (docs/gpu.md).

For each ``--plan`` (``<architecture>:full`` or ``<architecture>:lora<r>``): build the registered
architecture (``aepo_rl.registry.ARCHITECTURES``) with random weights in bf16 directly on the
device, turn on gradient checkpointing, and time one forward + backward + AdamW step over
``--tokens`` tokens (one sequence, next-token loss). Reports, per plan, the parameters (trainable
and all), the peak memory the step allocated and its seconds; a plan that does not fit reports
``out of memory`` instead of stopping the others. Prints a table and writes ``--out`` (JSON).

    python lab/gpu/gpu_probe.py                     # on a GPU: the plans of docs/gpu.md's memory table
    python lab/gpu/gpu_probe.py --device cpu --plans qwen3-mini:full --tokens 64   # a dry run

The default plans are the Qwen3 0.6B and 8B shapes at 8192 tokens with the Qwen3 vocabulary.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from aepo_rl.config import ModelConfig
from aepo_rl.models import apply_lora, enable_gradient_checkpointing
from aepo_rl.registry import ARCHITECTURES

QWEN3_VOCAB = 151936
DEFAULT_PLANS = ("qwen3-0.6b:full", "qwen3-8b:lora64", "qwen3-8b:full")


def parse_plan(plan: str) -> tuple[str, int]:
    """``"qwen3-8b:lora64"`` -> ``("qwen3-8b", 64)``; ``":full"`` is rank 0 (every weight trained)."""
    name, _, mode = plan.partition(":")
    if mode == "full":
        return name, 0
    if mode.startswith("lora") and mode[4:].isdigit() and int(mode[4:]) > 0:
        return name, int(mode[4:])
    raise SystemExit(f"--plans: '{plan}' must be <architecture>:full or <architecture>:lora<rank>, "
                     "e.g. qwen3-8b:lora64")


def peak_bytes(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def probe(plan: str, device: torch.device, tokens: int, vocab_size: int, seed: int = 0) -> dict:
    """One bf16 training step of ``plan`` on ``device``: parameters, peak bytes and seconds."""
    from transformers import AutoModelForCausalLM

    name, rank = parse_plan(plan)
    config = ARCHITECTURES.lookup(name)(vocab_size)
    result = {"plan": plan, "tokens": tokens, "device": str(device)}
    model = optimizer = None
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        enable_gradient_checkpointing(model)
        model = apply_lora(model, ModelConfig(lora_rank=rank, lora_alpha=2.0 * rank)) if rank else model
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        result["parameters"] = sum(p.numel() for p in model.parameters())
        result["trainable"] = sum(p.numel() for p in trainable)
        optimizer = torch.optim.AdamW(trainable, lr=1e-5)
        ids = torch.randint(vocab_size, (1, tokens), device=device, generator=torch.Generator(device).manual_seed(seed))
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        result["seconds"] = round(time.perf_counter() - start, 3)
        result["loss"] = loss.item()
        result["peak_gib"] = None if peak_bytes(device) is None else round(peak_bytes(device) / 2**30, 2)
    except torch.OutOfMemoryError:
        result["error"] = "out of memory"
        result["peak_gib"] = None if peak_bytes(device) is None else round(peak_bytes(device) / 2**30, 2)
    finally:
        del model, optimizer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", default=list(DEFAULT_PLANS))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=QWEN3_VOCAB)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu for a dry run)")
    results = [probe(plan, device, args.tokens, args.vocab) for plan in args.plans]
    print(f"one bf16 training step (gradient checkpointing, AdamW) at {args.tokens} tokens on {device}:")
    for r in results:
        figures = r.get("error") or f"{r['seconds']:.2f} s, peak {r['peak_gib']} GiB"
        print(f"  {r['plan']:<20} {r.get('trainable', 0) / 1e6:>9.1f}M of {r.get('parameters', 0) / 1e6:>9.1f}M "
              f"trained  {figures}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
