"""OpenAIEngine: the engine protocol over an OpenAI-compatible ``/completions`` endpoint.

Works with vLLM's server (``vllm serve MODEL``; the way to run rollouts on vLLM) and with API
models. Each sequence's token ids live here; every ``generate`` sends the whole context as the
prompt (token ids when the server accepts them, else text) — the server's prefix cache, not
this client, avoids recomputing it. Requests for one call run concurrently.

What the server can give, and what this engine fills in:
- ``logprobs``: the log-prob the server reports for each sampled token (vLLM's default
  ``logprobs_mode`` is the raw, untempered distribution, as the protocol asks).
- ``entropies``: the FULL entropy is unavailable from an API, so it is filled with the
  top-k proxy −Σ p·log p over the ``top_logprobs`` entries returned (k = 20 by default),
  and ``top10_entropies`` with the release's proxy (§1.2): the same over the largest 10 plus the
  sampled token when it is not among them (what vLLM returns for ``logprobs=10``).
- Token ids: vLLM returns them with ``return_tokens_as_token_ids`` (``"token_id:123"``). A
  server that only returns text gets its text re-encoded with the local tokenizer (then
  token-in/token-out does not hold and per-token values are NaN when the counts differ:
  use such a server for evaluation only).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from aepo_rl.engines.base import SamplingParams, Segment
from aepo_rl.engines.sampling import check_params, top_k_entropy
from aepo_rl.engines.sequences import SequenceTable, TokenLists
from aepo_rl.errors import EndpointError

TOKEN_ID_PREFIX = "token_id:"


def top_k_proxy(top_logprobs: dict[str, float] | None, k: int,
                sampled: tuple[str, float] | None = None) -> float:
    """−Σ p·log p over the k largest returned log-probs, plus the ``sampled`` (token, log-prob)
    when that token is not among them (the release's proxy for k = 10, §1.2)."""
    top = sorted((top_logprobs or {}).items(), key=lambda item: item[1], reverse=True)[:k]
    values = [value for _, value in top]
    if sampled is not None and sampled[0] not in dict(top) and math.isfinite(sampled[1]):
        values.append(sampled[1])
    return top_k_entropy(torch.tensor(values, dtype=torch.float64)).item()


EXTENSION_KEYS = {"min_tokens": "rollout.min_tokens", "ignore_eos": "rollout.ignore_eos",
                  "repetition_penalty": "rollout.repetition_penalty", "min_p": "rollout.min_p"}
"""Sampling options that vLLM's OpenAI-compatible server takes beside the OpenAI API's own, and their config keys."""


def vllm_extensions(params: SamplingParams) -> dict:
    """The sampling options of ``params`` that are not at their defaults, as vLLM's server names them (sent
    only when set, so a server that knows only the OpenAI API gets a plain request)."""
    greedy = params.greedy or params.temperature == 0
    options = {"min_tokens": params.min_tokens, "ignore_eos": params.ignore_eos,
               "repetition_penalty": params.repetition_penalty, "min_p": 0.0 if greedy else params.min_p}
    defaults = {"min_tokens": 0, "ignore_eos": False, "repetition_penalty": 1.0, "min_p": 0.0}
    return {key: value for key, value in options.items() if value != defaults[key]}


class OpenAIEngine(TokenLists):
    """A :class:`~aepo_rl.engines.base.GenerationEngine` backed by an OpenAI-compatible server."""

    def __init__(self, base_url: str, model: str, tokenizer, api_key: str | None = None, timeout: float = 300.0,
                 top_logprobs: int = 20, max_concurrency: int = 32, seed: int = 0, prompt_format: str = "auto",
                 http_client: httpx.Client | None = None):
        if prompt_format not in ("auto", "token_ids", "text"):
            raise ValueError(f"OpenAIEngine: prompt_format must be auto, token_ids or text, got {prompt_format!r}")
        if not 1 <= top_logprobs <= 20:
            raise ValueError(f"OpenAIEngine: top_logprobs must be in [1, 20], got {top_logprobs}")
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.top_logprobs = top_logprobs
        self.max_concurrency = max_concurrency
        self.seed = seed
        self.prompt_format = prompt_format
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = http_client or httpx.Client(timeout=timeout, headers=headers)
        self._sequences: SequenceTable[list[int]] = SequenceTable("OpenAIEngine")
        self._requests = 0
        self.counters = {"prefill_tokens": 0, "decode_tokens": 0, "requests": 0}

    # ---------------------------------------------------------------- generation
    def generate(self, seq_ids: list[int], params: SamplingParams, max_new_tokens: list[int]) -> list[Segment]:
        check_params(params)
        if len(seq_ids) != len(max_new_tokens):
            raise ValueError(f"generate: {len(seq_ids)} seq_ids but {len(max_new_tokens)} max_new_tokens")
        contexts = [self._sequences[s] for s in seq_ids]
        jobs = []
        for context, budget in zip(contexts, max_new_tokens):
            jobs.append((list(context), budget, self.seed + self._requests))
            self._requests += 1
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs)))) as pool:
            segments = list(pool.map(lambda job: self._complete(*job, params), jobs))
        for context, segment in zip(contexts, segments):
            context.extend(segment.token_ids)
        return segments

    def _request_body(self, context: list[int], budget: int, seed: int, params: SamplingParams, as_text: bool) -> dict:
        greedy = params.greedy or params.temperature == 0
        body = {
            "model": self.model,
            "prompt": self.tokenizer.decode(context) if as_text else context,
            "max_tokens": budget,
            "temperature": 0.0 if greedy else params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "logprobs": self.top_logprobs,
            "seed": seed,
            "echo": False,
            # vLLM extensions (ignored by servers that do not know them):
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.top_k > 0 and not greedy:
            body["top_k"] = params.top_k
        body.update(vllm_extensions(params))
        return body

    def _post(self, body: dict) -> httpx.Response:
        try:
            return self.client.post(self.url, json=body)
        except httpx.TransportError as error:
            raise EndpointError(f"OpenAI-compatible server at {self.url} is unreachable ({error!r}); start it "
                                f"(e.g. `vllm serve MODEL`) or fix rollout.engine_url / --endpoint") from error

    def _complete(self, context: list[int], budget: int, seed: int, params: SamplingParams) -> Segment:
        if budget <= 0:
            return Segment([], [], [], [], "length")
        as_text = self.prompt_format == "text"
        response = self._post(self._request_body(context, budget, seed, params, as_text))
        if response.status_code in (400, 422) and self.prompt_format == "auto" and not as_text:
            self.prompt_format = "text"  # this server does not take token-id prompts
            response = self._post(self._request_body(context, budget, seed, params, True))
        if response.status_code in (401, 403, 404):
            fix = "set OPENAI_API_KEY" if response.status_code != 404 else \
                f"check the base URL (it usually ends in /v1) and the model name {self.model!r}"
            raise EndpointError(f"{self.url} answered HTTP {response.status_code}: {response.text[:200]}; {fix}")
        extensions = vllm_extensions(params)
        if response.status_code in (400, 422) and extensions:
            raise EndpointError(
                f"{self.url} refused the request (HTTP {response.status_code}: {response.text[:300]}); it carried the "
                f"sampling options {sorted(extensions)}, which are vLLM's extensions of the OpenAI API (its server "
                "accepts them, api.openai.com does not): serve the model with `vllm serve`, or leave "
                f"{', '.join(EXTENSION_KEYS[k] for k in sorted(extensions))} at their defaults")
        if response.status_code != 200:
            raise RuntimeError(f"{self.url} answered HTTP {response.status_code}: {response.text[:500]}")
        payload = response.json()
        self._count(payload.get("usage") or {})
        return self._segment(payload["choices"][0], params)

    def _count(self, usage: dict) -> None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.counters["prefill_tokens"] += usage.get("prompt_tokens", 0) - cached
        self.counters["decode_tokens"] += usage.get("completion_tokens", 0)
        self.counters["requests"] += 1

    def _segment(self, choice: dict, params: SamplingParams) -> Segment:
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        token_logprobs = [lp if lp is not None else math.nan for lp in logprobs.get("token_logprobs") or []]
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        proxy = [top_k_proxy(t, self.top_logprobs) for t in tops]
        proxy10 = [top_k_proxy(t, 10, sampled) for t, sampled in zip(tops, zip(tokens, token_logprobs))]
        if tokens and all(t.startswith(TOKEN_ID_PREFIX) for t in tokens):
            token_ids = [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
        else:
            token_ids = self.tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
            if len(token_ids) != len(token_logprobs):
                token_logprobs = proxy = proxy10 = [math.nan] * len(token_ids)
        reason, stop_string = self._finish(choice, params)
        return Segment(token_ids, token_logprobs, proxy, proxy10, reason, stop_string)

    @staticmethod
    def _finish(choice: dict, params: SamplingParams) -> tuple[str, str | None]:
        """OpenAI says "stop" for EOS and stop strings alike; vLLM's ``stop_reason`` tells them apart."""
        if choice.get("finish_reason") == "length":
            return "length", None
        stop_reason = choice.get("stop_reason")
        if isinstance(stop_reason, str):
            return "stop", stop_reason
        text = choice.get("text", "")
        hit = next((s for s in params.stop if text.endswith(s)), None)
        return ("stop", hit) if hit is not None else ("eos", None)
