"""Fakes shared by several test files."""

from __future__ import annotations

from dataclasses import dataclass, field

from aepo_rl.engines.base import SamplingParams, Segment


@dataclass
class EchoSearch:
    """A search tool that answers ``found <query>`` and records the queries it got."""

    name: str = "search"
    tag: str = "search"
    description: str = "returns its query"
    calls: list[str] = field(default_factory=list)

    def run(self, arg):
        self.calls.append(arg)
        return f"found {arg}"


@dataclass
class FakeSeq:
    prompt: tuple[int, ...]
    ctx: list[int]
    rounds: int = 0
    """Segments generated along this lineage (a fork inherits its parent's count)."""


@dataclass
class FakeEngine:
    """Scripted engine: ``script(seq) -> (text, entropy)`` gives each segment's text and token entropy.

    A text ending with a stop string finishes "stop", one ending with the EOS token "eos",
    anything else "length"; a text longer than max_new_tokens is cut ("length").
    """

    tokenizer: object
    script: object
    seqs: dict[int, FakeSeq] = field(default_factory=dict)
    batches: list[list[int]] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)
    forks: int = 0
    released: set[int] = field(default_factory=set)
    decode_tokens: int = 0

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def add_sequence(self, prompt_token_ids):
        sid = len(self.seqs)
        self.seqs[sid] = FakeSeq(tuple(prompt_token_ids), list(prompt_token_ids))
        return sid

    def fork(self, seq_id):
        assert seq_id not in self.released
        self.forks += 1
        src = self.seqs[seq_id]
        sid = len(self.seqs)
        self.seqs[sid] = FakeSeq(src.prompt, list(src.ctx), src.rounds)
        return sid

    def append(self, seq_id, token_ids):
        self.seqs[seq_id].ctx += token_ids

    def generate(self, seq_ids, params, max_new_tokens):
        self.batches.append(list(seq_ids))
        self.params.append(params)
        out = []
        for sid, budget in zip(seq_ids, max_new_tokens):
            assert sid not in self.released and budget >= 1
            seq = self.seqs[sid]
            text, ent = self.script(seq)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            stop = next((s for s in params.stop if text.endswith(s)), None)
            reason = "stop" if stop else "eos" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
            if len(ids) > budget:
                ids, reason, stop = ids[:budget], "length", None
            seq.ctx += ids
            seq.rounds += 1
            self.decode_tokens += len(ids)
            out.append(Segment(ids, [-0.5] * len(ids), [ent] * len(ids), [ent] * len(ids), reason, stop))
        return out

    def release(self, seq_id):
        self.released.add(seq_id)

    def stats(self):
        return {"prefill_tokens": 0.0, "decode_tokens": float(self.decode_tokens)}
