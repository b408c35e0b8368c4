"""A task over rows of data: a Hugging Face ``datasets.Dataset``, a list of dicts, or the rows of files.

Rows follow verl's schema (``prompt`` = messages, ``reward_model.ground_truth``), TRL's (``prompt`` = a
string or messages, ``answer``) or a question/answer pair (:func:`row_to_example`).
The task scores completions with reward functions of TRL's convention
(:class:`aepo_rl.rewards.WeightedRewards`): batched, called with the prompts (as the rows give them),
the completions (the decoded responses, tool results included; strings for a string prompt,
``[{"role": "assistant", "content": text}]`` for a conversational one), the completions' token ids and
every other column as keyword arguments. ``task.name=file`` is this task over the files' rows
(:class:`aepo_rl.tasks.loaders.FileTask`), so the command line and the Python API share it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

from aepo_rl.config import TaskConfig
from aepo_rl.errors import UserError
from aepo_rl.rewards import WeightedRewards, extract_answer, gold_answers, is_exact_match
from aepo_rl.tasks.base import Demonstration, Example
from aepo_rl.tasks.common import ToolOptions, build_tools, chat_messages, check_sandbox, split_examples, system_prompt
from aepo_rl.tools.base import Tool, ToolError, get_tool

BUILT_WITH_CONFIG = ("search", "python")
"""Tools named by these names are built from the config (``task.corpus`` / ``task.search_url``, the sandbox's
limits)."""


class DatasetError(UserError, ValueError):
    """A data file is missing, empty or unreadable, or a row lacks a field; the message names the file
    and the line (JSONL) or row (parquet), both counted from 1."""


SFT_FIELDS = ("messages", "conversations", "completion")
"""Fields of a demonstration (aepo_rl/train/sft_data.py), named when such a row is given as RL data."""


def _field(row: dict, dotted: str, where: str, needed_by: str = ""):
    value: object = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            demo = next((field for field in SFT_FIELDS if field in row), None)
            hint = "" if demo is None else (f"; a row with '{demo}' is a demonstration for SFT: give "
                                            "its file with `aepo sft --data` / `aepo train "
                                            "--sft-data`, or AEPOTrainer(sft_dataset=...)")
            if needed_by and demo is None:
                hint = f"; {needed_by}"
            raise DatasetError(f"{where}: missing field '{dotted}' (a row has 'question' and 'answer', "
                               f"'prompt' and 'answer', or verl's 'prompt' and 'reward_model.ground_truth'){hint}")
        value = value[part]
    return value


def row_to_example(row: dict, where: str, example_id: str, default_source: str,
                   tools: tuple = ("search", "python"), fmt: str = "xml", answer_for: str | None = "") -> Example:
    """One row as an Example; ``where`` names file and row. Layouts: verl's (``prompt`` = messages,
    ``reward_model.ground_truth``), TRL's (``prompt`` = a string or messages, ``answer``) and question/answer;
    in each, an ``extra_info`` object is kept as the example's (``hops`` gives the per-hop tables).
    ``tools`` (names or tools) are described, in tool-call format ``fmt``, in the system message a prompt
    without one gets. ``answer_for``: what needs the gold answer (named when it is missing); None: nothing
    does, and a ``prompt`` row without one is a prompt-only row (TRL's habit) with no gold answers."""
    gold = "answer" if row.get("answer") is not None and not isinstance(row.get("reward_model"), dict) \
        else "reward_model.ground_truth"
    prompt_only = answer_for is None and row.get("answer") is None and "reward_model" not in row
    if "prompt" in row and isinstance(row["prompt"], str):
        question = row["prompt"]
        answers = [] if prompt_only else gold_answers(_field(row, gold if "reward_model" in row else "answer", where,
                                                             answer_for))
        messages = chat_messages(question, system_prompt(tools, fmt))
    elif "prompt" in row:
        messages = _field(row, "prompt", where)
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                     for m in messages):
            raise DatasetError(f"{where}: field 'prompt' must be a string or a list of {{role, content}} messages")
        messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise DatasetError(f"{where}: field 'prompt' has no user message")
        question = users[-1]
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": system_prompt(tools, fmt)}, *messages]
        answers = [] if prompt_only else gold_answers(_field(row, gold, where, answer_for))
    else:
        question = str(_field(row, "question", where))
        answers = [] if prompt_only else gold_answers(_field(row, "answer", where, answer_for))
        messages = chat_messages(question, system_prompt(tools, fmt))
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, dict):
        raise DatasetError(f"{where}: field 'extra_info' must be an object of per-question facts, e.g. "
                           f'{{"hops": 2}}, got {type(extra_info).__name__}')
    return Example(id=example_id, question=question, answers=answers,
                   data_source=str(row.get("data_source") or default_source), messages=messages,
                   ability=str(row.get("ability") or "agent"), extra_info=dict(extra_info), row=dict(row))


