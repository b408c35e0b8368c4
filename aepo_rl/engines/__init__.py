"""Generation engines behind one protocol (:mod:`aepo_rl.engines.base`)."""

from aepo_rl.engines.base import GenerationEngine, SamplingParams, Segment

__all__ = ["GenerationEngine", "SamplingParams", "Segment"]
