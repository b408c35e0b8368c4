"""Per-token statistics and sampling over a batch of next-token logits (pure tensor ops).

Statistics are taken under the model's UNTEMPERED distribution (the policy being trained);
repetition penalty, the ``min_tokens`` ban of EOS, temperature, min-p, top-k and top-p only shape the
distribution tokens are drawn from (§1.1), in vLLM's order: penalty and ban on the logits, then
temperature, then min-p, then top-k and top-p. The log-prob recorded for a sampled token is the
untempered one (``raw_logprobs``) or that of the distribution it was drawn from (``processed_logprobs``),
vLLM's ``logprobs_mode`` (§2.11).
"""

from __future__ import annotations

import math

import torch

from aepo_rl.engines.base import SamplingParams

TOP_K_PROXY = 10
"""The release's step-entropy proxy uses the engine's top-10 log-probs (§1.2)."""


def top_k_entropy(top_logprobs: torch.Tensor) -> torch.Tensor:
    """−Σ p·log p over the given log-probs (last dim), not renormalised (§1.2 release proxy)."""
    return -(top_logprobs.exp() * top_logprobs).sum(-1)


def token_statistics(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Untempered log-probs and probs [B, V] and the full entropy H = −Σ_v p_v log p_v [B] (§1.2)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    probs = logprobs.exp()
    entropy = -(probs * logprobs.clamp(min=torch.finfo(logprobs.dtype).min)).sum(-1)  # 0·log 0 = 0
    return logprobs, probs, entropy


def release_top10_proxy(logprobs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The release's per-position proxy [B] (§1.2): −Σ p·log p over the entries vLLM returns with
    ``logprobs=10``, i.e. the 10 most likely tokens plus the sampled token when it is not among them
    (the release sums every returned entry)."""
    top, index = logprobs.topk(min(TOP_K_PROXY, logprobs.shape[-1]), dim=-1)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    outside = (index != tokens[:, None]).all(-1)
    return top_k_entropy(top) + torch.where(outside, -chosen.exp() * chosen, 0.0)


def check_params(params: SamplingParams) -> None:
    """Reject sampling settings outside their range, naming the field."""
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {params.top_k}")
    if params.min_tokens < 0:
        raise ValueError(f"SamplingParams.min_tokens must be >= 0 (0 = off), got {params.min_tokens}")
    if not params.repetition_penalty > 0:
        raise ValueError(f"SamplingParams.repetition_penalty must be > 0 (1 = off), got {params.repetition_penalty}")
    if not 0 <= params.min_p <= 1:
        raise ValueError(f"SamplingParams.min_p must be in [0, 1] (0 = off), got {params.min_p}")


def check_request(seq_ids: list[int], params: SamplingParams, max_new_tokens: list[int]) -> None:
    """Reject a ``generate`` call the protocol does not allow, naming what is wrong (engines with a
    batched decoder or a local backend: hf, vllm)."""
    check_params(params)
    if len(seq_ids) != len(max_new_tokens):
        raise ValueError(f"generate: {len(seq_ids)} seq_ids but {len(max_new_tokens)} max_new_tokens")
    if len(set(seq_ids)) != len(seq_ids):
        raise ValueError(f"generate: duplicate sequence ids in {seq_ids}")
    if any(n < 0 for n in max_new_tokens):
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if any(not s for s in params.stop):
        raise ValueError(f"SamplingParams.stop must not contain an empty string, got {params.stop!r}")


def processed_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None,
                     banned: torch.Tensor | None = None) -> torch.Tensor | None:
    """The logits [B, V] tokens are drawn from before temperature, or None when nothing changes them.

    ``seen`` (bool [B, V]): the tokens already in each sequence, whose logits ``params.repetition_penalty``
    p turns into l / p (l > 0) or l · p (l <= 0). ``banned`` (bool [V] or [B, V]): tokens that cannot be
    drawn (EOS before ``params.min_tokens``), set to −inf.
    """
    penalize = params.repetition_penalty != 1 and seen is not None
    if not penalize and banned is None:
        return None
    scores = logits.float()
    if penalize:
        penalty = params.repetition_penalty
        scores = torch.where(seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)
    if banned is not None:
        scores = scores.masked_fill(banned, float("-inf"))
    return scores


LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
"""What an engine records as each sampled token's log-prob (vLLM's ``logprobs_mode``, of its four the two that are
log-probs): ``raw_logprobs`` log_softmax of the model's logits (the untempered policy); ``processed_logprobs``
log_softmax of the logits tokens are drawn from, after the repetition penalty, the ``min_tokens`` ban,
temperature, min-p, top-k and top-p (outside tokens at −inf, so the kept ones renormalised)."""


def check_logprobs_mode(mode: str) -> None:
    if mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {mode!r}")


def sample_tokens(logprobs: torch.Tensor, probs: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator, processed: torch.Tensor | None = None) -> torch.Tensor:
    """Draw one token per row from the tempered, filtered distribution (:func:`sample`), the tokens only."""
    return sample(logprobs, probs, params, generator, processed)[0]


def sample(logprobs: torch.Tensor, probs: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           processed: torch.Tensor | None = None, logprobs_mode: str = "raw_logprobs"
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from the tempered, filtered distribution; greedy (or temperature 0) takes the argmax.
    Returns the tokens [B] and their log-probs [B] under ``logprobs_mode`` (:data:`LOGPROBS_MODES`).

    ``probs`` = ``logprobs.exp()`` (untempered); it is reused when no filter applies. ``processed``: the
    logits after repetition penalty and bans (:func:`processed_logits`), when they differ from the
    model's. The draw inverts the CDF with one uniform per row (much faster on CPU than ``torch.multinomial``).
    Greedy rows' processed log-probs are those of the processed logits at temperature 1 (vLLM's greedy path).
    All tensor ops: no host sync.
    """
    base = logprobs if processed is None else processed
    greedy = params.greedy or params.temperature == 0
    scores = None if greedy else _sampling_scores(base, params, processed is not None)
    if greedy:
        tokens = base.argmax(-1)
    else:
        if scores is not None:
            probs = scores.softmax(-1)
        cdf = probs.cumsum(-1)
        u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logprobs.shape[-1] - 1)
    drawn_from = scores if scores is not None else base
    if logprobs_mode == "raw_logprobs" or drawn_from is logprobs:
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    elif logprobs_mode == "processed_logprobs":
        chosen = drawn_from.gather(-1, tokens[:, None]).squeeze(-1) - drawn_from.logsumexp(-1)
    else:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    return tokens, chosen


def _sampling_scores(base: torch.Tensor, params: SamplingParams, processed: bool) -> torch.Tensor | None:
    """The logits tokens are drawn from: ``base`` / temperature with min-p, top-k and top-p applied (the tokens
    they drop at −inf); None when they are the model's own (no processing, temperature 1, no filter)."""
    vocab = base.shape[-1]
    top_k = params.top_k if 0 < params.top_k < vocab else 0
    if not (processed or params.temperature != 1 or top_k or params.top_p < 1 or params.min_p > 0):
        return None
    scores = base / params.temperature
    if params.min_p > 0:
        # Keep tokens with p >= min_p · p_max; in log space: score >= max score + log(min_p).
        threshold = scores.max(-1, keepdim=True).values + math.log(params.min_p)
        scores = scores.masked_fill(scores < threshold, float("-inf"))
    if top_k:
        kth_largest = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if params.top_p < 1:
        # Keep the smallest set of most likely tokens whose mass reaches top_p (the first always stays).
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(-1)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(outside, float("-inf")))
    return scores
