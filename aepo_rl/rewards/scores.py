"""Answer extraction, token F1 and exact match, and the registered rewards on decoded responses
(deep_research, f1, exact_match, answer lists, math), docs/algorithm.md §3.

Every named reward is a callable ``fn(response, answers, question="") -> float`` registered with
``@register_reward(name, binary=...)``; get one with :func:`get_reward`.

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
import re
import string
from typing import Callable

from aepo_rl.config import TaskConfig
from aepo_rl.errors import import_extra
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


ANSWER_SEP = ","
"""The separator of an answer list (PhantomWiki's ``phantom_eval.constants.answer_sep``)."""


def answer_set(text: str, sep: str = ANSWER_SEP) -> set[str]:
    """An answer list as PhantomWiki normalises it (``phantom_eval.utils.normalize_pred``): split at ``sep``,
    strip each part, lower-case, as a set (so ``""`` is ``{""}``)."""
    return {part.strip().lower() for part in text.split(sep)}


def answer_list_scores(prediction: str | None, answers: list[str], sep: str = ANSWER_SEP) -> dict[str, float]:
    """PhantomWiki's scores of a predicted answer list against the gold list (``phantom_eval.score``, the gold
    list joined with ``sep`` as its evaluation does): ``em`` (the two sets are equal), ``precision`` = |P∩T|/|P|,
    ``recall`` = |P∩T|/|T|, ``f1`` their harmonic mean (0 when both are 0). An empty prediction on an empty
    gold list scores 1; no prediction (no final answer) scores 0 everywhere."""
    if prediction is None:
        return {"em": 0.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}
    pred, true = answer_set(prediction, sep), answer_set(sep.join(answers), sep)
    precision = len(pred & true) / len(pred)
    recall = len(pred & true) / len(true)
    f1 = 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)
    return {"em": float(pred == true), "precision": precision, "recall": recall, "f1": f1}


@register_reward("answer_list_em", binary=True)
def answer_list_em_reward(response: str, answers: list[str], question: str = "") -> float:
    r"""1 if the ``\boxed{}`` answer, a comma-separated list, is the gold list as a set (PhantomWiki's EM)."""
    return answer_list_scores(extract_answer(response), answers)["em"]


@register_reward("answer_list_f1")
def answer_list_f1_reward(response: str, answers: list[str], question: str = "") -> float:
    r"""F1 of the ``\boxed{}`` answer, a comma-separated list, against the gold list as sets (PhantomWiki's F1)."""
    return answer_list_scores(extract_answer(response), answers)["f1"]


@register_reward("math", binary=True, extra=("math_verify", "math"))
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


_JUDGES: dict[tuple[str, str, str], Reward] = {}


def get_reward(name: str, *, judge_url: str | None = None, judge_model: str = TaskConfig.judge_model,
               **judge_options) -> Reward:
    """The reward registered as ``name`` (:data:`aepo_rl.registry.REWARDS`): deep_research, f1,
    exact_match, math, llm_judge or one of yours. A reward that needs a judge (llm_judge) is built
    for ``judge_url`` and ``judge_model``, once per endpoint and model unless ``judge_options`` are given."""
    reward = REWARDS.lookup(name)
    if extra := REWARDS.capabilities(name)["extra"]:
        import_extra(*extra, f"reward '{name}'")
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
