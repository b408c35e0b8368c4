"""Time every policy loss (forward + backward) on [256, 4096] tensors, relative to ``ppo``.

Losses are timed round-robin in the same run (median of the repetitions), so machine load
affects all of them alike. ``aepo`` runs with its default config (entropy-aware advantage on,
a = 0.2) in the worst case: the entropy statistics computed inside the loss (micro-batch scope);
``aepo+stats`` gets them precomputed, as the trainer does once per mini-batch (default scope).
Usage: python benchmarks/bench_losses.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from aepo_rl.algorithms import POLICY_LOSSES, PolicyLossConfig, entropy_stats, get_policy_loss


def make_inputs(batch: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    lengths = torch.randint(length // 4, length + 1, (batch, 1), generator=gen)
    return {
        "old_log_prob": old,
        "log_prob": old + 0.3 * torch.randn(batch, length, generator=gen),
        "advantages": torch.randn(batch, 1, generator=gen).expand(batch, length).contiguous(),
        "response_mask": (torch.arange(length)[None, :] < lengths).float(),
        "entropy": torch.rand(batch, length, generator=gen) * 4,
    }


def time_once(name: str, inputs: dict[str, torch.Tensor], cfg: PolicyLossConfig, stats=None) -> float:
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    start = time.perf_counter()
    loss, _ = get_policy_loss(name)(inputs["old_log_prob"], log_prob, inputs["advantages"], inputs["response_mask"],
                                    "token-mean", cfg, inputs["entropy"], entropy_stats=stats)
    loss.backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    inputs = make_inputs(args.batch, args.length)
    cfg = PolicyLossConfig()
    stats = entropy_stats(inputs["entropy"], inputs["response_mask"], "mini-batch")
    runs = {name: (name, None) for name in ["ppo"] + sorted(set(POLICY_LOSSES) - {"ppo"})}
    runs["aepo+stats"] = ("aepo", stats)
    times: dict[str, list[float]] = {label: [] for label in runs}
    for repeat in range(args.repeats + 1):  # the first round is a warm-up
        for label, (name, precomputed) in runs.items():
            elapsed = time_once(name, inputs, cfg, precomputed)
            if repeat:
                times[label].append(elapsed)
    base = statistics.median(times["ppo"])
    print(f"policy losses, forward + backward on [{args.batch}, {args.length}], median of {args.repeats}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for label, samples in times.items():
        median = statistics.median(samples)
        print(f"{label:10s} {median * 1e3:8.1f} ms  {median / base:5.2f}x ppo")
    print(f"ratio aepo/ppo: {statistics.median(times['aepo']) / base:.2f}")


if __name__ == "__main__":
    main()
