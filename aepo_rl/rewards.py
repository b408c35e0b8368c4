"""Rewards on decoded responses (model text and the environment's result blocks), docs/algorithm.md §3.

Every named reward is a callable ``fn(response, answers, question="") -> float`` registered with
``@register_reward(name, binary=...)``; get one with ``get_reward(name)``. ``compute_score`` is
verl's entry point (``compute_score(data_source, solution_str, ground_truth, extra_info=None)``).

The release's deep-research reward (§3)::

    score = -1                                  if the format is wrong
          = f1 + 0.1  if f1 > 0 and both </search> and </python> were used
          = f1        otherwise,    f1 = max over gold answers of token-F1(boxed answer, gold)

The format check, the tools used and the model's own text come from ``aepo_rl.protocol``, which
reads both tool-call formats of the rollout from the text alone: the release's XML tags answered
by ``<result>`` blocks (any tool's tag, not only search and python), and Hermes
``<tool_call>{"name": …}</tool_call>`` answered by ``<tool_response>`` blocks
(``rollout.tool_format=hermes``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import string
import threading
from pathlib import Path
from typing import Callable

import httpx

from aepo_rl.config import TaskConfig
from aepo_rl.errors import UserError
from aepo_rl.jsonl import read_jsonl
from aepo_rl.protocol import answer_block, format_error, last_boxed, model_text, tools_used
from aepo_rl.registry import REWARDS, register_reward

Reward = Callable[..., float]

MULTI_TOOL_BONUS = 0.1  # §3: added when f1 > 0 and both search and python were used
FORMAT_PENALTY = -1.0  # §3: any format violation
_YES_NO = {"yes", "no", "noanswer"}


# ---------------------------------------------------------------- answer extraction

def extract_answer(text: str) -> str | None:
    r"""The final answer: the ``\boxed{}`` inside the answer block (or anywhere when there is none)."""
    text = model_text(text)
    block = answer_block(text)
    return last_boxed(block if block is not None else text)


# ---------------------------------------------------------------- token F1 and exact match

def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, squeeze spaces (§3)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of normalized strings; a yes/no/noanswer mismatch scores 0 (§3)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = collections.Counter(pred_tokens) & collections.Counter(ref_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def max_f1(prediction: str, answers: list[str]) -> float:
    return max((token_f1(prediction, a) for a in answers), default=0.0)


def is_exact_match(prediction: str | None, answers: list[str]) -> bool:
    """The normalized prediction equals a normalized gold answer."""
    if prediction is None:
        return False
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in answers)


# ---------------------------------------------------------------- named rewards

@register_reward("deep_research")
def deep_research_reward(response: str, answers: list[str], question: str = "") -> float:
    """The release's reward (§3): −1 on a format error, else max token-F1 (+0.1 multi-tool bonus)."""
    if format_error(response) is not None:
        return FORMAT_PENALTY
    f1 = max_f1(extract_answer(response) or "", answers)
    if f1 > 0 and {"search", "python"} <= tools_used(response):
        return f1 + MULTI_TOOL_BONUS
    return f1


@register_reward("f1")
def f1_reward(response: str, answers: list[str], question: str = "") -> float:
    r"""Max token-F1 of the ``\boxed{}`` answer over the gold answers (0 when there is none)."""
    prediction = extract_answer(response)
    return 0.0 if prediction is None else max_f1(prediction, answers)


@register_reward("exact_match", binary=True)
def exact_match_reward(response: str, answers: list[str], question: str = "") -> float:
    r"""1 if the normalized ``\boxed{}`` answer equals a normalized gold answer, else 0."""
    return float(is_exact_match(extract_answer(response), answers))


@register_reward("math", binary=True)
def math_reward(response: str, answers: list[str], question: str = "") -> float:
    r"""1 if the ``\boxed{}`` answer is mathematically equivalent to a gold answer (math-verify)."""
    from math_verify import parse, verify

    prediction = extract_answer(response)
    if prediction is None:
        return 0.0
    parsed = parse(f"\\boxed{{{prediction}}}")
    for gold in answers:
        if normalize_answer(prediction) == normalize_answer(gold):
            return 1.0
        if parsed and verify(parse(f"\\boxed{{{gold}}}"), parsed):
            return 1.0
    return 0.0


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
            raise JudgeUnavailableError(f"LLM judge endpoint {self._endpoint()} sent an unexpected reply: {err}") from err
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


_JUDGES: dict[tuple[str, str, str], Reward] = {}


def get_reward(name: str, *, judge_url: str | None = None, judge_model: str = TaskConfig.judge_model,
               **judge_options) -> Reward:
    """The reward registered as ``name`` (:data:`aepo_rl.registry.REWARDS`): deep_research, f1,
    exact_match, math, llm_judge or one of yours. A reward that needs a judge (llm_judge) is built
    for ``judge_url`` and ``judge_model``, once per endpoint and model unless ``judge_options`` are given."""
    reward = REWARDS.lookup(name)
    if not REWARDS.needs(name, "judge"):
        return reward
    if not judge_url:
        raise ValueError(f"reward '{name}' needs task.judge_url (an OpenAI-compatible endpoint)")
    if judge_options:
        return reward(judge_url, judge_model, **judge_options)
    if (name, judge_url, judge_model) not in _JUDGES:  # one judge (and cache) per endpoint and model
        _JUDGES[(name, judge_url, judge_model)] = reward(judge_url, judge_model)
    return _JUDGES[(name, judge_url, judge_model)]


def gold_answers(ground_truth) -> list[str]:
    """Gold answers from verl's ``reward_model.ground_truth`` (a string, a list, or {"target": ...})."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("target", ground_truth.get("answer", ground_truth.get("answers")))
    if isinstance(ground_truth, (list, tuple)):
        return [str(a) for a in ground_truth]
    if hasattr(ground_truth, "tolist"):  # numpy arrays from parquet
        return [str(a) for a in ground_truth.tolist()]
    return [str(ground_truth)]


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """verl's reward entry point. The reward is ``extra_info["reward"]`` when given, else the
    default of the data source's evaluation set (math sets: math; others: deep_research)."""
    from aepo_rl.tasks.loaders import default_reward

    extra_info = extra_info or {}
    name = extra_info.get("reward") or default_reward(data_source)
    reward = get_reward(name, judge_url=extra_info.get("judge_url"),
                        judge_model=extra_info.get("judge_model", TaskConfig.judge_model))
    return float(reward(solution_str, gold_answers(ground_truth), extra_info.get("question", "")))
