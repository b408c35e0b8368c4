"""Generation engines behind one protocol (:mod:`aepo_rl.engines.base`), registered by name with
``@register_engine(name, shares_weights=..., entropies=...)`` on a factory ``(cfg, model, tokenizer) -> engine``."""

from __future__ import annotations

import os

from aepo_rl.engines.base import GenerationEngine, SamplingParams, Segment
from aepo_rl.registry import ENGINES, register_engine

__all__ = ["GenerationEngine", "SamplingParams", "Segment", "build_engine", "check_entropy_measure", "register_engine"]

VLLM_HOWTO = (
    "rollout.engine=vllm: vLLM is used through its OpenAI-compatible server. Serve the policy with "
    "`vllm serve <model dir> --enable-prefix-caching` (add --enable-prompt-tokens-details for prefix-cache "
    "counts), then set rollout.engine=openai rollout.engine_url=http://HOST:8000/v1 "
    "(rollout.engine_model if the served name differs from model.path). For RL, the server's weights must be "
    "reloaded after each update; the built-in trainer shares weights only with rollout.engine=hf."
)


def build_engine(cfg, model, tokenizer) -> GenerationEngine:
    """The engine registered as ``cfg.rollout.engine`` (:data:`aepo_rl.registry.ENGINES`): hf (shares
    ``model``), openai (a server), vllm (how-to) or one of yours."""
    return ENGINES.lookup(cfg.rollout.engine)(cfg, model, tokenizer)


def check_entropy_measure(cfg) -> None:
    """Refuse, before any work, a tree rollout whose engine cannot give ``rollout.entropy_measure``
    (§1.2): the branching and pre-monitoring decisions would read another quantity. Independent
    rollouts (``rollout.mode=independent``, evaluation) make no entropy decision and pass."""
    from aepo_rl.config import ConfigError

    rollout = cfg.rollout
    supported = ENGINES.capabilities(rollout.engine)["entropies"]
    if rollout.mode != "independent" and rollout.entropy_measure not in supported:
        raise ConfigError(f"rollout.entropy_measure={rollout.entropy_measure!r} cannot be computed by "
                          f"rollout.engine={rollout.engine!r}; it gives {list(supported) or 'none'} "
                          f"(set rollout.entropy_measure to one of them, or rollout.mode=independent)")


@register_engine("hf", shares_weights=True, entropies=("full", "surprisal", "top10_proxy"))
def hf_engine(cfg, model, tokenizer) -> GenerationEngine:
    """The built-in KV-cache decoder over the trainer's own ``model``."""
    from aepo_rl.engines.hf import HFEngine

    return HFEngine(model, tokenizer, seed=cfg.rollout.seed)


@register_engine("openai", entropies=("surprisal", "top10_proxy"))
def openai_engine(cfg, model, tokenizer) -> GenerationEngine:
    """An OpenAI-compatible server at ``rollout.engine_url`` serving ``rollout.engine_model`` (or
    ``model.path``); its ``entropies`` are a top-k proxy, not the full entropy."""
    from aepo_rl.engines.openai import OpenAIEngine

    rollout = cfg.rollout
    if not rollout.engine_url:
        raise ValueError("rollout.engine=openai needs rollout.engine_url (e.g. http://127.0.0.1:8000/v1)")
    served = rollout.engine_model or cfg.model.path
    if not served:
        raise ValueError("rollout.engine=openai needs rollout.engine_model (or model.path): the served model name")
    return OpenAIEngine(rollout.engine_url, served, tokenizer, api_key=os.environ.get("OPENAI_API_KEY"),
                        seed=rollout.seed)


@register_engine("vllm")
def vllm_engine(cfg, model, tokenizer) -> GenerationEngine:
    """Not an engine of its own: raises the how-to of serving vLLM for ``rollout.engine=openai``."""
    raise ValueError(VLLM_HOWTO)
