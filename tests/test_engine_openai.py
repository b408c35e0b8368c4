"""OpenAIEngine against a fake OpenAI-compatible completions server (httpx.MockTransport)."""

from __future__ import annotations

import json
import math
import socket

import httpx
import pytest

from aepo_rl.config import Config
from aepo_rl.engines import build_engine
from aepo_rl.engines.base import GenerationEngine, SamplingParams
from aepo_rl.engines.hf import HFEngine
from aepo_rl.engines.openai import OpenAIEngine, top_k_proxy
from aepo_rl.engines.vllm import vllm_available
from aepo_rl.errors import MissingExtraError

TOP = {"token_id:1": -0.5, "token_id:2": -1.5, "token_id:3": -2.5}
"""The fake server's top_logprobs at every position."""


class FakeServer:
    """A vLLM-like /v1/completions: replies with ``reply`` (truncated at a stop string or max_tokens)."""

    def __init__(self, tokenizer, reply: str, token_ids_in_output: bool = True, accepts_token_prompts: bool = True):
        self.tokenizer = tokenizer
        self.reply = tokenizer.encode(reply, add_special_tokens=False)
        self.token_ids_in_output = token_ids_in_output
        self.accepts_token_prompts = accepts_token_prompts
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        body = json.loads(request.content)
        self.bodies.append(body)
        if isinstance(body["prompt"], list) and not self.accepts_token_prompts:
            return httpx.Response(400, json={"error": "prompt must be a string"})
        tokens, finish, stop_reason = self.reply[:body["max_tokens"]], "length", None
        for k in range(1, len(tokens) + 1):
            hit = next((s for s in body.get("stop", []) if s in self.tokenizer.decode(tokens[:k])), None)
            if hit is not None:
                tokens, finish, stop_reason = tokens[:k], "stop", hit
                break
        if finish == "length" and len(tokens) < body["max_tokens"]:
            finish = "stop"  # the reply ended: EOS
        names = [f"token_id:{t}" if self.token_ids_in_output else self.tokenizer.decode([t]) for t in tokens]
        choice = {"index": 0, "text": self.tokenizer.decode(tokens), "finish_reason": finish,
                  "stop_reason": stop_reason,
                  "logprobs": {"tokens": names, "token_logprobs": [-0.25 * (i + 1) for i in range(len(tokens))],
                               "top_logprobs": [dict(TOP) for _ in tokens]}}
        prompt_tokens = len(body["prompt"]) if isinstance(body["prompt"], list) else 7
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                 "prompt_tokens_details": {"cached_tokens": 2}}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})


def make_engine(tokenizer, server, **kwargs):
    client = httpx.Client(transport=httpx.MockTransport(server))
    return OpenAIEngine("http://fake:8000/v1/", "policy", tokenizer, http_client=client, **kwargs)


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
    with pytest.raises(RuntimeError, match="http://fake/v1/completions answered HTTP 500: model crashed"):
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
