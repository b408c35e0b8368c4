"""HFEngine: a batched decode loop over any ``AutoModelForCausalLM`` with KV-cache reuse (§1.5).

One ``generate`` call does
1. a prefill forward over the batch's pending tokens (prompts, the last generated token, tool
   results), each distinct pending context once, on top of the cached keys/values;
2. a decode loop: one forward per step over the still-active rows; finished rows leave the
   batch (their keys/values are copied out and the batch is compacted). With
   ``cuda_graphs`` resolved to the static path (:mod:`aepo_rl.engines.static`) the step runs over
   fixed buffers instead, recorded as a CUDA graph on a GPU; the loop around it is the same.
Per generated token it records log π of the sampled token (untempered, or with
``logprobs_mode="processed_logprobs"`` under the distribution it was drawn from: vLLM's
``logprobs_mode``, §2.11), the full entropy of the untempered distribution and the release's top-10
proxy (§1.2). The engine shares the policy's model object with the trainer.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from dataclasses import dataclass

import torch

from aepo_rl.engines.base import SamplingParams, Segment
from aepo_rl.engines.kv import BatchCache, Context
from aepo_rl.engines.sampling import (
    check_logprobs_mode,
    check_request,
    processed_logits,
    release_top10_proxy,
    sample,
    token_statistics,
)
from aepo_rl.engines.sequences import SequenceTable
from aepo_rl.engines.static import StaticDecoder, decode_path
from aepo_rl.engines.stops import StopMatcher, eos_token_ids


@dataclass
class _Sequence:
    token_ids: list[int]
    context: Context


@dataclass
class _Row:
    """A sequence being decoded in this call: where its results go and where it stands."""

    slot: int
    """Index of the sequence in the ``generate`` call's ``seq_ids``."""
    budget: int


