"""VLLMEngine against HFEngine on a tiny Qwen3 (head_dim 32, fp32): real vLLM (the CPU build in
.venv-vllm), no mocks. Marked ``vllm``; skipped, with the reason, where vLLM is not installed.

Run as .ci/run does: ``OMP_NUM_THREADS=2 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1
.venv-vllm/bin/python -m pytest -m vllm``. One ``vllm.LLM`` per module (the ``engine`` fixture).
"""

from __future__ import annotations

import copy
import gc
import math

import pytest
import torch
from helpers import build_qwen3

from aepo_rl.engines.base import GenerationEngine, SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.models import save_policy

pytestmark = pytest.mark.vllm

TOL = 1e-4


def free_vllm(engine) -> None:
    """Drop an engine's LLM so the next module can start its own in this process."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    del engine.llm
    gc.collect()
    cleanup_dist_env_and_memory()


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_qwen3(tiny_tokenizer)


@pytest.fixture(scope="module")
def engine(model, tiny_tokenizer, tmp_path_factory):
    from aepo_rl.engines.vllm import VLLMEngine

    model_dir = save_policy(model, tiny_tokenizer, tmp_path_factory.mktemp("vllm") / "model")
    engine = VLLMEngine(str(model_dir), tiny_tokenizer, dtype="float32", max_model_len=1024, seed=0,
                        eos_ids=[tiny_tokenizer.eos_token_id])
    yield engine
    free_vllm(engine)


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def assert_same(vllm_seg, hf_seg):
    assert vllm_seg.token_ids == hf_seg.token_ids
    assert (vllm_seg.finish_reason, vllm_seg.stop_string) == (hf_seg.finish_reason, hf_seg.stop_string)
    diff = max((abs(a - b) for a, b in zip(vllm_seg.logprobs, hf_seg.logprobs)), default=0.0)
    assert diff < TOL, f"log-probs differ by {diff}"
    diff10 = max((abs(a - b) for a, b in zip(vllm_seg.top10_entropies, hf_seg.top10_entropies)), default=0.0)
    assert diff10 < TOL, f"top-10 proxies differ by {diff10}"
    return diff


def test_satisfies_protocol(engine):
    assert isinstance(engine, GenerationEngine)
    assert engine.vocab_size >= len(engine.tokenizer)


def test_greedy_multi_round_and_forks_match_hf(engine, model, tiny_tokenizer):
    tok = tiny_tokenizer
    hf = HFEngine(model, tok, seed=0)
    greedy = SamplingParams(greedy=True)
    prompts = [encode(tok, "<think>I need to find who founded Velmora.</think>"), encode(tok, "The quick brown fox")]
    tool = encode(tok, " <result>\nPage 1: Velmora was founded in 1874.\n</result>")
    worst = 0.0
    ids = {name: [e.add_sequence(p) for p in prompts] for name, e in (("vllm", engine), ("hf", hf))}
    for budget in ([6, 9], [5, 0, 4]):  # round 2 has the fork; a budget of 0 sends no request
        segs = {name: e.generate(ids[name], greedy, budget) for name, e in (("vllm", engine), ("hf", hf))}
        for v, h in zip(segs["vllm"], segs["hf"]):
            worst = max(worst, assert_same(v, h))
        for name, e in (("vllm", engine), ("hf", hf)):  # a tool result, then a fork of the first sequence
            e.append(ids[name][0], tool)
            ids[name].append(e.fork(ids[name][0]))
    segs = {name: e.generate(ids[name], greedy, [7] * len(ids[name])) for name, e in (("vllm", engine), ("hf", hf))}
    for v, h in zip(segs["vllm"], segs["hf"]):
        worst = max(worst, assert_same(v, h))
    assert [engine.token_ids(s) for s in ids["vllm"]] == [hf.token_ids(s) for s in ids["hf"]]
    assert segs["vllm"][0].token_ids  # forks continue the same context: greedy gives the same tokens
    print(f"max |log-prob vLLM - HF| over multi-round greedy with forks: {worst:.2e}")


def test_sampled_log_probs_are_the_untempered_policy(engine, model, tiny_tokenizer):
    """With temperature 0.7 vLLM samples its own tokens; their log-probs are log π under temperature 1."""
    prompt = encode(tiny_tokenizer, "The quick brown fox")
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(temperature=0.7), [8])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + seg.token_ids])).logits[0, len(prompt) - 1:-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(seg.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(seg.logprobs), expected, atol=TOL)
    assert all(e >= 0 and math.isfinite(e) for e in seg.entropies)


def test_sampling_follows_the_engine_generator_that_checkpoints_save(engine, tiny_tokenizer):
    from aepo_rl.train.checkpoint import rng_state, set_rng_state

    prompt = encode(tiny_tokenizer, "The quick brown fox")
    state = rng_state(engine)
    first = [engine.generate([engine.add_sequence(prompt)], SamplingParams(), [12])[0].token_ids for _ in range(2)]
    set_rng_state(state, engine)
    again = [engine.generate([engine.add_sequence(prompt)], SamplingParams(), [12])[0].token_ids for _ in range(2)]
    assert first == again and first[0] != first[1]


def _free_tokens(hf, prompt, n):
    return hf.generate([hf.add_sequence(prompt)], SamplingParams(greedy=True), [n])[0].token_ids


def test_stop_strings_and_finish_reasons_match_hf(engine, model, tiny_tokenizer):
    tok = tiny_tokenizer
    prompt = encode(tok, "The quick brown fox")
    free = _free_tokens(HFEngine(model, tok), prompt, 16)
    whole = [i for i in range(len(free) - 1) if "\ufffd" not in tok.decode(free[i:i + 2])]
    single = tok.decode(free[whole[1]:whole[1] + 1])
    spelled = next(tok.decode(free[i:i + 2]) for i in whole[2:] if len(encode(tok, tok.decode(free[i:i + 2]))) > 1)
    cases = [(), ("never-generated",), (single,), ("never-generated", spelled)]
    reasons = []
    for stop in cases:
        hf = HFEngine(model, tok)
        params = SamplingParams(greedy=True, stop=stop)
        h = hf.generate([hf.add_sequence(prompt)], params, [16])[0]
        v = engine.generate([engine.add_sequence(prompt)], params, [16])[0]
        assert_same(v, h)
        reasons.append((v.finish_reason, v.stop_string))
    assert reasons == [("length", None), ("length", None), ("stop", single), ("stop", spelled)], reasons


def test_eos_ends_a_segment_as_in_hf(engine, model, tiny_tokenizer):
    """A token the model's generation config names as EOS ends the segment with finish_reason "eos"."""
    tok = tiny_tokenizer
    prompt = encode(tok, "The quick brown fox")
    free = _free_tokens(HFEngine(model, tok), prompt, 16)
    eos = [tok.eos_token_id, free[5]]
    saved_config, saved_engine = model.generation_config.eos_token_id, engine.eos_ids
    model.generation_config.eos_token_id, engine.eos_ids = eos, sorted(eos)
    try:
        hf = HFEngine(model, tok)
        h = hf.generate([hf.add_sequence(prompt)], SamplingParams(greedy=True, stop=("never",)), [16])[0]
        v = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, stop=("never",)), [16])[0]
    finally:
        model.generation_config.eos_token_id, engine.eos_ids = saved_config, saved_engine
    assert_same(v, h)
    assert (v.finish_reason, v.stop_string, v.token_ids[-1]) == ("eos", None, free[5])


