"""Step entropy, entropy pre-monitoring and the branch probability (docs/algorithm.md §1.2-§1.4).

Units. A step entropy is the mean full-vocabulary token entropy in nats over the first ``k``
tokens of a segment (``entropy_measure="full"``, the project default, §1.2), the mean surprisal
−log π(sampled token) in nats over the same tokens (``"surprisal"``, §1.2: any engine that returns
the sampled tokens' log-probs can give it), or the release's proxy Σ_{t<min(k,len)} H^top10_t / ln|V|
(``"top10_proxy"``, §1.2), which is already divided by ln|V|; H^top10_t = −Σ p·log p over the 10
most likely tokens and the sampled token when it is outside them (``Segment.top10_entropies``, as
vLLM returns them to the release). The branching signal ΔH is put on the release's scale in every
case: ΔH = (H_t − H_base) / ln|V| for ``full`` and ``surprisal`` and ΔH = H_t − H_base for the
proxy (§1.4 "normalized(H_t − H_initial)"), so w = 0.2 means the same thing under each measure.
"""

from __future__ import annotations

import math

from aepo_rl.engines.base import Segment


def step_entropy(segment: Segment, measure: str, k_tokens: int, vocab_size: int) -> float:
    """H of one segment (§1.2): mean entropy or mean surprisal of its first k tokens, or the release proxy."""
    if measure == "full":
        head = segment.entropies[:k_tokens]
        return sum(head) / len(head) if head else 0.0
    if measure == "surprisal":
        head = segment.logprobs[:k_tokens]
        return -sum(head) / len(head) if head else 0.0
    if measure == "top10_proxy":
        if segment.entropies and not segment.top10_entropies:
            raise ValueError("rollout.entropy_measure=top10_proxy needs Segment.top10_entropies from the engine")
        return sum(segment.top10_entropies[:k_tokens]) / math.log(vocab_size)
    raise ValueError(f"unknown rollout.entropy_measure '{measure}' (full | surprisal | top10_proxy)")


def entropy_delta(h_step: float, h_base: float, measure: str, vocab_size: int) -> float:
    """ΔH on the release's normalised scale (§1.4): see the module docstring."""
    delta = h_step - h_base
    return delta if measure == "top10_proxy" else delta / math.log(vocab_size)


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
