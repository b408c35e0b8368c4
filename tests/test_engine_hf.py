"""HFEngine: KV-cache reuse is exact, sampling is seeded, stops and budgets hold (§1.2, §1.5)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import Recorder, encode

from aepo_rl.engines.base import GenerationEngine, SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.sampling import release_top10_proxy, sample_tokens, token_statistics


def test_satisfies_protocol(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    assert isinstance(engine, GenerationEngine)
    assert engine.vocab_size == len(tiny_tokenizer)


def test_multi_round_forked_batch_matches_full_forward(untied_model, tiny_tokenizer):
    """Appends, forks before/after generation and after an append, ragged batch: exact within 1e-4."""
    tok = tiny_tokenizer
    rec = Recorder(HFEngine(untied_model, tok, seed=3))
    params = SamplingParams(temperature=1.0, top_p=0.95)
    a = rec.add(encode(tok, "<think>I need to find who founded Velmora.</think>"))
    b = rec.add(encode(tok, "The quick"))
    a_early = rec.fork(a)  # fork of a prompt never run: prefilled once for both
    rec.generate([a, b, a_early], [7, 12, 4], params)
    rec.engine.append(a, encode(tok, " <result>\nPage 1: Velmora was founded in 1874.\n</result>"))
    c = rec.fork(a)  # fork right after a tool result (§1.5)
    b_mid = rec.fork(b)  # fork with no append: shares b's last generated token
    rec.generate([c, b, a, b_mid], [5, 3, 9, 6], params)
    rec.engine.append(c, encode(tok, " <result>\n150\n</result>"))
    rec.engine.append(a_early, encode(tok, " <python>print(1)</python>"))
    d = rec.fork(c)
    late = rec.add(encode(tok, "Ada"))  # a fresh prompt next to cached rows (a restart)
    rec.generate([d, a_early, late, c], [8, 5, 6, 2], params)
    rec.generate([b, d], [4, 4], params)
    for seq in (a, b, c, d, a_early, b_mid, late):
        assert len(rec.records[seq]) > 0
        assert rec.max_error(untied_model, seq) < 1e-4


def test_greedy_is_argmax_and_matches_model_generate(untied_model, tiny_tokenizer):
    tok, model = tiny_tokenizer, untied_model
    prompts = [encode(tok, "<search>Velmora founder</search> <result>"), encode(tok, "<think>")]
    engine = HFEngine(model, tok)
    segments = engine.generate([engine.add_sequence(p) for p in prompts], SamplingParams(greedy=True), [10, 10])
    for prompt, seg in zip(prompts, segments):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                        eos_token_id=None, pad_token_id=tok.pad_token_id)
        assert seg.token_ids == reference[0, len(prompt):].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + seg.token_ids])).logits[0]
        assert seg.token_ids == logits[len(prompt) - 1:-1].argmax(-1).tolist()


def test_seeded_runs_reproduce(tiny_model, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "<think>")

    def run(seed):
        engine = HFEngine(tiny_model, tiny_tokenizer, seed=seed)
        seqs = [engine.add_sequence(prompt) for _ in range(3)]
        first = engine.generate(seqs, SamplingParams(), [12, 12, 12])
        engine.append(seqs[0], encode(tiny_tokenizer, " <result>\nx\n</result>"))
        second = engine.generate([seqs[0], engine.fork(seqs[0])], SamplingParams(top_k=20), [12, 12])
        return [s.token_ids for s in first + second]

    assert run(7) == run(7)
    assert run(7) != run(8)


def _greedy(model, tok, prompt, n, stop=()):
    engine = HFEngine(model, tok)
    return engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, stop=stop), [n])[0]


def _first_end(tok, tokens, stop):
    """Index of the token that completes ``stop`` in the decoded text, by hand."""
    return next(i for i in range(len(tokens)) if stop in tok.decode(tokens[:i + 1]))


def test_stop_on_single_token_string_by_id(untied_model, tiny_tokenizer):
    tok = tiny_tokenizer
    prompt = encode(tok, "<think>")
    free = _greedy(untied_model, tok, prompt, 12).token_ids
    k = next(i for i in range(2, 12) if len(encode(tok, tok.decode([free[i]]))) == 1 and free[i] not in free[:i])
    stop = tok.decode([free[k]])
    seg = _greedy(untied_model, tok, prompt, 12, stop=(stop,))
    assert seg.token_ids == free[:_first_end(tok, free, stop) + 1]
    assert (seg.finish_reason, seg.stop_string) == ("stop", stop)


def test_stop_on_string_spelled_over_tokens(untied_model, tiny_tokenizer):
    tok = tiny_tokenizer
    prompt = encode(tok, "<think>")
    free = _greedy(untied_model, tok, prompt, 12).token_ids
    stop = tok.decode(free[3:5])
    assert len(encode(tok, stop)) > 1
    seg = _greedy(untied_model, tok, prompt, 12, stop=("never", stop))
    end = _first_end(tok, free, stop)
    assert end <= 4 and seg.token_ids == free[:end + 1]
    assert (seg.finish_reason, seg.stop_string) == ("stop", stop)


def _engine_with_eos(model, tokenizer, eos: int) -> HFEngine:
    """An engine whose end-of-sequence token is ``eos`` (the model's generation config is left as it was)."""
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [eos]
    try:
        return HFEngine(model, tokenizer)
    finally:
        model.generation_config.eos_token_id = saved


def test_eos_and_per_sequence_budget(untied_model, tiny_tokenizer):
    prompt = encode(tiny_tokenizer, "<think>")
    free = _greedy(untied_model, tiny_tokenizer, prompt, 10).token_ids
    first = free.index(free[4])
    engine = _engine_with_eos(untied_model, tiny_tokenizer, free[4])
    seqs = [engine.add_sequence(prompt) for _ in range(3)]
    segs = engine.generate(seqs, SamplingParams(greedy=True), [10, 2, 0])
    assert first >= 2
    assert segs[0].token_ids == free[:first + 1] and segs[0].finish_reason == "eos"
    assert segs[1].token_ids == free[:2] and segs[1].finish_reason == "length"
    assert segs[2].token_ids == [] and segs[2].finish_reason == "length"
    assert engine.stats()["decode_tokens"] == first + 1 + 2


def test_a_row_ending_long_before_the_budget_keeps_its_statistics(untied_model, tiny_tokenizer):
    """Only the generated columns of the call's budget-wide buffers are read back; a row that stops
    early gets the same tokens, log-probs and entropies as with a budget that ends where it stopped."""
    prompt = encode(tiny_tokenizer, "<think>")
    free = _greedy(untied_model, tiny_tokenizer, prompt, 10).token_ids
    engine = _engine_with_eos(untied_model, tiny_tokenizer, free[4])
    end = free.index(free[4]) + 1
    long, exact = engine.generate([engine.add_sequence(prompt), engine.add_sequence(prompt)],
                                  SamplingParams(greedy=True), [200, end])
    assert long.finish_reason == "eos" and len(long.token_ids) == end
    assert (long.token_ids, long.logprobs, long.entropies) == (exact.token_ids, exact.logprobs, exact.entropies)


def test_prefill_counts_each_unique_context_token_once(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    engine = HFEngine(tiny_model, tok, seed=1)
    prompt, tool_1 = encode(tok, "<think>Who"), encode(tok, " <result>\n150\n</result>")
    tool_2 = encode(tok, " <result>x")
    root = engine.add_sequence(prompt)
    twins = [root, engine.fork(root), engine.add_sequence(prompt)]  # three global samples, one prompt prefill
    engine.generate(twins, SamplingParams(), [6, 6, 6])
    engine.append(twins[0], tool_1)
    child = engine.fork(twins[0])
    grandchild = engine.fork(child)
    engine.generate([twins[0], child, twins[2]], SamplingParams(), [4, 4, 4])
    engine.append(child, tool_2)
    engine.generate([child, grandchild], SamplingParams(), [3, 3])
    assert engine.stats()["prefill_tokens"] == len(prompt) + len(tool_1) + len(tool_2)


def test_bf16_generation_tracks_full_forward(tiny_tokenizer):
    from helpers import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, dtype=torch.bfloat16)
    rec = Recorder(HFEngine(model, tiny_tokenizer, seed=0))
    a = rec.add(encode(tiny_tokenizer, "<think>I need"))
    b = rec.add(encode(tiny_tokenizer, "The quick brown fox"))
    rec.generate([a, b], [8, 8])
    rec.engine.append(a, encode(tiny_tokenizer, " <result>\nx\n</result>"))
    c = rec.fork(a)
    rec.generate([a, c], [6, 6])
    for seq in (a, b, c):
        assert all(math.isfinite(r[2]) for r in rec.records[seq])
        assert rec.max_error(model, seq) < 0.05


def test_finished_rows_leave_the_batch(tiny_model, tiny_tokenizer):
    batch_sizes = []
    hook = tiny_model.model.embed_tokens.register_forward_pre_hook(lambda m, args: batch_sizes.append(args[0].shape))
    try:
        engine = HFEngine(tiny_model, tiny_tokenizer)
        engine.generate([engine.add_sequence([5, 6, 7]), engine.add_sequence([8])], SamplingParams(), [2, 5])
    finally:
        hook.remove()
    assert [tuple(s) for s in batch_sizes] == [(2, 3), (2, 1), (1, 1), (1, 1), (1, 1)]


def test_model_mode_is_restored(tiny_tokenizer):
    from helpers import build_tiny_model

    model = build_tiny_model(tiny_tokenizer).train()
    engine = HFEngine(model, tiny_tokenizer)
    engine.generate([engine.add_sequence([5, 6])], SamplingParams(), [3])
    assert model.training


def test_token_statistics_by_hand():
    probs = torch.tensor([0.3, 0.2, 0.1] + [0.04] * 10)
    logprobs, p, entropy = token_statistics(probs.log()[None])
    top10 = release_top10_proxy(logprobs, torch.tensor([0]))  # the sampled token is the most likely one
    assert torch.allclose(p[0], probs, atol=1e-6) and torch.allclose(logprobs.exp(), p)
    full = -(0.3 * math.log(0.3) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1) + 10 * 0.04 * math.log(0.04))
    proxy = -(0.3 * math.log(0.3) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1) + 7 * 0.04 * math.log(0.04))
    assert entropy.item() == pytest.approx(full, abs=1e-5)
    assert top10.item() == pytest.approx(proxy, abs=1e-5)


