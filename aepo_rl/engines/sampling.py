"""Per-token statistics and sampling over a batch of next-token logits (pure tensor ops).

Statistics are taken under the model's UNTEMPERED distribution (the policy being trained);
temperature, top-k and top-p only shape the distribution tokens are drawn from (§1.1).
"""

from __future__ import annotations

import torch

from aepo_rl.engines.base import SamplingParams

TOP_K_PROXY = 10
"""The release's step-entropy proxy uses the engine's top-10 log-probs (§1.2)."""


def top_k_entropy(top_logprobs: torch.Tensor) -> torch.Tensor:
    """Release proxy (§1.2): −Σ p·log p over the given largest log-probs (last dim), not renormalised."""
    return -(top_logprobs.exp() * top_logprobs).sum(-1)


def token_statistics(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Untempered log-probs [B, V], full entropy H = −Σ_v p_v log p_v [B] and top-10 proxy [B] (§1.2)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    probs = logprobs.exp()
    entropy = -torch.special.xlogy(probs, probs).sum(-1)  # xlogy: 0·log 0 = 0 for masked-out tokens
    top = logprobs.topk(min(TOP_K_PROXY, logprobs.shape[-1]), dim=-1).values
    return logprobs, entropy, top_k_entropy(top)


def check_params(params: SamplingParams) -> None:
    """Reject sampling settings outside their range, naming the field."""
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {params.top_k}")


def sample_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row; greedy (or temperature 0) takes the argmax."""
    if params.greedy or params.temperature == 0:
        return logits.argmax(-1)
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth_largest = scores.topk(params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if params.top_p < 1:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (the first always stays).
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(-1)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(outside, float("-inf")))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(-1)
