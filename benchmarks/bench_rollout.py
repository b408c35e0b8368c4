"""Rollout engine speed on one tiny random Qwen3 (~1M parameters), side by side in one run.

(a) Single-turn sampling: HFEngine decode tokens/s ÷ ``model.generate`` tokens/s on the same
    model and batch (temperature 1, top_p 1; EOS stops a row in both). Both are timed
    round-robin, median of the repetitions, so machine load hits both alike. The engine also
    computes per-token log-probs, full entropies and the top-10 proxy (§1.2); generate does not.
(b) Multi-round tool rollouts with branching (§1.5): a scripted scenario (m global samples per
    prompt, every round each trajectory calls a tool and gets a fixed result, the first
    trajectories fork after the result) counts the context tokens the engine prefilled against
    the unique context tokens (prompts + tool results, each once), and against re-generating
    from the full context every round (what a cache-less engine computes).
Usage: python benchmarks/bench_rollout.py [--batch 8 --new-tokens 64 --repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from aepo_rl.config import ModelConfig
from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import init_tiny_model, train_tiny_tokenizer

TINY_1M = dict(tiny_hidden_size=96, tiny_num_layers=4, tiny_intermediate_size=384, tiny_num_heads=4,
               tiny_num_kv_heads=2, tiny_head_dim=24)
"""The 1M row of resources.md (vocab up to 4096)."""


def pseudo_text(words: int, seed: int = 0) -> str:
    """Seeded pseudo-words (1-4 syllables) around the tool tags: enough variety for a 4k BPE vocabulary."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
    syllables += ["th", "sh", "qu", "x", " <search>", "</search>"]
    return " ".join("".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(words))


def build_model(vocab_size: int):
    texts = [pseudo_text(20000, seed) for seed in range(5)]
    tokenizer = train_tiny_tokenizer(texts, vocab_size)
    model = init_tiny_model(ModelConfig(**TINY_1M), tokenizer, seed=0)
    return model, tokenizer


def random_prompts(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    first_plain = max(tokenizer.all_special_ids) + 1
    return torch.randint(first_plain, len(tokenizer) - 16, (count, length), generator=g).tolist()


def tokens_until_eos(new_tokens: torch.Tensor, eos_id: int) -> int:
    """Tokens a row really generated: up to and including its first EOS."""
    is_eos = new_tokens == eos_id
    first = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, new_tokens.shape[1])
    return int(first.sum())


def time_engine(model, tokenizer, prompts, new_tokens: int, seed: int) -> float:
    engine = HFEngine(model, tokenizer, seed=seed)
    seqs = [engine.add_sequence(p) for p in prompts]
    start = time.perf_counter()
    segments = engine.generate(seqs, SamplingParams(), [new_tokens] * len(seqs))
    return sum(len(s.token_ids) for s in segments) / (time.perf_counter() - start)


def time_generate(model, tokenizer, prompts, new_tokens: int, seed: int) -> float:
    input_ids = torch.tensor(prompts)
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
    elapsed = time.perf_counter() - start
    return tokens_until_eos(out[:, input_ids.shape[1]:], tokenizer.eos_token_id) / elapsed


def bench_decode(model, tokenizer, batch: int, new_tokens: int, repeats: int) -> float:
    prompts = random_prompts(tokenizer, batch, 16, seed=0)
    time_engine(model, tokenizer, prompts, 8, 0)  # warm-up
    time_generate(model, tokenizer, prompts, 8, 0)
    ours, theirs = [], []
    for r in range(repeats):
        ours.append(time_engine(model, tokenizer, prompts, new_tokens, r))
        theirs.append(time_generate(model, tokenizer, prompts, new_tokens, r))
    ours_med, theirs_med = statistics.median(ours), statistics.median(theirs)
    print(f"(a) single-turn sampling, batch {batch} x {new_tokens} new tokens, median of {repeats}:")
    print(f"    HFEngine (with logprobs + entropies): {ours_med:8.0f} tok/s")
    print(f"    model.generate:                       {theirs_med:8.0f} tok/s")
    return ours_med / theirs_med


def bench_prefill(model, tokenizer, prompts_count: int, n: int, m: int, rounds: int) -> tuple[int, int, int]:
    """Scripted tree rollout; returns (prefilled by the engine, re-prefill baseline, unique context tokens)."""
    engine = HFEngine(model, tokenizer, seed=0)
    params = SamplingParams(stop=("</search>", "</python>"))
    tool_result = tokenizer.encode(" <result>\nPage 1: a fixed tool answer of some twenty tokens.\n</result>",
                                   add_special_tokens=False)
    prompts = [random_prompts(tokenizer, 1, 20 + 10 * i, seed=i + 1)[0] for i in range(prompts_count)]
    groups = [[engine.add_sequence(p) for _ in range(m)] for p in prompts]
    unique = sum(len(p) for p in prompts)
    baseline = 0
    for round_index in range(rounds):
        active = [s for g in groups for s in g]
        baseline += sum(len(engine.token_ids(s)) for s in active)
        engine.generate(active, params, [24] * len(active))
        if round_index == rounds - 1:
            break
        for group in groups:
            for seq in group:
                engine.append(seq, tool_result)
                unique += len(tool_result)
            for parent in list(group)[: n - len(group)]:  # fork after the tool result, up to n per prompt
                group.append(engine.fork(parent))
    prefilled = int(engine.stats()["prefill_tokens"])
    print(f"(b) tree rollout: {prompts_count} prompts, m = {m} global samples, up to n = {n}, {rounds} tool rounds, "
          f"{sum(len(g) for g in groups)} trajectories")
    print(f"    unique context tokens (prompts + tool results): {unique}")
    print(f"    prefilled by HFEngine (KV reuse, forks share):  {prefilled}")
    print(f"    re-generating from the full context each round: {baseline}  "
          f"(ratio {baseline / unique:.2f})")
    return prefilled, baseline, unique


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = build_model(args.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen3 {params / 1e6:.2f}M parameters, vocab {len(tokenizer)}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    decode_ratio = bench_decode(model, tokenizer, args.batch, args.new_tokens, args.repeats)
    prefilled, _, unique = bench_prefill(model, tokenizer, prompts_count=4, n=4, m=2, rounds=3)
    print(f"ratio decode/generate: {decode_ratio:.3f}")
    print(f"ratio prefill/unique: {prefilled / unique:.3f}")


if __name__ == "__main__":
    main()
