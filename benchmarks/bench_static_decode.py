"""The HF engine's static decode path against its dynamic path, side by side in one run.

The static path (``rollout.cuda_graphs``, :mod:`aepo_rl.engines.static`) decodes over fixed
buffers: dead rows stay in the batch until half are dead. On a GPU it replays a CUDA graph per step
whose attention reads every column of a 256-column bucket; on the CPU it runs the step eagerly over
the live columns only, and this measures what the dead rows and the buffers cost there against the
dynamic path's shrinking batch. Each round gives both engines the same fresh prompts (the tiny
default model's shape, random weights) and ragged budgets (rows finish at different steps, as in a
rollout), then appends a tool result to every row and decodes a second round, EOS ignored so both
decode the same tokens. Engines are kept across rounds (the static one reuses its buffers).

Prints decode tokens/s of each (median over rounds) and, last, ``ratio static/dynamic: <ratio>``
(above 1: the static path is faster); ``--json`` also writes them to a file.

    python benchmarks/bench_static_decode.py [--rows 32 --new-tokens 48 --repeats 5 --device cpu]
    python benchmarks/bench_static_decode.py --device cuda --shape qwen3-0.6b --dtype bfloat16 \
        --rows 64 --new-tokens 256 --repeats 3          # the GPU check (docs/gpu.md)

``--shape`` builds random weights of a registered architecture with the Qwen3 vocabulary (151,936)
instead of the tiny default model.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported, as aepo_rl.cli does

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from bench_decode_threads import print_speeds  # noqa: E402
from bench_rollout import pseudo_text, random_prompts  # noqa: E402

from aepo_rl.config import ModelConfig  # noqa: E402
from aepo_rl.engines.base import SamplingParams  # noqa: E402
from aepo_rl.engines.hf import HFEngine  # noqa: E402
from aepo_rl.models import init_tiny_model, torch_dtype, train_tiny_tokenizer  # noqa: E402
from aepo_rl.registry import ARCHITECTURES  # noqa: E402

QWEN3_VOCAB = 151936


def two_rounds(engine: HFEngine, prompts, budgets: list[int], tool: list[int]) -> float:
    """Decode tokens/s of two generate calls with a tool result appended between them."""
    seqs = [engine.add_sequence(p) for p in prompts]
    params = SamplingParams(ignore_eos=True)
    start = time.perf_counter()
    tokens = sum(len(s.token_ids) for s in engine.generate(seqs, params, budgets))
    for seq in seqs:
        engine.append(seq, tool)
    tokens += sum(len(s.token_ids) for s in engine.generate(seqs, params, budgets[::-1]))
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", help="a registered architecture (e.g. qwen3-0.6b) instead of the tiny model")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    tokenizer = train_tiny_tokenizer([pseudo_text(20000, seed) for seed in range(3)], ModelConfig().tiny_vocab_size)
    if args.shape:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(ARCHITECTURES.lookup(args.shape)(QWEN3_VOCAB),
                                                     dtype=torch_dtype(args.dtype))
    else:
        model = init_tiny_model(ModelConfig(), tokenizer, seed=0).to(device, torch_dtype(args.dtype))
    model.eval()
    prompts = random_prompts(tokenizer, args.rows, args.prompt_tokens, seed=0)
    draw = random.Random(0)
    budgets = [draw.randint(max(1, args.new_tokens // 4), args.new_tokens) for _ in prompts]
    tool = tokenizer.encode(" <result>\n150\n</result>", add_special_tokens=False)
    engines = {"static": HFEngine(model, tokenizer, seed=0, cpu_threads=1, cuda_graphs="on"),
               "dynamic": HFEngine(model, tokenizer, seed=0, cpu_threads=1, cuda_graphs="off")}
    print(f"{args.shape or 'tiny default model'} ({args.dtype}) on {device}: "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{args.rows} rows × 2 rounds of ragged budgets {min(budgets)}..{max(budgets)} tokens, one decoding thread")
    for engine in engines.values():  # warm-up (the static engine allocates its buffers, captures on CUDA)
        two_rounds(engine, prompts, budgets, tool)
    runs: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            runs[name].append(two_rounds(engine, prompts, budgets, tool))
    speed = print_speeds(runs)
    if args.json:
        captured = engines["static"].static.graphs_captured
        Path(args.json).write_text(json.dumps({"device": str(device), "shape": args.shape or "tiny", "rows": args.rows,
                                               "tokens_per_s": speed, "graphs_captured": captured,
                                               "ratio_static_dynamic": speed["static"] / speed["dynamic"]}))


if __name__ == "__main__":
    main()