class HFEngine:
    """A :class:`~aepo_rl.engines.base.GenerationEngine` over a transformers causal LM."""

    def __init__(self, model, tokenizer, seed: int = 0, cpu_threads: int | None = None, cuda_graphs: str = "auto",
                 logprobs_mode: str = "raw_logprobs"):
        """``cpu_threads``: torch's thread count while ``generate`` runs on the CPU (restored after);
        None leaves torch's setting. Ignored on other devices. ``cuda_graphs`` (auto, on, off): the
        static decode path, captured as CUDA graphs on a GPU (:func:`aepo_rl.engines.static.decode_path`).
        ``logprobs_mode``: what each segment's ``logprobs`` hold (:data:`aepo_rl.engines.sampling.LOGPROBS_MODES`)."""
        check_logprobs_mode(logprobs_mode)
        self.logprobs_mode = logprobs_mode
        text_config = model.config.get_text_config()
        layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"} or getattr(text_config, "use_sliding_window", False):
            raise ValueError(f"HFEngine supports full-attention decoders only; {type(model).__name__} has "
                             f"layer types {sorted(layer_types)} (use engine=openai with a vLLM server)")
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.num_layers = text_config.num_hidden_layers
        self.device = next(model.parameters()).device
        self.cpu_threads = cpu_threads if self.device.type == "cpu" else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = eos_token_ids(tokenizer, model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        parameters = inspect.signature(base.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"
        self._keep_last_logits = "logits_to_keep" in parameters
        path = decode_path(cuda_graphs, self.device, model.config._attn_implementation)
        self.static = StaticDecoder(model, self._cache_kwarg, path.capture, path.strict) if path.static else None
        """The static decode path's buffers and recorded steps (None: the dynamic path)."""
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._sequences: SequenceTable[_Sequence] = SequenceTable("HFEngine")
        self._stop_matchers: dict[tuple[str, ...], StopMatcher] = {}
        self._new_prompts: dict[tuple[int, ...], Context] = {}
        """Contexts of prompts added since the last generate, by token ids (run at most once)."""
        self.counters = {"prefill_tokens": 0, "decode_tokens": 0, "prefill_calls": 0, "decode_steps": 0}

    # ---------------------------------------------------------------- sequence bookkeeping
    def add_sequence(self, prompt_token_ids: list[int]) -> int:
        """Register a prompt. Identical prompts added before the next generate share one prefill."""
        if not prompt_token_ids:
            raise ValueError("add_sequence: prompt_token_ids is empty")
        key = tuple(prompt_token_ids)
        if key not in self._new_prompts:
            self._new_prompts[key] = Context(None, 0, list(prompt_token_ids))
        return self._sequences.add(_Sequence(list(prompt_token_ids), self._new_prompts[key]))

    def fork(self, seq_id: int) -> int:
        """Share the parent's Context: cached rows and pending tokens are computed once for both."""
        parent = self._sequences[seq_id]
        return self._sequences.add(_Sequence(list(parent.token_ids), parent.context))

    def append(self, seq_id: int, token_ids: list[int]) -> None:
        if not token_ids:
            return
        seq = self._sequences[seq_id]
        old = seq.context
        seq.context = Context(old.kv, old.n_cached, old.pending + list(token_ids), old.pending_generated)
        seq.token_ids.extend(token_ids)

    def release(self, seq_id: int) -> None:
        self._sequences.release(seq_id)

    def stats(self) -> dict[str, float]:
        return dict(self.counters)

    def token_ids(self, seq_id: int) -> list[int]:
        """The sequence's whole context (prompt, generated and appended tokens)."""
        return list(self._sequences[seq_id].token_ids)

    def _stop_matcher(self, stops: tuple[str, ...]) -> StopMatcher:
        if stops not in self._stop_matchers:
            self._stop_matchers[stops] = StopMatcher(self.tokenizer, self.vocab_size, self.eos_ids, stops, self.device)
        return self._stop_matchers[stops]

    # ---------------------------------------------------------------- generation
    def generate(self, seq_ids: list[int], params: SamplingParams, max_new_tokens: list[int]) -> list[Segment]:
        check_request(seq_ids, params, max_new_tokens)
        sequences = [self._sequences[s] for s in seq_ids]
        self._new_prompts.clear()
        segments = [Segment([], [], [], [], "length") for _ in seq_ids]
        rows = [_Row(i, n) for i, n in enumerate(max_new_tokens) if n > 0]
        if not rows:
            return segments
        with torch.inference_mode(), _eval_mode(self.model), _torch_threads(self.cpu_threads):
            self._decode([sequences[r.slot] for r in rows], rows, params, segments)
        return segments

    def _forward(self, input_ids, attention_mask, position_ids, cache, last_only: bool) -> torch.Tensor:
        kwargs = {self._cache_kwarg: cache, "use_cache": True}
        if last_only and self._keep_last_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1].float()

    def _prefill(self, sequences: list[_Sequence], capacity_extra: int):
        """Lay out the distinct contexts, run their pending tokens once; returns the batch state."""
        contexts, row_of = [], {}
        for seq in sequences:
            if id(seq.context) not in row_of:
                row_of[id(seq.context)] = len(contexts)
                contexts.append(seq.context)
        width = max(c.n_cached for c in contexts)
        chunk = max(len(c.pending) for c in contexts)
        cache = BatchCache(self.num_layers, width + chunk + capacity_extra)
        cache.load_rows(contexts, width)
        rows = len(contexts)
        n_cached = torch.tensor([c.n_cached for c in contexts], device=self.device)
        columns = torch.arange(width + chunk + capacity_extra, device=self.device)
        mask = (columns >= width - n_cached[:, None]) & (columns < width)
        lengths = n_cached.clone()
        next_logits = [c.next_logits for c in contexts]
        if chunk:
            n_pending = torch.tensor([len(c.pending) for c in contexts], device=self.device)
            input_ids = torch.full((rows, chunk), self.pad_id, dtype=torch.long, device=self.device)
            for row, c in enumerate(contexts):
                if c.pending:
                    input_ids[row, chunk - len(c.pending):] = torch.tensor(c.pending, device=self.device)
            hole = chunk - n_pending
            mask |= (columns >= width + hole[:, None]) & (columns < width + chunk)
            positions = (n_cached[:, None] + torch.arange(chunk, device=self.device) - hole[:, None]).clamp(min=0)
            logits = self._forward(input_ids, mask[:, :width + chunk], positions, cache, last_only=True)
            lengths += n_pending
            next_logits = [logits[row] if c.pending else next_logits[row] for row, c in enumerate(contexts)]
            self.counters["prefill_tokens"] += sum(len(c.pending) - c.pending_generated for c in contexts)
            self.counters["prefill_calls"] += 1
            self._materialize_shared(contexts, cache, mask[:, :width + chunk], next_logits, sequences)
        select = [row_of[id(seq.context)] for seq in sequences]
        index = torch.tensor(select, device=self.device)
        if select != list(range(rows)):
            cache.batch_select_indices(index)
        return cache, mask[index], lengths[index], torch.stack([next_logits[r] for r in select]), width + chunk

    def _materialize_shared(self, contexts, cache, mask, next_logits, batch_sequences) -> None:
        """A context also held by a sequence outside this batch keeps its freshly computed state."""
        in_batch = Counter(id(s.context) for s in batch_sequences)
        held = Counter(id(s.context) for s in self._sequences.values())
        for row, c in enumerate(contexts):
            if c.pending and held[id(c)] > in_batch[id(c)]:
                c.kv = cache.extract_row(row, mask[row].nonzero().squeeze(-1))
                c.n_cached += len(c.pending)
                c.pending, c.pending_generated, c.next_logits = [], 0, next_logits[row]

    def _decode(self, sequences: list[_Sequence], rows: list[_Row], params: SamplingParams,
                segments: list[Segment]) -> None:
        max_budget = max(r.budget for r in rows)
        static = self.static is not None
        cache, mask, lengths, logits, column = self._prefill(sequences, 0 if static else max_budget - 1)
        batch = (self.static.batch(cache, mask, lengths, column, column + max_budget - 1) if static
                 else _DynamicBatch(self, cache, mask, lengths, column))
        stops = self._stop_matcher(tuple(params.stop))
        budgets = torch.tensor([r.budget for r in rows], device=self.device)
        slots = torch.arange(len(rows), device=self.device)
        out_tokens = torch.zeros(len(rows), max_budget, dtype=torch.long, device=self.device)
        out_stats = torch.zeros(len(rows), max_budget, 3, device=self.device)
        finish = [("length", None)] * len(rows)
        n_generated = [0] * len(rows)
        active = list(range(len(rows)))  # batch row -> index into rows
        seen = self._seen_tokens(sequences, logits.shape[-1]) if params.repetition_penalty != 1 else None
        eos_ban = torch.zeros(logits.shape[-1], dtype=torch.bool, device=self.device)
        eos_ban[stops.eos_ids[stops.eos_ids < logits.shape[-1]]] = True
        for step in range(max_budget):
            logprobs, probs, entropy = token_statistics(logits)
            processed = processed_logits(logits, params, seen, eos_ban if step < params.min_tokens else None)
            tokens, chosen = sample(logprobs, probs, params, self.generator, processed, self.logprobs_mode)
            if seen is not None:
                seen[torch.arange(len(tokens), device=self.device), tokens] = True
            top10 = release_top10_proxy(logprobs, tokens)
            out_tokens[slots, step] = tokens
            out_stats[slots, step] = torch.stack([chosen, entropy, top10], dim=-1)
            done = budgets[slots] == step + 1
            tail_stops = {}
            if step + 1 >= params.min_tokens:  # stops count from the min_tokens-th token on (vLLM)
                done |= stops.ends(tokens, eos=not params.ignore_eos)
                tail_stops = _tail_stops(stops, tokens, out_tokens, active, step)
            for b in tail_stops:
                done[b] = True
            if done.any():
                finished = done.nonzero().squeeze(-1).tolist()
                token_list = tokens.tolist()
                for b in finished:  # keep each finished row's keys/values, then drop it from the batch
                    i = active[b]
                    finish[i] = (_finish_reason(token_list[b], stops, tail_stops.get(b), params.ignore_eos)
                                 if step + 1 >= params.min_tokens else ("length", None))
                    n_generated[i] = step + 1
                    kv, n_cached = batch.row_state(b)
                    sequences[i].context = Context(kv, n_cached, [token_list[b]], pending_generated=1)
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                batch.keep(keep)
                slots, tokens = slots[keep], tokens[keep]
                if seen is not None:
                    seen = seen[keep]
                active = [active[b] for b in keep.tolist()]
            logits = batch.step(tokens)
            self.counters["decode_steps"] += 1
        self._write_segments(sequences, rows, out_tokens, out_stats, n_generated, finish, segments)

    def _seen_tokens(self, sequences: list[_Sequence], vocab: int) -> torch.Tensor:
        """Bool [B, V]: the tokens each sequence already holds (for the repetition penalty), one scatter."""
        ids = [torch.tensor(seq.token_ids, dtype=torch.long) for seq in sequences]
        rows = torch.repeat_interleave(torch.arange(len(ids)), torch.tensor([len(t) for t in ids]))
        seen = torch.zeros(len(ids), vocab, dtype=torch.bool, device=self.device)
        seen[rows.to(self.device), torch.cat(ids).to(self.device)] = True
        return seen

    def _write_segments(self, sequences, rows, out_tokens, out_stats, n_generated, finish, segments) -> None:
        used = max(n_generated, default=0)  # Python lists of the generated columns only, not the whole budget's
        all_tokens, all_stats = out_tokens[:, :used].tolist(), out_stats[:, :used].tolist()
        for i, row in enumerate(rows):
            n = n_generated[i]
            tokens = all_tokens[i][:n]
            logprob, entropy, top10 = zip(*all_stats[i][:n])
            reason, stop_string = finish[i]
            segments[row.slot] = Segment(tokens, list(logprob), list(entropy), list(top10), reason, stop_string)
            sequences[i].token_ids.extend(tokens)
            self.counters["decode_tokens"] += n


class _DynamicBatch:
    """The dynamic path's decode state: the batch shrinks as rows finish, the key/value views grow a
    column per step, one eager forward per step."""

    def __init__(self, engine: HFEngine, cache: BatchCache, mask: torch.Tensor, lengths: torch.Tensor, column: int):
        self.engine, self.cache, self.mask, self.lengths, self.column = engine, cache, mask, lengths, column

    def row_state(self, row: int) -> tuple[list, int]:
        """A finished row's keys/values (its real columns, compact) and cached-token count."""
        columns = self.mask[row, :self.column].nonzero().squeeze(-1)
        return self.cache.extract_row(row, columns), int(self.lengths[row])

    def keep(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.lengths = self.mask[keep], self.lengths[keep]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask[:, self.column] = True
        logits = self.engine._forward(tokens[:, None], self.mask[:, :self.column + 1], self.lengths[:, None],
                                      self.cache, last_only=False)
        self.lengths += 1
        self.column += 1
        return logits


def _tail_stops(stops: StopMatcher, tokens: torch.Tensor, out_tokens: torch.Tensor, active: list[int],
                step: int) -> dict[int, str]:
    """Batch rows whose decoded segment tail now holds a stop string (only rows whose token may end one)."""
    candidates = stops.text_candidates(tokens)
    if candidates is None or not candidates.any():
        return {}
    hits = {}
    for b in candidates.nonzero().squeeze(-1).tolist():
        tail = out_tokens[active[b], max(0, step + 1 - stops.window):step + 1].tolist()
        if (hit := stops.stop_in_tail(tail)) is not None:
            hits[b] = hit
    return hits


def _finish_reason(token: int, stops: StopMatcher, tail_stop: str | None, ignore_eos: bool = False
                   ) -> tuple[str, str | None]:
    """EOS first (unless ignored), then a stop string (by id or on the text tail), else the budget ran out."""
    if not ignore_eos and token in stops.eos_ids.tolist():
        return "eos", None
    if token in stops.stop_of_id:
        return "stop", stops.stop_of_id[token]
    if tail_stop is not None:
        return "stop", tail_stop
    return "length", None


@contextlib.contextmanager
def _eval_mode(model):
    """Generate in eval mode (no dropout) and give the trainer its model back as it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _torch_threads(count: int | None):
    """Run with ``count`` torch threads (None: as set), then give the caller its setting back."""
    before = torch.get_num_threads()
    if count is not None and count != before:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
