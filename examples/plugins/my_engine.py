"""An engine in one file: the built-in HF decoder, counting its generate calls and sequences.

An engine implements the protocol of ``aepo_rl.engines.base.GenerationEngine`` (add_sequence,
fork, append, generate, release, stats). It is registered with a factory
``(cfg, model, tokenizer) -> engine`` and capabilities: ``shares_weights=True`` because it
generates with the trainer's own model object (the built-in trainer needs that: it does no weight
sync), ``entropies`` the per-token entropy measures it records exactly. Run it with

    aepo --plugin examples/plugins/my_engine.py train rollout.engine=counting_hf
"""

from aepo_rl.engines.hf import HFEngine
from aepo_rl.registry import register_engine


class CountingEngine:
    def __init__(self, engine):
        self.engine = engine
        self.tokenizer, self.vocab_size = engine.tokenizer, engine.vocab_size
        self.calls = self.sequences = 0

    def add_sequence(self, prompt_token_ids):
        self.sequences += 1
        return self.engine.add_sequence(prompt_token_ids)

    def fork(self, seq_id):
        self.sequences += 1
        return self.engine.fork(seq_id)

    def append(self, seq_id, token_ids):
        self.engine.append(seq_id, token_ids)

    def generate(self, seq_ids, params, max_new_tokens):
        self.calls += 1
        return self.engine.generate(seq_ids, params, max_new_tokens)

    def release(self, seq_id):
        self.engine.release(seq_id)

    def stats(self):
        return {**self.engine.stats(), "generate_calls": self.calls, "sequences": self.sequences}


@register_engine("counting_hf", shares_weights=True, entropies=("full", "surprisal", "top10_proxy"))
def counting_hf_engine(cfg, model, tokenizer):
    return CountingEngine(HFEngine(model, tokenizer, seed=cfg.rollout.seed))
