"""The LLM judge reward (``llm_judge``): an OpenAI-compatible chat endpoint decides whether the predicted
answer means the same as a gold answer (docs/algorithm.md §3 evaluation)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path

import httpx

from aepo_rl.errors import UserError
from aepo_rl.jsonl import read_jsonl
from aepo_rl.registry import register_reward
from aepo_rl.rewards.scores import extract_answer


class JudgeUnavailableError(UserError, RuntimeError):
    """The LLM judge endpoint could not be reached or answered with an error."""


_JUDGE_PROMPT = """You grade answers to questions. Decide whether the predicted answer means the same as
one of the reference answers; wording, capitalisation and formatting do not matter, extra or missing
facts that change the meaning do.

Question: {question}
Reference answers: {answers}
Predicted answer: {prediction}

Reply with one word: Correct or Incorrect."""


@register_reward("llm_judge", binary=True, needs=("judge",))
class LLMJudge:
    """An LLM judge through any OpenAI-compatible ``/chat/completions`` endpoint (§3 evaluation).

    Verdicts are cached in memory (and in ``cache_path`` as JSONL when given), keyed by the
    question, gold answers and prediction. A response with no boxed answer scores 0 without a call.
    """

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 30.0,
                 cache_path: str | Path | None = None, transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self.model = model
        self.cache_path = Path(cache_path) if cache_path else None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self._lock = threading.Lock()
        self._cache: dict[str, float] = {}
        if self.cache_path and self.cache_path.exists():
            self._cache = {entry["key"]: entry["score"] for _, entry in read_jsonl(self.cache_path)}

    def _endpoint(self) -> str:
        return self.url if self.url.endswith("/chat/completions") else f"{self.url}/chat/completions"

    def judge(self, question: str, prediction: str, answers: list[str]) -> float:
        key = hashlib.sha256(json.dumps([question, answers, prediction]).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        prompt = _JUDGE_PROMPT.format(question=question, answers=" | ".join(answers), prediction=prediction)
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0.0, "max_tokens": 8}
        try:
            reply = self._client.post(self._endpoint(), json=body)
            reply.raise_for_status()
            verdict = reply.json()["choices"][0]["message"]["content"]
        except httpx.HTTPError as err:
            raise JudgeUnavailableError(f"LLM judge endpoint {self._endpoint()} is unavailable: {err}") from err
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise JudgeUnavailableError(f"LLM judge endpoint {self._endpoint()} "
                                        f"sent an unexpected reply: {err}") from err
        score = parse_verdict(verdict)
        with self._lock:
            self._cache[key] = score
            if self.cache_path:
                with self.cache_path.open("a") as f:
                    f.write(json.dumps({"key": key, "score": score}) + "\n")
        return score

    def __call__(self, response: str, answers: list[str], question: str = "") -> float:
        prediction = extract_answer(response)
        return 0.0 if prediction is None else self.judge(question, prediction, answers)


def parse_verdict(text: str) -> float:
    """1.0 for a "Correct" verdict, 0.0 for "Incorrect" or anything else."""
    words = re.findall(r"[a-z]+", text.lower())
    return 1.0 if words and words[0] == "correct" else 0.0