def test_release_top10_proxy_adds_the_sampled_token_outside_the_top_10():
    # 13 tokens: the top 10 hold 0.9 of the mass; tokens 10-12 have 0.04, 0.035, 0.025
    probs = [0.2, 0.15, 0.1, 0.09, 0.08, 0.07, 0.06, 0.055, 0.05, 0.045, 0.04, 0.035, 0.025]
    logprobs = torch.tensor(probs, dtype=torch.float64).log()[None].repeat(2, 1)
    top10 = -sum(p * math.log(p) for p in probs[:10])
    # sampled token 4 (inside the top 10): the top 10 alone; token 11 (outside): its entry is added
    proxy = release_top10_proxy(logprobs, torch.tensor([4, 11]))
    assert proxy.tolist() == pytest.approx([top10, top10 - 0.035 * math.log(0.035)], abs=1e-12)


def _draw(params, rows=20000, seed=0):
    logprobs = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).log_softmax(-1).repeat(rows, 1)
    return sample_tokens(logprobs, logprobs.exp(), params, torch.Generator().manual_seed(seed)), logprobs[0].exp()


def test_sampling_frequencies_and_filters():
    tokens, p = _draw(SamplingParams())
    assert torch.allclose(torch.bincount(tokens, minlength=5) / len(tokens), p, atol=0.015)
    tokens, _ = _draw(SamplingParams(temperature=0.5))
    tempered = (p.log() / 0.5).softmax(-1)
    assert torch.allclose(torch.bincount(tokens, minlength=5) / len(tokens), tempered, atol=0.015)
    tokens, _ = _draw(SamplingParams(top_k=2))
    top_two = torch.tensor([p[0], p[1], 0, 0, 0]) / (p[0] + p[1])
    assert torch.allclose(torch.bincount(tokens, minlength=5) / len(tokens), top_two, atol=0.015)
    assert set(_draw(SamplingParams(top_p=float(p[0] + p[1]) - 1e-3))[0].tolist()) == {0, 1}
    assert set(_draw(SamplingParams(top_p=float(p[0]) * 0.9))[0].tolist()) == {0}
    assert _draw(SamplingParams(temperature=0.0))[0].unique().tolist() == [0]