def dataset_rows(data: Any, what: str) -> list[tuple[str, dict]]:
    """``(where, row)`` for each row of ``data``: a ``datasets.Dataset`` (anything iterable with
    ``column_names``), a list of dicts or another iterable of mappings; ``where`` is ``"<what> row <i>"``,
    counted from 1. Raises DatasetError naming the row when one is not a mapping, or when there is none."""
    if isinstance(data, Mapping) and data and all(hasattr(split, "column_names") for split in data.values()):
        splits = list(data)  # a datasets.DatasetDict, as load_dataset(...) returns
        raise DatasetError(f"{what} is a DatasetDict of splits {splits}, as load_dataset(...) returns: pass one split, "
                           f"{what}=dataset[{splits[0]!r}]" + (" (and eval_dataset=dataset['test'])"
                                                               if what == "train_dataset" and "test" in splits else ""))
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise DatasetError(f"{what} must be a datasets.Dataset or a list of dicts (one per row), got "
                           f"{type(data).__name__}" + (" (a dict of columns? use datasets.Dataset.from_dict)"
                                                       if isinstance(data, Mapping) else ""))
    rows = []
    for i, row in enumerate(data, start=1):
        if not isinstance(row, Mapping):
            raise DatasetError(f"{what} row {i}: expected a mapping of columns to values, got {type(row).__name__}")
        rows.append((f"{what} row {i}", dict(row)))
    if not rows:
        raise DatasetError(f"{what} has no rows")
    return rows


