"""OpenAIEngine: the engine protocol over an OpenAI-compatible ``/completions`` endpoint.

Works with vLLM's server (``vllm serve MODEL``; the way to run rollouts on vLLM) and with any other
OpenAI-compatible server (``transformers serve``, API models). Each sequence's token ids live here;
every ``generate`` sends the whole context as the prompt (token ids when the server accepts them,
else text) — the server's prefix cache, not this client, avoids recomputing it. Requests for one
call run concurrently.

What the server takes is found once, by the first request, sent alone (``vllm_fields="auto"``):
vLLM's fields (:data:`VLLM_FIELDS`: token ids in the output, the stop string kept, ``top_k`` and the
other sampling extensions) go in until the server refuses a request that carries them; then plain
OpenAI requests, whose stop strings this client applies itself (the server generates the round's
budget, the text is cut after the first stop string); then text prompts if token ids are refused.
``vllm_fields="on"`` / ``"off"`` skips the probe. A refusal that no downgrade cures is an
:class:`~aepo_rl.errors.EndpointError` quoting the server's complaint.

What the server can give, and what this engine fills in:
- ``logprobs``: the log-prob the server reports for each sampled token (vLLM's default
  ``logprobs_mode`` is the raw, untempered distribution, as the protocol asks).
- ``entropies``: the FULL entropy is unavailable from an API, so it is filled with the
  top-k proxy −Σ p·log p over the ``top_logprobs`` entries returned (k = 20 by default),
  and ``top10_entropies`` with the release's proxy (§1.2): the same over the largest 10 plus the
  sampled token when it is not among them (what vLLM returns for ``logprobs=10``).
- Token ids: vLLM returns them with ``return_tokens_as_token_ids`` (``"token_id:123"``). A
  server that only returns text gets its text re-encoded with the local tokenizer (then
  token-in/token-out does not hold and per-token values are NaN when the counts differ, or when
  the server returns no log-probs at all, as ``transformers serve`` does: evaluation then reports
  the entropy as unavailable; use such a server for evaluation only).
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from aepo_rl.engines.base import SamplingParams, Segment
from aepo_rl.engines.sampling import check_params, top_k_entropy
from aepo_rl.engines.sequences import SequenceTable, TokenLists
from aepo_rl.errors import EndpointError

TOKEN_ID_PREFIX = "token_id:"
VLLM_FIELDS = ("return_tokens_as_token_ids", "include_stop_str_in_output", "skip_special_tokens",
               "spaces_between_special_tokens", "top_k", "min_tokens", "ignore_eos", "repetition_penalty", "min_p")
"""Request fields of vLLM's server beyond the OpenAI API, sent only to a server that takes them."""
log = logging.getLogger(__name__)


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
                 http_client: httpx.Client | None = None, vllm_fields: str = "auto"):
        if prompt_format not in ("auto", "token_ids", "text"):
            raise ValueError(f"OpenAIEngine: prompt_format must be auto, token_ids or text, got {prompt_format!r}")
        if vllm_fields not in ("auto", "on", "off"):
            raise ValueError(f"OpenAIEngine: vllm_fields must be auto, on or off, got {vllm_fields!r}")
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
        self.vllm = None if vllm_fields == "auto" else vllm_fields == "on"
        """Whether the server takes vLLM's fields (:data:`VLLM_FIELDS`); None until the first request tells."""
        self._refusal = ""
        """The server's complaint when it refused vLLM's fields."""
        self._unapplied_noted = False
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
        segments = []
        while jobs and not self._settled():  # the first request finds what the server takes, alone
            segments.append(self._complete(*jobs.pop(0), params))
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(jobs)))) as pool:
            segments += list(pool.map(lambda job: self._complete(*job, params), jobs))
        for context, segment in zip(contexts, segments):
            context.extend(segment.token_ids)
        return segments

    def _settled(self) -> bool:
        return self.vllm is not None and self.prompt_format != "auto"

    def _request_body(self, context: list[int], budget: int, seed: int, params: SamplingParams, as_text: bool,
                      vllm: bool = True) -> dict:
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
        }
        if not vllm:  # plain OpenAI: the server would drop the stop string from the text; _segment cuts at it
            return body
        body.update({"return_tokens_as_token_ids": True, "include_stop_str_in_output": True,
                     "skip_special_tokens": False, "spaces_between_special_tokens": False})
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
        while True:
            vllm, as_text = self.vllm is not False, self.prompt_format == "text"
            if not vllm:
                self._check_plain(params)
            response = self._post(self._request_body(context, budget, seed, params, as_text, vllm))
            if response.status_code not in (400, 422) or not self._downgrade(response, vllm, as_text):
                break
        if response.status_code == 200:  # what this request carried is what the server takes
            self.vllm = vllm if self.vllm is None else self.vllm
            if self.prompt_format == "auto":
                self.prompt_format = "text" if as_text else "token_ids"
        if response.status_code in (401, 403, 404):
            fix = "set OPENAI_API_KEY" if response.status_code != 404 else \
                f"check the base URL (it usually ends in /v1) and the model name {self.model!r}"
            raise EndpointError(f"{self.url} answered HTTP {response.status_code}: {complaint(response)}; {fix}")
        if response.status_code != 200:
            raise EndpointError(f"{self.url} answered HTTP {response.status_code}: {complaint(response)}")
        payload = response.json()
        self._count(payload.get("usage") or {})
        return self._segment(payload["choices"][0], params, vllm)

    def _downgrade(self, response: httpx.Response, vllm: bool, as_text: bool) -> bool:
        """After a refusal (HTTP 400/422) of a request while what the server takes is unknown: send plain OpenAI
        requests (first when the complaint names vLLM's fields, or the prompt cannot change), text prompts (first
        otherwise); False when there is nothing left to drop (the refusal is reported)."""
        said = complaint(response)
        fields = (any(name in said for name in VLLM_FIELDS)
                  or any(word in said.lower() for word in ("unexpected", "extra")))
        can_drop_fields, can_drop_ids = vllm and self.vllm is None, not as_text and self.prompt_format == "auto"
        if can_drop_fields and (fields or not can_drop_ids):
            self.vllm, self._refusal = False, said
            log.info("%s refused vLLM's request fields (%s): sending plain OpenAI requests", self.url, said)
            return True
        if can_drop_ids:
            self.prompt_format = "text"  # this server does not take token-id prompts
            return True
        return False

    def _check_plain(self, params: SamplingParams) -> None:
        """A server without vLLM's fields cannot apply the sampling extensions the user set: refused, naming them;
        ``top_k`` (evaluation's default 20, §5) is dropped with one warning."""
        extensions = vllm_extensions(params)
        refused = f" (it answered: {self._refusal})" if self._refusal else ""
        if extensions:
            raise EndpointError(
                f"{self.url} does not take vLLM's request fields{refused}, and the sampling options "
                f"{sorted(extensions)} need them: serve the model with `vllm serve`, or leave "
                f"{', '.join(EXTENSION_KEYS[k] for k in sorted(extensions))} at their defaults")
        if params.top_k > 0 and not (params.greedy or params.temperature == 0) and not self._unapplied_noted:
            self._unapplied_noted = True
            log.warning("%s does not take vLLM's request fields%s: top_k=%d is not applied (plain temperature/top_p "
                        "sampling); set eval.top_k=0 / rollout.top_k=0 to sample as this server does",
                        self.url, refused, params.top_k)

    def _count(self, usage: dict) -> None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.counters["prefill_tokens"] += usage.get("prompt_tokens", 0) - cached
        self.counters["decode_tokens"] += usage.get("completion_tokens", 0)
        self.counters["requests"] += 1

    def _segment(self, choice: dict, params: SamplingParams, vllm: bool = True) -> Segment:
        if not vllm:
            return self._plain_segment(choice, params)
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

    def _plain_segment(self, choice: dict, params: SamplingParams) -> Segment:
        """A plain OpenAI answer (no stop strings were sent): its text cut after the first stop string, which it keeps
        (as vLLM's ``include_stop_str_in_output``), re-encoded; per-token values NaN unless the server's log-probs
        count the same tokens."""
        text = choice.get("text", "")
        hits = [(text.find(stop) + len(stop), stop) for stop in params.stop if stop in text]
        end, stop = min(hits) if hits else (len(text), None)
        token_ids = self.tokenizer.encode(text[:end], add_special_tokens=False)
        logprobs = choice.get("logprobs") or {}
        token_logprobs = [lp if lp is not None else math.nan for lp in logprobs.get("token_logprobs") or []]
        tops = logprobs.get("top_logprobs") or [None] * len(token_logprobs)
        if stop is not None or len(token_logprobs) != len(token_ids):
            token_logprobs = proxy = proxy10 = [math.nan] * len(token_ids)
        else:
            proxy = [top_k_proxy(t, self.top_logprobs) for t in tops]
            proxy10 = [top_k_proxy(t, 10) for t in tops]
        if stop is not None:
            return Segment(token_ids, token_logprobs, proxy, proxy10, "stop", stop)
        reason = "length" if choice.get("finish_reason") == "length" else "eos"
        return Segment(token_ids, token_logprobs, proxy, proxy10, reason)

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


def complaint(response: httpx.Response) -> str:
    """What the server said was wrong: FastAPI's ``detail``, OpenAI's ``error.message``, or the body's text."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:500]
    error = data.get("error") if isinstance(data, dict) else None
    said = (error.get("message") if isinstance(error, dict) else error) or \
        (data.get("detail") or data.get("message") if isinstance(data, dict) else None)
    return str(said or response.text)[:500]