def test_surprisal_estimates_the_entropy_only_at_temperature_1():
    """§1.2 surprisal: E[−log π(x)] over x ~ π is H(π); sampling a tempered π_τ gives another number."""
    tokens, p = _draw(SamplingParams())
    surprisal = -p.log()[tokens]
    entropy = float(-(p * p.log()).sum())
    standard_error = float(surprisal.std()) / math.sqrt(len(tokens))
    assert abs(float(surprisal.mean()) - entropy) < 4 * standard_error
    cold, _ = _draw(SamplingParams(temperature=0.5))
    assert float(-p.log()[cold].mean()) < entropy - 10 * standard_error  # biased low below temperature 1


def test_bad_inputs_are_named(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    seq = engine.add_sequence([5])
    with pytest.raises(KeyError, match="unknown or released sequence id 99"):
        engine.generate([99], SamplingParams(), [3])
    with pytest.raises(ValueError, match="duplicate"):
        engine.generate([seq, seq], SamplingParams(), [3, 3])
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([seq], SamplingParams(top_p=0.0), [3])
    with pytest.raises(ValueError, match="empty"):
        engine.add_sequence([])
    engine.release(seq)
    with pytest.raises(KeyError):
        engine.fork(seq)


@pytest.mark.parametrize("cpu_threads", [1, None])
def test_decoding_runs_with_the_engines_cpu_threads_and_gives_the_callers_setting_back(tiny_model, tiny_tokenizer,
                                                                                      cpu_threads):
    seen = []
    hook = tiny_model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = HFEngine(tiny_model, tiny_tokenizer, seed=0, cpu_threads=cpu_threads)
        engine.generate([engine.add_sequence(encode(tiny_tokenizer, "hello world"))], SamplingParams(), [5])
        after = torch.get_num_threads()
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert seen and set(seen) == {cpu_threads or 2}
    assert after == 2


def test_default_decode_threads_are_one_for_a_small_policy_and_torchs_for_a_large_one(tiny_model):
    from aepo_rl.config import load_config
    from aepo_rl.engines import SMALL_POLICY, cpu_decode_threads

    cfg = load_config("aepo", None, [])
    large = torch.nn.Linear(SMALL_POLICY // 1000, 1000, bias=False, device="meta")  # SMALL_POLICY parameters, no memory
    assert cpu_decode_threads(cfg.rollout, tiny_model) == 1
    assert cpu_decode_threads(cfg.rollout, large) is None
    cfg = load_config("aepo", None, ["rollout.cpu_decode_threads=3"])
    assert cpu_decode_threads(cfg.rollout, tiny_model) == 3 and cpu_decode_threads(cfg.rollout, large) == 3
