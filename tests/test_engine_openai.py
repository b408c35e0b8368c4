"""OpenAIEngine against a fake OpenAI-compatible completions server (httpx.MockTransport)."""

from __future__ import annotations

import json
import math
import socket

import httpx
import pytest
from helpers import TOP, FakeServer, make_engine

from aepo_rl.config import Config
from aepo_rl.engines import build_engine
from aepo_rl.engines.base import GenerationEngine, SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.openai import OpenAIEngine, top_k_proxy
from aepo_rl.engines.vllm import vllm_available
from aepo_rl.errors import EndpointError, MissingExtraError

"""The fake server's top_logprobs at every position."""


def proxy(k):
    return -sum(math.exp(v) * v for v in sorted(TOP.values(), reverse=True)[:k])


def test_release_top10_proxy_by_hand():
    top = {f"token_id:{i}": math.log(p) for i, p in enumerate([0.3, 0.2, 0.1] + [0.03] * 12)}
    top10 = -(0.3 * math.log(0.3) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1) + 7 * 0.03 * math.log(0.03))
    # the sampled token among the 10 largest: nothing added; ranked 11th-15th or absent: its entry added once
    assert top_k_proxy(top, 10, ("token_id:1", math.log(0.2))) == pytest.approx(top10)
    assert top_k_proxy(top, 10, ("token_id:14", math.log(0.03))) == pytest.approx(top10 - 0.03 * math.log(0.03))
    assert top_k_proxy(top, 10, ("token_id:99", math.log(0.01))) == pytest.approx(top10 - 0.01 * math.log(0.01))
    assert top_k_proxy(top, 10) == pytest.approx(top10)


def test_round_trip_with_stop_string_and_token_ids(tiny_tokenizer):
    tok = tiny_tokenizer
    server = FakeServer(tok, "Velmora founder</search> trailing words")
    engine = make_engine(tok, server)
    assert isinstance(engine, GenerationEngine)
    prompt = tok.encode("<think>Who?</think> <search>", add_special_tokens=False)
    seq = engine.add_sequence(prompt)
    seg = engine.generate([seq], SamplingParams(temperature=0.7, top_p=0.9, stop=("</search>",)), [40])[0]
    assert seg.token_ids == tok.encode("Velmora founder</search>", add_special_tokens=False)
    assert (seg.finish_reason, seg.stop_string) == ("stop", "</search>")
    assert seg.logprobs == [-0.25 * (i + 1) for i in range(len(seg.token_ids))]
    assert seg.entropies == pytest.approx([proxy(20)] * len(seg.token_ids))
    # the sampled tokens are not among the returned top log-probs: the release proxy adds their entry
    assert seg.top10_entropies == pytest.approx([proxy(10) - math.exp(lp) * lp for lp in seg.logprobs])
    body = server.bodies[0]
    assert body["prompt"] == prompt and body["max_tokens"] == 40 and body["model"] == "policy"
    assert (body["temperature"], body["top_p"], body["logprobs"], body["stop"]) == (0.7, 0.9, 20, ["</search>"])
    assert "top_k" not in body and body["return_tokens_as_token_ids"] is True
    assert engine.stats() == {"prefill_tokens": len(prompt) - 2, "decode_tokens": len(seg.token_ids), "requests": 1}


def test_rounds_send_the_whole_context_and_forks_copy_it(tiny_tokenizer):
    tok = tiny_tokenizer
    server = FakeServer(tok, "abc")
    engine = make_engine(tok, server)
    seq = engine.add_sequence([5, 6])
    first = engine.generate([seq], SamplingParams(), [2])[0]
    assert first.finish_reason == "length" and len(first.token_ids) == 2
    engine.append(seq, [7, 8])
    child = engine.fork(seq)
    segs = engine.generate([seq, child], SamplingParams(greedy=True, top_k=5), [10, 0])
    assert server.bodies[1]["prompt"] == [5, 6] + first.token_ids + [7, 8]
    assert server.bodies[1]["temperature"] == 0.0 and "top_k" not in server.bodies[1]
    assert len(server.bodies) == 2  # a zero budget sends nothing
    assert segs[0].finish_reason == "eos" and segs[1].token_ids == [] and segs[1].finish_reason == "length"
    assert engine.token_ids(seq) == [5, 6] + first.token_ids + [7, 8] + segs[0].token_ids
    assert engine.token_ids(child) == [5, 6] + first.token_ids + [7, 8]
    engine.generate([child], SamplingParams(top_k=5), [3])
    assert server.bodies[2]["top_k"] == 5


def test_text_only_server_gets_text_prompts_and_reencoded_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    server = FakeServer(tok, "Ada Korrin", token_ids_in_output=False, accepts_token_prompts=False)
    engine = make_engine(tok, server)
    prompt = tok.encode("<answer>", add_special_tokens=False)
    seg = engine.generate([engine.add_sequence(prompt)], SamplingParams(), [20])[0]
    assert [b["prompt"] for b in server.bodies] == [prompt, "<answer>"]
    assert seg.token_ids == tok.encode("Ada Korrin", add_special_tokens=False)
    engine.generate([engine.add_sequence(prompt)], SamplingParams(), [20])
    assert server.bodies[-1]["prompt"] == "<answer>"  # remembered: no second token-id attempt