def test_a_fork_of_a_long_context_hits_the_prefix_cache(engine, tiny_tokenizer):
    tok = tiny_tokenizer
    context = (encode(tok, "The quick brown fox jumps over the lazy dog 0123456789. ") * 40)[:300]
    parent = engine.add_sequence(context)
    engine.generate([parent], SamplingParams(greedy=True), [2])
    child = engine.fork(parent)
    before = engine.stats()
    engine.generate([child], SamplingParams(greedy=True), [2])
    after = engine.stats()
    prefill = after["prefill_tokens"] - before["prefill_tokens"]
    n_context = len(engine.token_ids(child)) - 2
    assert prefill < n_context - 128, (prefill, n_context)  # at least two full blocks came from the cache
    assert after["cached_tokens"] - before["cached_tokens"] == n_context - prefill
    assert after["decode_tokens"] - before["decode_tokens"] == 2
    print(f"fork of a {n_context}-token context: {prefill} prefill tokens computed, {n_context - prefill} cached")


def synced_greedy(engine, policy, model, tok, prompt):
    """Sync ``policy`` into the engine, then greedy segments of vLLM and of HFEngine over ``policy``, and
    their largest log-prob gap; the module's ``model`` is synced back afterwards for the other tests."""
    try:
        engine.sync_weights(policy)
        hf = HFEngine(policy, tok)
        h = hf.generate([hf.add_sequence(prompt)], SamplingParams(greedy=True), [8])[0]
        v = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True), [8])[0]
        return v, h, assert_same(v, h)
    finally:
        engine.sync_weights(model)


