"""Generation engines behind one protocol (:mod:`aepo_rl.engines.base`)."""

from __future__ import annotations

import os

from aepo_rl.engines.base import GenerationEngine, SamplingParams, Segment

__all__ = ["GenerationEngine", "SamplingParams", "Segment", "build_engine"]

VLLM_HOWTO = (
    "rollout.engine=vllm: vLLM is used through its OpenAI-compatible server. Serve the policy with "
    "`vllm serve <model dir> --enable-prefix-caching` (add --enable-prompt-tokens-details for prefix-cache "
    "counts), then set rollout.engine=openai rollout.engine_url=http://HOST:8000/v1 "
    "(rollout.engine_model if the served name differs from model.path). For RL, the server's weights must be "
    "reloaded after each update; the built-in trainer shares weights only with rollout.engine=hf."
)


def build_engine(cfg, model, tokenizer) -> GenerationEngine:
    """The engine that ``cfg.rollout.engine`` names: hf (shares ``model``), openai (a server), vllm (how-to)."""
    rollout = cfg.rollout
    if rollout.engine == "hf":
        from aepo_rl.engines.hf import HFEngine

        return HFEngine(model, tokenizer, seed=rollout.seed)
    if rollout.engine == "openai":
        from aepo_rl.engines.openai import OpenAIEngine

        if not rollout.engine_url:
            raise ValueError("rollout.engine=openai needs rollout.engine_url (e.g. http://127.0.0.1:8000/v1)")
        served = rollout.engine_model or cfg.model.path
        if not served:
            raise ValueError("rollout.engine=openai needs rollout.engine_model (or model.path): the served model name")
        return OpenAIEngine(rollout.engine_url, served, tokenizer, api_key=os.environ.get("OPENAI_API_KEY"),
                            seed=rollout.seed)
    if rollout.engine == "vllm":
        raise ValueError(VLLM_HOWTO)
    raise ValueError(f"rollout.engine: unknown engine {rollout.engine!r} (hf, openai or vllm)")