class FunctionTool:
    """A plain function ``fn(text: str) -> str`` as a tool: the model calls it as ``<name>text</name>``; its
    docstring's first line describes it in the system prompt. An exception comes back as error text."""

    def __init__(self, fn: Callable[[str], Any]):
        parameters = [p for p in inspect.signature(fn).parameters.values()
                      if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        name = getattr(fn, "__name__", "")
        if len(parameters) != 1 or not name.isidentifier():
            raise TypeError(f"tool {fn!r}: a function tool takes exactly one required argument (the text between its "
                            "tags) and has a name; wrap others in a function of one string, or pass a Tool")
        self.fn = fn
        self.name = self.tag = name
        self.argument = parameters[0].name
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        self.description = doc[0] if doc else f"<{name}>{self.argument}</{name}> calls {name}"

    def run(self, arg: str) -> str:
        try:
            return str(self.fn(arg))
        except Exception as err:  # a tool never raises (§1.1)
            return ToolError(f"{type(err).__name__}: {err}")


def tool_spec(tool: Any) -> str | Tool:
    """A tool as given to a task: a registered name, a :class:`~aepo_rl.tools.base.Tool`, or a plain function."""
    if isinstance(tool, str) or isinstance(tool, Tool):
        return tool
    if callable(tool):
        return FunctionTool(tool)
    raise TypeError(f"tool {tool!r}: give a registered tool name, a Tool (name, tag, description, run) or a "
                    "function of one string")


class DatasetTask:
    """Questions from rows, the given tools, and reward functions of TRL's convention.

    ``train_rows`` / ``eval_rows``: ``(where, row)`` pairs (:func:`dataset_rows`); the eval rows are the
    ``dev``, ``test`` and ``val`` splits. ``tools``: registered names (``search`` and ``python`` are built
    from ``task_cfg`` and ``tool_options``), tools or functions. ``correct`` (pass@k): a single binary
    registered reward decides; otherwise exact match of the ``\\boxed{}`` answer with the row's gold answers.
    """

    def __init__(self, name: str, train_rows: list[tuple[str, dict]], eval_rows: list[tuple[str, dict]],
                 rewards: WeightedRewards, *, tools: Sequence[Any] = BUILT_WITH_CONFIG,
                 task_cfg: TaskConfig | None = None, tool_options: ToolOptions | None = None,
                 id_prefix: Callable[[str], str] | None = None):
        self.name, self.rewards = name, rewards
        self.task_cfg, self.tool_options = task_cfg or TaskConfig(), tool_options
        self.tool_specs = tuple(tool_spec(t) for t in tools)
        tags = [t if isinstance(t, str) else t.tag for t in self.tool_specs]
        if len(set(tags)) != len(tags):
            raise ValueError(f"tools: two tools share a name or tag in {tags}")
        check_sandbox([t for t in self.tool_specs if isinstance(t, str)], tool_options)
        prefix = id_prefix or (lambda where: name)
        readers = rewards.reads_answer()
        # a prompt-only training row (TRL's habit) is fine when no reward reads a gold answer; evaluation's pass@k does
        needs = (f"the reward function {', '.join(map(repr, readers))} reads it (prompt-only rows work when no reward "
                 "function reads a gold answer)") if readers else None
        self._splits = {"train": self._examples(train_rows, "train", prefix, needs)}
        val = self._examples(eval_rows, "val", prefix, "pass@k on eval_dataset compares the final answer with it")
        self._splits.update(dev=val, test=val, val=val)
        self._tools: dict[str, Tool] | None = None

    def _examples(self, rows: list[tuple[str, dict]], split: str, prefix, answer_for: str | None) -> list[Example]:
        fmt = self.tool_options.tool_format if self.tool_options else "xml"
        return [row_to_example(row, where, f"{prefix(where)}-{split}-{i}", prefix(where), self.tool_specs, fmt,
                               answer_for) for i, (where, row) in enumerate(rows)]

    def examples(self, split: str) -> list[Example]:
        return split_examples(self.name, self._splits, split)

    def tools(self) -> dict[str, Tool]:
        if self._tools is None:
            names = tuple(t for t in self.tool_specs if isinstance(t, str))
            built = build_tools(self.task_cfg, allowed=names, options=self.tool_options)
            tools: dict[str, Tool] = {}
            for spec in self.tool_specs:
                if spec in BUILT_WITH_CONFIG:
                    tools[spec] = built[spec]
                elif isinstance(spec, str):
                    tool = get_tool(spec)
                    tools[tool.tag] = tool
                else:
                    tools[spec.tag] = spec
            self._tools = tools
        return self._tools

    def score(self, examples: list[Example], texts: list[str], token_ids: list[list[int]]
              ) -> tuple[list[float], dict[str, float]]:
        """Every reward function once over the batch; the weighted scores and ``rewards/<name>/{mean,std}``."""
        prompts = [ex.row.get("prompt", ex.question) for ex in examples]
        completions = [text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]
                       for prompt, text in zip(prompts, texts)]
        keys = list(dict.fromkeys(key for ex in examples for key in ex.row if key not in ("prompt", "completion")))
        columns = {key: [ex.row.get(key) for ex in examples] for key in keys}
        where = [f"completion {i} (row {ex.id})" for i, ex in enumerate(examples)]
        return self.rewards(prompts, completions, token_ids, columns, where)

    def reward(self, example: Example, response_text: str) -> float:
        return self.score([example], [response_text], [[]])[0][0]

    def correct(self, example: Example, response_text: str) -> bool:
        if self.rewards.binary:
            return self.reward(example, response_text) >= 1.0
        return is_exact_match(extract_answer(response_text), example.answers)

    def demonstrations(self) -> list[Demonstration]:
        return []

    def texts(self) -> list[str]:
        return [m["content"] for e in self._splits["train"] for m in e.messages] + \
               [a for e in self._splits["train"] for a in e.answers]