def test_weights_synced_after_an_optimizer_step_match_the_updated_model(engine, model, tiny_tokenizer):
    tok = tiny_tokenizer
    trained = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    batch = torch.tensor([encode(tok, "The quick brown fox jumps over the lazy dog")])
    trained(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    trained.eval()
    prompt = encode(tok, "<think>I need to find")
    old = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True), [8])[0]
    v, _, diff = synced_greedy(engine, trained, model, tok, prompt)
    assert old.logprobs != v.logprobs  # the step did change the policy
    print(f"after an AdamW step and sync_weights: max |log-prob vLLM - HF| = {diff:.2e}")
    assert engine.stats()["weight_syncs"] >= 2


def test_a_lora_policy_syncs_its_merged_weights(engine, model, tiny_tokenizer):
    """peft LoRA: vLLM gets base + B·A·scale under the base model's names; the policy is left bit for bit."""
    pytest.importorskip("peft")
    from aepo_rl.config import ModelConfig
    from aepo_rl.models import apply_lora

    tok = tiny_tokenizer
    policy = apply_lora(copy.deepcopy(model), ModelConfig(lora_rank=4))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)  # peft starts B at 0 (no change): make the adapters matter
    adapters = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
    prompt = encode(tok, "<think>I need to find")
    _, h, diff = synced_greedy(engine, policy, model, tok, prompt)
    print(f"LoRA policy after sync_weights: max |log-prob vLLM - HF| = {diff:.2e}")
    assert all(torch.equal(p, adapters[n]) for n, p in policy.named_parameters() if "lora_" in n)
    original = model.state_dict()  # nothing merged in place: the frozen base weights are exactly the model's
    for name, tensor in policy.get_base_model().state_dict().items():
        if "lora_" not in name:
            assert torch.equal(tensor, original[name.replace(".base_layer.", ".")]), name
    base = HFEngine(model, tok)
    assert base.generate([base.add_sequence(prompt)], SamplingParams(greedy=True), [8])[0].logprobs != h.logprobs


def test_bad_inputs_are_named(engine):
    seq = engine.add_sequence([5, 6])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([seq], SamplingParams(), [1, 2])
    with pytest.raises(ValueError, match="empty string"):
        engine.generate([seq], SamplingParams(stop=("",)), [2])
    with pytest.raises(KeyError, match="VLLMEngine: unknown or released sequence id"):
        engine.generate([seq + 100], SamplingParams(), [2])
    assert engine.generate([seq], SamplingParams(), [0])[0].token_ids == []


def test_sampling_options_match_hf(engine, model, tiny_tokenizer):
    """repetition_penalty, min_tokens and ignore_eos map to vLLM's SamplingParams: greedy decoding with them
    gives HFEngine's tokens; min_tokens = budget with ignore_eos forces the length; min_p = 1 keeps the argmax."""
    tok = tiny_tokenizer
    hf = HFEngine(model, tok, seed=0)
    prompt = encode(tok, "The quick brown fox")
    ends = encode(tok, "founded in")  # greedy decoding of this model ends with EOS as the 4th token
    eos = tok.eos_token_id
    cases = [(prompt, SamplingParams(greedy=True, repetition_penalty=1.8)),
             (prompt, SamplingParams(greedy=True, ignore_eos=True, repetition_penalty=0.7)),
             (ends, SamplingParams(greedy=True)), (ends, SamplingParams(greedy=True, min_tokens=9)),
             (ends, SamplingParams(greedy=True, ignore_eos=True))]
    segments = []
    for context, params in cases:
        v = engine.generate([engine.add_sequence(context)], params, [12])[0]
        h = hf.generate([hf.add_sequence(context)], params, [12])[0]
        assert_same(v, h)
        segments.append(v)
    plain, at_least_nine, past_eos = segments[2:]
    assert plain.finish_reason == "eos" and len(plain.token_ids) == 4
    assert len(at_least_nine.token_ids) >= 9 and eos not in at_least_nine.token_ids[:9]
    assert past_eos.token_ids[3] == eos and len(past_eos.token_ids) == 12 and past_eos.finish_reason == "length"
    forced = engine.generate([engine.add_sequence(prompt)], SamplingParams(min_tokens=8, ignore_eos=True), [8])[0]
    assert len(forced.token_ids) == 8 and forced.finish_reason == "length"
    argmax = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True), [5])[0]
    sharp = engine.generate([engine.add_sequence(prompt)], SamplingParams(min_p=1.0), [5])[0]
    assert sharp.token_ids == argmax.token_ids
