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

import asyncio
import collections
import concurrent.futures
import hashlib
import inspect
import json
import math
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


# ---------------------------------------------------------------- batched reward functions (TRL's convention)

RewardFunc = Callable[..., object]
"""``fn(prompts, completions, completion_ids, **columns) -> list[float | None]`` (or an awaitable of it), TRL's
convention: one entry per completion; ``columns`` are the dataset's other columns, one value per completion."""


def completion_text(completion) -> str:
    """The text of a completion: itself, or the contents of its messages (``[{"role": "assistant", "content": …}]``)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content", "")) for message in completion)


def prompt_question(prompt) -> str:
    """The question of a prompt: itself, or its last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [str(m.get("content", "")) for m in prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def _gold_of(columns: dict, index: int, name: str) -> list[str]:
    """The gold answers of completion ``index``: verl's ``reward_model.ground_truth``, else its ``answer`` column."""
    model = columns.get("reward_model", [None] * (index + 1))[index]
    if isinstance(model, dict) and model.get("ground_truth") is not None:
        return gold_answers(model["ground_truth"])
    answer = columns.get("answer", [None] * (index + 1))[index]
    if answer is not None:
        return gold_answers(answer)
    raise RewardSetupError(f"reward '{name}' needs the gold answers of completion {index}: give the dataset an 'answer' "
                    "column, or verl's 'reward_model' = {'ground_truth': ...}")


def reward_function(name: str, *, judge_url: str | None = None, judge_model: str = TaskConfig.judge_model
                    ) -> RewardFunc:
    """The registered reward ``name`` as a batched function of TRL's convention: each completion is scored
    against its row's ``answer`` (or ``reward_model.ground_truth``), the question being the ``question``
    column or the prompt's last user message. Its ``binary`` attribute is the registry's."""
    reward = get_reward(name, judge_url=judge_url, judge_model=judge_model)

    def score(prompts, completions, **columns) -> list[float]:
        questions = columns.get("question") or [prompt_question(p) for p in prompts]
        return [float(reward(completion_text(c), _gold_of(columns, i, name), str(questions[i])))
                for i, c in enumerate(completions)]

    score.__name__ = score.__qualname__ = name
    score.binary = REWARDS.capabilities(name)["binary"]
    score.reads_answer = True
    return score


GOLD_COLUMNS = ("answer", "ground_truth", "reward_model", "solution")
"""Columns that hold a row's gold answer: a reward function that names one as a parameter reads it."""


def reads_answer(fn) -> bool:
    """Whether reward function ``fn`` reads the row's gold answer: a registered reward does; a function does when
    it names a gold column (:data:`GOLD_COLUMNS`) as a parameter (one reading it from ``**kwargs`` cannot be told,
    and gets a KeyError naming the column when a row has none)."""
    if getattr(fn, "reads_answer", False):
        return True
    try:
        return any(name in GOLD_COLUMNS for name in inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return True


class RewardSetupError(UserError, ValueError):
    """``reward_funcs`` / ``reward_weights`` that cannot be used (empty, not callable, mismatched weights)."""


class RewardFunctionError(UserError, TypeError):
    """A reward function raised, or returned something other than one float (or None) per completion; the
    message names the function, what went wrong and the fix."""


def _check_signature(fn) -> None:
    """Refuse, before any work, a reward function that cannot take TRL's keyword call
    ``fn(prompts=, completions=, completion_ids=, <every other column>=)``: one without ``**kwargs``,
    or with a parameter that cannot be given by keyword."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: its call will tell
        return
    name = function_name(fn)
    positional = [p.name for p in parameters if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        raise RewardSetupError(f"reward function '{name}': parameter(s) {', '.join(positional)} are positional-only, "
                               "but reward functions are called with keyword arguments only (prompts=, completions=, "
                               "completion_ids= and one per dataset column); drop the '/'")
    if not any(p.kind == p.VAR_KEYWORD for p in parameters):
        given = ", ".join(p.name for p in parameters if p.kind != p.VAR_POSITIONAL)
        raise RewardSetupError(f"reward function '{name}({given})' has no **kwargs: it is called with prompts=, "
                               "completions=, completion_ids= and every other column of the row (answer=, …) as "
                               f"keyword arguments; end its parameters with **kwargs, as TRL's reward functions do: "
                               f"def {name}({given + ', ' if given else ''}**kwargs)")


def _raised(fn, err: Exception, kwargs: dict) -> RewardFunctionError:
    count = len(kwargs.get("completions", []))
    return RewardFunctionError(
        f"reward function '{function_name(fn)}' raised {type(err).__name__}: {err} (called with {count} completions "
        f"and the keyword arguments {', '.join(kwargs)}); fix the function (the traceback chained to this error "
        "shows the line; `aepo --debug` prints it)")


def function_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class WeightedRewards:
    """Reward functions with weights, TRL's ``reward_funcs`` / ``reward_weights``: the score of a completion is
    Σ_i w_i · r_i over the functions that scored it (a function returns None for a completion it does not
    apply to). Async functions of one call run concurrently.

    ``funcs``: callables of TRL's convention (:data:`RewardFunc`) or registered reward names
    (:func:`reward_function`). ``weights``: one per function (default 1 each).
    """

    def __init__(self, funcs, weights=None, *, judge_url: str | None = None,
                 judge_model: str = TaskConfig.judge_model):
        if callable(funcs) or isinstance(funcs, str):
            funcs = [funcs]
        funcs = list(funcs or [])
        if not funcs:
            raise RewardSetupError("reward_funcs is empty: give at least one reward function (a callable, or a registered "
                            f"reward name: {', '.join(REWARDS)})")
        self.funcs = []
        for i, fn in enumerate(funcs):
            if isinstance(fn, str):
                fn = reward_function(fn, judge_url=judge_url, judge_model=judge_model)
            elif not callable(fn):
                raise RewardSetupError(f"reward_funcs[{i}] is a {type(fn).__name__}, not a function: give a callable "
                                "fn(prompts, completions, **columns) -> list[float], or a registered reward name")
            else:
                _check_signature(fn)
            self.funcs.append(fn)
        self.names = [function_name(fn) for fn in self.funcs]
        weights = [1.0] * len(self.funcs) if weights is None else list(weights)
        if len(weights) != len(self.funcs):
            raise RewardSetupError(f"reward_weights has {len(weights)} entries for {len(self.funcs)} reward functions "
                            f"({', '.join(self.names)}): give one weight per function")
        if not all(isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights):
            raise RewardSetupError(f"reward_weights must be finite numbers, got {weights}")
        self.weights = [float(w) for w in weights]

    def reads_answer(self) -> list[str]:
        """The functions that read the rows' gold answer (:func:`reads_answer`), by name."""
        return [name for name, fn in zip(self.names, self.funcs) if reads_answer(fn)]

    @property
    def binary(self) -> bool:
        """One function whose score is 1 exactly when the answer is right (a binary registered reward)."""
        return len(self.funcs) == 1 and bool(getattr(self.funcs[0], "binary", False))

    def __call__(self, prompts: list, completions: list, completion_ids: list[list[int]], columns: dict[str, list],
                 row_names: list[str] | None = None) -> tuple[list[float], dict[str, float]]:
        """The weighted scores of the completions, and each function's mean and std (``rewards/<name>/mean``,
        TRL's metric names) over the completions it scored."""
        kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **columns}
        values = _call_all(self.funcs, kwargs)
        count = len(completions)
        row_names = row_names or [f"completion {i}" for i in range(count)]
        per_function = [self._check(fn, value, count, row_names) for fn, value in zip(self.funcs, values)]
        scores, metrics = [], {}
        for i in range(count):
            scored = [(w, r[i]) for w, r in zip(self.weights, per_function) if r[i] is not None]
            if not scored:
                raise RewardFunctionError(f"every reward function ({', '.join(self.names)}) returned None for "
                                          f"{row_names[i]}: at least one must score each completion")
            scores.append(sum(w * r for w, r in scored))
        for name, rewards in zip(self.names, per_function):
            given = [r for r in rewards if r is not None]
            if given:
                mean = sum(given) / len(given)
                metrics[f"rewards/{name}/mean"] = mean
                metrics[f"rewards/{name}/std"] = math.sqrt(sum((r - mean) ** 2 for r in given) / len(given))
        return scores, metrics

    @staticmethod
    def _check(fn, value, count: int, row_names: list[str]) -> list[float | None]:
        name = function_name(fn)
        if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
            value = value.tolist()  # a tensor or an array
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
            raise RewardFunctionError(f"reward function '{name}' returned a {type(value).__name__}; return a list "
                                      f"with one float per completion ({count} here)")
        if len(value) != count:
            raise RewardFunctionError(f"reward function '{name}' returned {len(value)} values for {count} completions; "
                                      "return one float per completion, in the order of `completions`")
        out = []
        for i, r in enumerate(value):
            if r is None:
                out.append(None)
                continue
            if isinstance(r, bool) or not isinstance(r, (int, float)) and not hasattr(r, "__float__"):
                raise RewardFunctionError(f"reward function '{name}' returned {r!r} ({type(r).__name__}) for "
                                          f"{row_names[i]}; return a float (or None when the function does not "
                                          "apply to that completion)")
            r = float(r)
            if not math.isfinite(r):
                raise RewardFunctionError(f"reward function '{name}' returned {r} for {row_names[i]}; return a finite "
                                          "float (or None when the function does not apply to that completion)")
            out.append(r)
        return out


def _call_all(funcs, kwargs: dict) -> list:
    """Call every function with ``kwargs``; awaitables (async functions) are awaited together on one event loop
    (in a thread of its own when the caller already runs one, as in a notebook)."""
    values = []
    for fn in funcs:
        try:
            values.append(fn(**kwargs))
        except UserError:
            raise
        except Exception as err:
            raise _raised(fn, err, kwargs) from err
    pending = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
    if not pending:
        return values

    async def awaited(i: int):
        try:
            return await values[i]
        except UserError:
            raise
        except Exception as err:
            raise _raised(funcs[i], err, kwargs) from err

    async def gather():
        return await asyncio.gather(*(awaited(i) for i in pending))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        results = asyncio.run(gather())
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            results = pool.submit(asyncio.run, gather()).result()
    for i, result in zip(pending, results):
        values[i] = result
    return values
