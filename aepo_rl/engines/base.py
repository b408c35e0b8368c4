"""Generation engine protocol: stateful sequences that grow round by round and can fork.

The tree controller (``aepo_rl.rollout``) only talks to this protocol, so a scripted fake
engine can stand in for a model in tests. A sequence is created from prompt token ids, grows
by generated segments and by appended tool-result tokens, and can be forked: the child
shares the parent's whole context (an engine reuses the parent's KV cache rather than
prefilling it again; docs/algorithm.md §1.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class SamplingParams:
    """How one ``generate`` call samples (§1.1: training 1.0/1.0, validation greedy)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    stop: tuple[str, ...] = ()
    """Generation of a sequence stops right after any of these strings (e.g. ``</search>``)."""
    min_tokens: int = 0
    """Each sequence generates at least this many tokens in the call (its budget permitting): EOS cannot be
    drawn before, and stop strings are not checked before (vLLM's ``min_tokens``)."""
    ignore_eos: bool = False
    """EOS does not end a sequence (it may still be drawn); stop strings and the budget still do."""
    repetition_penalty: float = 1.0
    """CTRL's penalty on every token already in the sequence (prompt, generated and appended tokens): its
    logit l becomes l / p when l > 0, else l · p, before temperature (vLLM's and transformers' rule); 1 = off."""
    min_p: float = 0.0
    """Keep only tokens whose tempered probability is at least ``min_p`` times the most likely token's; 0 = off."""


@dataclass
class Segment:
    """What one ``generate`` call produced for one sequence."""

    token_ids: list[int]
    logprobs: list[float]
    """log π(token) under the model's untempered distribution (the policy being trained); an engine built with
    ``logprobs_mode="processed_logprobs"`` (``rollout.logprobs_mode``) records instead the log-prob under the
    distribution it drew the token from (after temperature and the sampler's filters, renormalised)."""
    entropies: list[float]
    """Full-vocabulary entropy (nats) of the untempered distribution at each generated position."""
    top10_entropies: list[float] = field(default_factory=list)
    """Release proxy per position (§1.2): −Σ p·log p over the 10 most likely tokens and the sampled
    token when it is not among them (vLLM's ``logprobs=10`` entries)."""
    finish_reason: str = "length"
    """"stop" (a stop string was generated), "eos", or "length" (max_new_tokens reached)."""
    stop_string: str | None = None


@runtime_checkable
class GenerationEngine(Protocol):
    """A batched generator over growing, forkable sequences."""

    tokenizer: object
    vocab_size: int

    def add_sequence(self, prompt_token_ids: list[int]) -> int:
        """Register a new sequence; returns its id. Prefill may happen lazily."""

    def fork(self, seq_id: int) -> int:
        """A new sequence with the same context as ``seq_id`` (KV cache copied, not recomputed)."""

    def append(self, seq_id: int, token_ids: list[int]) -> None:
        """Append tokens the model did not generate (a tool result); prefilled at the next generate."""

    def generate(self, seq_ids: list[int], params: SamplingParams,
                 max_new_tokens: list[int]) -> list[Segment]:
        """Continue every sequence in one batch; each stops at EOS, a stop string or its budget."""

    def release(self, seq_id: int) -> None:
        """Free a finished sequence's cache."""

    def stats(self) -> dict[str, float]:
        """Counters: ``prefill_tokens`` (context tokens computed), ``decode_tokens``."""