def test_unreachable_server_names_the_url(tiny_tokenizer):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "policy", tiny_tokenizer, timeout=5)
    with pytest.raises(ConnectionError, match=f"http://127.0.0.1:{port}/v1/completions is unreachable"):
        engine.generate([engine.add_sequence([5])], SamplingParams(), [3])


def test_server_error_is_reported(tiny_tokenizer):
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(500, text="model crashed")))
    engine = OpenAIEngine("http://fake/v1", "policy", tiny_tokenizer, http_client=client)
    with pytest.raises(EndpointError, match="http://fake/v1/completions answered HTTP 500: model crashed"):
        engine.generate([engine.add_sequence([5])], SamplingParams(), [3])


def test_build_engine_dispatch(tiny_model, tiny_tokenizer):
    cfg = Config()
    assert isinstance(build_engine(cfg, tiny_model, tiny_tokenizer), HFEngine)
    cfg.rollout.engine = "openai"
    with pytest.raises(ValueError, match="rollout.engine_url"):
        build_engine(cfg, tiny_model, tiny_tokenizer)
    cfg.rollout.engine_url, cfg.rollout.engine_model = "http://127.0.0.1:8000/v1", "served"
    engine = build_engine(cfg, tiny_model, tiny_tokenizer)
    assert isinstance(engine, OpenAIEngine) and engine.model == "served"
    if not vllm_available():  # the in-process engine names the extra to install
        cfg.rollout.engine = "vllm"
        with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[vllm\]"'):
            build_engine(cfg, tiny_model, tiny_tokenizer)


class StrictServer:
    """A strict OpenAI-compatible /v1/completions, as ``transformers serve`` answers: HTTP 422 naming any field
    outside the OpenAI API, string prompts only, no log-probs, the stop string left out of the text."""

    OPENAI_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "logprobs", "seed", "echo", "stop", "n"}

    def __init__(self, reply: str):
        self.reply, self.bodies = reply, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        unexpected = set(body) - self.OPENAI_FIELDS
        if unexpected:
            return httpx.Response(422, json={"detail": f"Unexpected fields in the request: {unexpected}"})
        if not isinstance(body["prompt"], str):
            return httpx.Response(422, json={"detail": "prompt must be a string."})
        text, finish = self.reply, "stop"
        for stop in body.get("stop", []):
            if stop in text:
                text = text[:text.index(stop)]
        return httpx.Response(200, json={"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def test_a_strict_server_gets_plain_requests_found_once_and_kept_under_concurrency(tiny_tokenizer, caplog):
    tok = tiny_tokenizer
    server = StrictServer("Velmora founder</search> and more")
    engine = make_engine(tok, server, max_concurrency=8)
    prompt = tok.encode("<search>", add_special_tokens=False)
    seqs = [engine.add_sequence(prompt) for _ in range(8)]
    params = SamplingParams(temperature=0.6, top_p=0.95, top_k=20, stop=("</search>",))
    segments = engine.generate(seqs, params, [40] * 8)
    # the first request alone: vLLM's fields refused, then token ids refused; the other 7 go out plain, as text
    assert len(server.bodies) == 3 + 7
    assert "top_k" in server.bodies[0] and isinstance(server.bodies[1]["prompt"], list)
    assert all(set(b) <= StrictServer.OPENAI_FIELDS and b["prompt"] == "<search>" for b in server.bodies[2:])
    assert all("stop" not in b for b in server.bodies[2:])  # the client cuts at the stop string itself
    for seg in segments:
        assert seg.token_ids == tok.encode("Velmora founder</search>", add_special_tokens=False)
        assert (seg.finish_reason, seg.stop_string) == ("stop", "</search>")
        assert all(math.isnan(v) for v in seg.logprobs + seg.entropies)  # no log-probs: NaN, not made up
    assert (engine.vllm, engine.prompt_format) == (False, "text")
    assert "top_k=20 is not applied" in caplog.text and caplog.text.count("is not applied") == 1
    engine.generate([engine.add_sequence(prompt)], params, [40])
    assert len(server.bodies) == 11  # remembered: no second probe
    with pytest.raises(EndpointError, match=r"does not take vLLM's request fields \(it answered: Unexpected fields in "
                                            r"the request: .*\), and the sampling options \['min_p'\] need them: .*"
                                            r"leave rollout.min_p at their defaults"):
        engine.generate([engine.add_sequence(prompt)], SamplingParams(min_p=0.1), [5])
    plain = make_engine(tok, StrictServer("x"), vllm_fields="off", prompt_format="text")
    plain.generate([plain.add_sequence(prompt)], SamplingParams(), [5])
    assert len(plain.client._transport.handler.bodies) == 1  # told: no probe


def test_a_refusal_no_downgrade_cures_quotes_the_server(tiny_tokenizer):
    def too_long(request):
        return httpx.Response(400, json={"error": {"message": "This model's maximum context length is 2048 tokens"}})

    engine = OpenAIEngine("http://fake/v1", "policy", tiny_tokenizer,
                          http_client=httpx.Client(transport=httpx.MockTransport(too_long)))
    with pytest.raises(EndpointError, match=r"http://fake/v1/completions answered HTTP 400: This model's maximum "
                                            r"context length is 2048 tokens$"):
        engine.generate([engine.add_sequence([5])], SamplingParams(), [3])
