"""Batched reward functions of TRL's convention, and :class:`WeightedRewards`: TRL's ``reward_funcs`` /
``reward_weights`` (what a dataset task scores with)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
from typing import Callable

from aepo_rl.config import TaskConfig
from aepo_rl.errors import UserError
from aepo_rl.registry import REWARDS
from aepo_rl.rewards.scores import get_reward, gold_answers

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
    raise RewardSetupError(f"reward '{name}' needs the gold answers of completion {index}: give the dataset "
                           "an 'answer' column, or verl's 'reward_model' = {'ground_truth': ...}")


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
            raise RewardSetupError("reward_funcs is empty: give at least one reward function (a "
                                   f"callable, or a registered reward name: {', '.join(REWARDS)})")
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
