"""min_tokens, ignore_eos, repetition_penalty and min_p: the sampling math against hand-computed logits,
the HF engine against a step-by-step decode of the same model, the config keys and the engines' capability."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from aepo_rl.config import ConfigError, load_config
from aepo_rl.engines import build_engine
from aepo_rl.engines.base import SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.sampling import processed_logits, sample_tokens
from aepo_rl.registry import ENGINES, register_engine

# ---------------------------------------------------------------- the sampling math


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0], [2.0, -1.0, 0.5, 0.0]])
    seen = torch.tensor([[True, True, False, False], [False, False, True, True]])
    out = processed_logits(logits, SamplingParams(repetition_penalty=2.0), seen)
    assert out.tolist() == [[1.0, -2.0, 0.5, 0.0], [2.0, -1.0, 0.25, 0.0]]
    assert processed_logits(logits, SamplingParams(), seen) is None  # 1.0 is off
    banned = torch.tensor([False, False, False, True])
    out = processed_logits(logits, SamplingParams(), None, banned)
    assert out[:, 3].isneginf().all() and out[:, :3].tolist() == logits[:, :3].tolist()


def _frequencies(params, processed=None, rows=20000):
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(rows, 1)
    logprobs = logits.log_softmax(-1)
    if processed is not None:
        processed = processed.repeat(rows, 1)
    tokens = sample_tokens(logprobs, logprobs.exp(), params, torch.Generator().manual_seed(0), processed)
    return torch.bincount(tokens, minlength=5) / rows


def test_min_p_keeps_tokens_within_a_factor_of_the_most_likely():
    # p_i ∝ e^(3-i): p_1/p_0 = e^-1 = 0.37, p_2/p_0 = e^-2 = 0.14; min_p = 0.2 keeps tokens 0 and 1
    expected = torch.tensor([1.0, math.exp(-1), 0, 0, 0])
    assert torch.allclose(_frequencies(SamplingParams(min_p=0.2)), expected / expected.sum(), atol=0.015)
    # at temperature 0.5 the ratios square: p_1/p_0 = e^-2 < 0.2, only token 0 is left
    assert _frequencies(SamplingParams(min_p=0.2, temperature=0.5)).tolist() == [1.0, 0, 0, 0, 0]
    # min_p applies to the tempered distribution after the penalty, then top-k (vLLM's order)
    assert _frequencies(SamplingParams(min_p=0.1, top_k=2))[2:].sum() == 0


def test_sampling_draws_from_the_penalised_distribution():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    seen = torch.tensor([[True, False, False, False, True]])
    params = SamplingParams(repetition_penalty=3.0, temperature=0.8)
    processed = processed_logits(logits, params, seen)
    expected = (torch.tensor([1.0, 2.0, 1.0, 0.0, -3.0]) / 0.8).softmax(-1)  # 3/3 = 1, -1·3 = -3
    assert torch.allclose(_frequencies(params, processed), expected, atol=0.015)
    greedy = SamplingParams(greedy=True, repetition_penalty=3.0)
    assert sample_tokens(logits.log_softmax(-1), None, greedy, None, processed).tolist() == [1]


def test_bad_values_are_named(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    seq = engine.add_sequence([5])
    for params, name in ((SamplingParams(min_p=1.5), "min_p"),
                         (SamplingParams(repetition_penalty=0.0), "repetition_penalty"),
                         (SamplingParams(min_tokens=-1), "min_tokens")):
        with pytest.raises(ValueError, match=f"SamplingParams.{name}"):
            engine.generate([seq], params, [3])


# ---------------------------------------------------------------- the HF engine


@pytest.fixture
def eos_heavy(tiny_model, tiny_tokenizer):
    """The tiny model with +30 on the EOS logit: greedy decoding ends at once unless told otherwise."""
    model = copy.deepcopy(tiny_model)
    eos = tiny_tokenizer.eos_token_id

    def boost(module, inputs, output):
        output = output.clone()
        output[..., eos] += 30.0
        return output

    model.lm_head.register_forward_hook(boost)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def test_min_tokens_bans_eos_until_the_count_and_records_the_policys_log_probs(eos_heavy, tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    prompt = tiny_tokenizer.encode("The quick brown fox", add_special_tokens=False)
    engine = HFEngine(eos_heavy, tiny_tokenizer)
    plain = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True), [10])[0]
    assert plain.token_ids == [eos] and plain.finish_reason == "eos"
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, min_tokens=4), [10])[0]
    # by hand: greedy over the logits with EOS at -inf for the first 4 tokens, then EOS wins again
    ids, expected, logprobs = list(prompt), [], []
    for step in range(5):
        logits = _logits(eos_heavy, ids)
        banned = logits.clone()
        if step < 4:
            banned[eos] = float("-inf")
        token = int(banned.argmax())
        expected.append(token)
        logprobs.append(float(logits.log_softmax(-1)[token]))  # the untouched policy's log-prob
        ids.append(token)
    assert expected[-1] == eos and eos not in expected[:-1]
    assert seg.token_ids == expected and seg.finish_reason == "eos"
    assert seg.logprobs == pytest.approx(logprobs, abs=1e-4)
    assert seg.logprobs[0] < -20  # EOS took almost all the mass: the token was drawn from the banned distribution
    short = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, min_tokens=4), [2])[0]
    assert len(short.token_ids) == 2 and short.finish_reason == "length"  # the budget wins


def test_min_tokens_defers_stop_strings(eos_heavy, tiny_tokenizer):
    tag = "</search>"
    tag_id = tiny_tokenizer.convert_tokens_to_ids(tag)
    model = copy.deepcopy(eos_heavy)

    def prefer_tag(module, inputs, output):
        output = output.clone()
        output[..., tag_id] += 100.0
        return output

    model.lm_head.register_forward_hook(prefer_tag)
    engine = HFEngine(model, tiny_tokenizer)
    prompt = tiny_tokenizer.encode("The quick brown fox", add_special_tokens=False)
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, stop=(tag,)), [8])[0]
    assert seg.token_ids == [tag_id] and seg.finish_reason == "stop"
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, stop=(tag,), min_tokens=3), [8])[0]
    assert seg.token_ids == [tag_id] * 3 and (seg.finish_reason, seg.stop_string) == ("stop", tag)


def test_ignore_eos_keeps_generating_to_the_budget(eos_heavy, tiny_tokenizer):
    eos = tiny_tokenizer.eos_token_id
    engine = HFEngine(eos_heavy, tiny_tokenizer)
    prompt = tiny_tokenizer.encode("The quick brown fox", add_special_tokens=False)
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(greedy=True, ignore_eos=True), [6])[0]
    assert seg.token_ids == [eos] * 6 and seg.finish_reason == "length"
    with_min = engine.generate([engine.add_sequence(prompt)], SamplingParams(ignore_eos=True, min_tokens=6), [6])[0]
    assert len(with_min.token_ids) == 6 and eos not in with_min.token_ids  # min_tokens = budget forces the length


def test_repetition_penalty_matches_a_step_by_step_decode(tiny_model, tiny_tokenizer):
    """Greedy with penalty 1.8 over two sequences of a batch (one forked after a tool result) equals greedy over
    logits penalised by hand on every token of the full context, and avoids the tokens it already holds."""
    penalty = 1.8
    prompts = [tiny_tokenizer.encode(t, add_special_tokens=False)
               for t in ("<search>Velmora founder</search>", "The quick brown fox jumps")]
    engine = HFEngine(tiny_model, tiny_tokenizer)
    ids = [engine.add_sequence(p) for p in prompts]
    params = SamplingParams(greedy=True, repetition_penalty=penalty)
    engine.generate(ids, params, [5, 3])
    engine.append(ids[0], tiny_tokenizer.encode(" <result>\n150\n</result>", add_special_tokens=False))
    ids.append(engine.fork(ids[0]))
    engine.generate(ids, params, [4, 6, 4])
    for seq in ids:
        context = engine.token_ids(seq)
        start = len(prompts[0]) if seq != ids[1] else len(prompts[1])
        for position in range(start, len(context)):  # every generated token is the hand-penalised argmax
            if engine_appended(context, position, tiny_tokenizer):
                continue
            logits = _logits(tiny_model, context[:position])
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[torch.tensor(context[:position])] = True
            by_hand = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
            assert context[position] == int(by_hand.argmax()), f"sequence {seq}, position {position}"
    plain = HFEngine(tiny_model, tiny_tokenizer)
    free = plain.generate([plain.add_sequence(prompts[1])], SamplingParams(greedy=True), [12])[0].token_ids
    penalised = engine.token_ids(ids[1])[len(prompts[1]):]
    assert len(set(penalised)) >= len(set(free))  # fewer repeats than plain greedy over the same prompt


def engine_appended(context: list[int], position: int, tokenizer) -> bool:
    """Whether ``context[position]`` belongs to the appended tool result (not generated)."""
    result = tokenizer.encode(" <result>\n150\n</result>", add_special_tokens=False)
    for start in range(max(0, position - len(result) + 1), position + 1):
        if context[start:start + len(result)] == result:
            return True
    return False


# ---------------------------------------------------------------- config and engines


def test_rollout_keys_reach_the_sampling_params(tmp_path):
    from aepo_rl.rollout.tree import _sampling

    cfg = load_config(overrides={"rollout.min_p": 0.05, "rollout.repetition_penalty": 1.1, "rollout.min_tokens": 2,
                                 "rollout.ignore_eos": True})
    params = _sampling(cfg.rollout, {}, False, None)
    assert (params.min_p, params.repetition_penalty, params.min_tokens, params.ignore_eos) == (0.05, 1.1, 2, True)
    with pytest.raises(ConfigError, match="rollout.min_p"):
        load_config(overrides={"rollout.min_p": 2})
    with pytest.raises(ConfigError, match="rollout.repetition_penalty"):
        load_config(overrides={"rollout.repetition_penalty": 0})


def test_an_engine_that_does_not_declare_an_option_is_refused(tiny_model, tiny_tokenizer):
    assert set(ENGINES.capabilities("hf")["sampling"]) == {"min_tokens", "ignore_eos", "repetition_penalty", "min_p"}
    register_engine("plain_hf", shares_weights=True, entropies=("full",))(
        lambda cfg, model, tokenizer: HFEngine(model, tokenizer))
    try:
        cfg = load_config(overrides={"rollout.engine": "plain_hf"})
        assert isinstance(build_engine(cfg, tiny_model, tiny_tokenizer), HFEngine)  # defaults need nothing
        cfg = load_config(overrides={"rollout.engine": "plain_hf", "rollout.min_p": 0.1, "rollout.ignore_eos": True})
        with pytest.raises(ConfigError, match=r"'plain_hf' does not honour rollout.ignore_eos, rollout.min_p"):
            build_engine(cfg, tiny_model, tiny_tokenizer)
        from aepo_rl.train.pipeline import check_rl_engine

        with pytest.raises(ConfigError, match=r"does not honour rollout.ignore_eos, rollout.min_p"):
            check_rl_engine(cfg)  # aepo train refuses it before SFT
    finally:
        del ENGINES["plain_hf"]


def test_openai_engine_sends_the_options_as_vllm_extensions_and_names_them_when_refused(tiny_tokenizer):
    import httpx
    from helpers import FakeServer, make_engine

    from aepo_rl.errors import EndpointError

    server = FakeServer(tiny_tokenizer, "<search> Velmora</search> more")
    engine = make_engine(tiny_tokenizer, server)
    engine.generate([engine.add_sequence([5, 6])], SamplingParams(), [4])
    assert not {"min_tokens", "ignore_eos", "repetition_penalty", "min_p"} & set(server.bodies[-1])  # a plain request
    params = SamplingParams(min_tokens=3, ignore_eos=True, repetition_penalty=1.2, min_p=0.05)
    engine.generate([engine.add_sequence([5, 6])], params, [4])
    assert {k: server.bodies[-1][k] for k in ("min_tokens", "ignore_eos", "repetition_penalty", "min_p")} == {
        "min_tokens": 3, "ignore_eos": True, "repetition_penalty": 1.2, "min_p": 0.05}

    def openai_only(request):  # a server that knows only the OpenAI API's fields
        body = __import__("json").loads(request.content)
        extra = sorted(set(body) & {"min_p", "repetition_penalty"})
        if extra:
            return httpx.Response(400, json={"error": f"unrecognized request arguments: {extra}"})
        return server(request)

    engine = make_engine(tiny_tokenizer, openai_only, prompt_format="text")
    with pytest.raises(EndpointError, match=r"rollout.min_p, rollout.repetition_penalty at their defaults"):
        engine.generate([engine.add_sequence([5, 6])], SamplingParams(min_p=0.05, repetition_penalty=1.2), [4])
