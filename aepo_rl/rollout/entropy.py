"""Step entropy, entropy pre-monitoring and the branch probability (docs/algorithm.md §1.2-§1.4).

Scale. A step entropy (§1.2) is the token entropies of a segment's first K = min(k, len) tokens,
reduced by a sum (``entropy_reduce="sum"``, the release's scale and the default) or a mean
(``"mean"``, aepo-rl before 2026-12-05), divided by ln|V|. The token entropy is
the full-vocabulary entropy H_t (``entropy_measure="full"``), the surprisal −log π(x_t) of the
sampled token (``"surprisal"``, any engine that returns log-probs) or the release's top-10 proxy
h_t (``"top10_proxy"``, ``Segment.top10_entropies``: −Σ p·log p over the 10 most likely tokens and
the sampled token when it is outside them, as vLLM returns them to the release). The branching
signal is ΔH = H_t − H_base (§1.4), so w = 0.2 means the same under each measure: on a segment
whose top-10 mass is about 1 the three measures give the same H. Under ``mean`` ΔH is K times
smaller than the release's. Pre-monitoring (§1.3) always reads the sums (the release's scale).
"""

from __future__ import annotations

import math

from aepo_rl.engines.base import Segment


def step_entropy(segment: Segment, measure: str, k_tokens: int, vocab_size: int, reduce: str = "sum") -> float:
    """H of one segment (§1.2): sum (or mean) of its first K = min(k, len) token entropies, surprisals
    or top-10 proxies, divided by ln|V|; 0 for an empty segment."""
    if measure == "full":
        head = segment.entropies[:k_tokens]
    elif measure == "surprisal":
        head = [-logprob for logprob in segment.logprobs[:k_tokens]]
    elif measure == "top10_proxy":
        if segment.entropies and not segment.top10_entropies:
            raise ValueError("rollout.entropy_measure=top10_proxy needs Segment.top10_entropies from the engine")
        head = segment.top10_entropies[:k_tokens]
    else:
        raise ValueError(f"unknown rollout.entropy_measure '{measure}' (full | surprisal | top10_proxy)")
    if reduce not in ("sum", "mean"):
        raise ValueError(f"unknown rollout.entropy_reduce '{reduce}' (sum | mean)")
    if not head:
        return 0.0
    total = sum(head) if reduce == "sum" else sum(head) / len(head)
    return total / math.log(vocab_size)


def branch_probability(uniform: float, delta_h: float, streak: int, *, mode: str,
                       entropy_weight: float, penalty: float) -> float:
    """P_t of §1.4.

    ARPO: P = U + w·ΔH. AEPO: P = clip((U + w·ΔH) · max(0, 1 − λ·l), 0, 1), l = consecutive
    branching steps (per path or per prompt-round). The caller branches iff P ≥ τ.
    """
    base = uniform + entropy_weight * delta_h
    if mode == "arpo":
        return base
    return min(1.0, max(0.0, base * max(0.0, 1.0 - penalty * streak)))


def premonitor_global_samples(n: int, h_root: float, h_tool_avg: float, *, formula: str, beta: float) -> int:
    """Global samples m from entropy pre-monitoring (§1.3).

    paper:   m = round(n·σ(β(H_root − H_tool_avg))), rounding half up (floor(x + 0.5)), clamped to [1, n];
    release: m = clamp(floor(n·σ(β(H_root − H_tool_avg))) + 1, 1, n)  (equal entropies, n = 12 → 7).
    """
    x = n / (1.0 + math.exp(-beta * (h_root - h_tool_avg)))
    m = math.floor(x + 0.5) if formula == "paper" else math.floor(x) + 1
    return min(n, max(1, m))
