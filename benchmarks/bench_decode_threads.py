"""Decoding on the CPU with one torch thread against torch's thread count, side by side in one run.

The HF engine decodes a small policy with one thread (``rollout.cpu_decode_threads``,
docs/training.md): its decoding kernels are too small to split, and a second thread costs more to
wake than it saves. This measures that choice on the tiny default model (random weights of the
default shape; speed does not depend on the weights) and, with ``--smollm2``, on the packaged
SmolLM2-135M: the same prompts and budget through ``HFEngine`` with ``cpu_threads=1`` and with
torch's setting, in alternating rounds, EOS ignored so both decode the same number of tokens.

Like the ``aepo`` command, it lets idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``) unless
the environment names a policy. Prints decode tokens/s of each (median) and, last,
``ratio 1-thread/torch: <tok/s ratio>`` (above 1: one thread is faster).

    python benchmarks/bench_decode_threads.py [--rows 32 --new-tokens 48 --repeats 5 --smollm2]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported, as aepo_rl.cli does

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from bench_rollout import pseudo_text, random_prompts  # noqa: E402

from aepo_rl.config import ModelConfig  # noqa: E402
from aepo_rl.engines.base import SamplingParams  # noqa: E402
from aepo_rl.engines.hf import HFEngine  # noqa: E402
from aepo_rl.models import init_tiny_model, load_smollm2_gguf, train_tiny_tokenizer  # noqa: E402


def tokens_per_s(model, tokenizer, prompts, new_tokens: int, threads: int | None) -> float:
    engine = HFEngine(model, tokenizer, seed=0, cpu_threads=threads)
    seqs = [engine.add_sequence(p) for p in prompts]
    start = time.perf_counter()
    segments = engine.generate(seqs, SamplingParams(ignore_eos=True), [new_tokens] * len(seqs))
    return sum(len(s.token_ids) for s in segments) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smollm2", action="store_true", help="the packaged SmolLM2-135M instead of the tiny model")
    args = parser.parse_args()
    if args.smollm2:
        model, tokenizer = load_smollm2_gguf()
        name = "SmolLM2-135M"
    else:
        tokenizer = train_tiny_tokenizer([pseudo_text(20000, seed) for seed in range(3)], ModelConfig().tiny_vocab_size)
        model = init_tiny_model(ModelConfig(), tokenizer, seed=0)
        name = "tiny default model"
    model.eval()
    prompts = random_prompts(tokenizer, args.rows, args.prompt_tokens, seed=0)
    threads = torch.get_num_threads()
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {args.rows} rows × "
          f"{args.new_tokens} new tokens, torch threads {threads}, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    tokens_per_s(model, tokenizer, prompts, 4, None)  # warm-up
    runs: dict[str, list[float]] = {"1-thread": [], "torch": []}
    for _ in range(args.repeats):
        runs["1-thread"].append(tokens_per_s(model, tokenizer, prompts, args.new_tokens, 1))
        runs["torch"].append(tokens_per_s(model, tokenizer, prompts, args.new_tokens, None))
    print_speeds(runs)


def print_speeds(runs: dict[str, list[float]]) -> dict[str, float]:
    """Print the median decode tokens/s of each of two runs, then ``ratio first/second``; returns the medians."""
    speed = {key: statistics.median(values) for key, values in runs.items()}
    for key, value in speed.items():
        print(f"{key:9s} {value:9.0f} decode tokens/s")
    first, second = speed
    print(f"ratio {first}/{second}: {speed[first] / speed[second]:.3f}")
    return speed


if __name__ == "__main__":
    main()
