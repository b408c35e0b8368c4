"""Your own demonstrations for cold-start SFT (docs/training.md, "SFT on your own demonstrations").

The rows of JSONL, JSON-array or parquet files (``sft.data``) or of a dataset
(``AEPOTrainer(sft_dataset=...)``) are demonstrations in one of three layouts, detected row by row:

- ``messages``: chat messages, roles system / user / assistant / tool. An assistant calls a tool in the
  protocol's own text (``<search>query</search>``; ``<tool_call>{…}</tool_call>`` with
  ``rollout.tool_format=hermes``) or with OpenAI / Hermes ``tool_calls``
  (``[{"function": {"name": …, "arguments": …}}]``); the next ``tool`` message is each call's result, in order.
  Result blocks already in an assistant's text (``<result>…</result>``) are results too.
- ``conversations``: ShareGPT / LLaMA-Factory turns ``{"from", "value"}``, ``from`` one of system, human,
  gpt, function_call (its value a JSON ``{"name", "arguments"}`` or a list of them) and observation (the
  result); a top-level ``system`` field is the system message.
- ``prompt`` and ``completion`` (TRL): each a string or a list of messages.

A demonstration becomes the protocol's turns (§1.1) as a rollout writes them. The prompt is every
message up to the last user message (the messages of a TRL ``prompt``), given the protocol's system
message for the task's tools when it has none; the response is one assistant turn in which the
model's text and calls are trained, and every tool result, wrapped as the environment wraps it, is
not (loss mask 0). Calls are written in ``rollout.tool_format``, so one file serves both formats. A
call passes one argument (§1.1). Every mistake is a :class:`~aepo_rl.tasks.dataset.DatasetError`
naming the file, the row and the message, raised when the data is read, before any model is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aepo_rl.config import Config, ConfigError
from aepo_rl.jsonl import JsonlError, read_jsonl
from aepo_rl.protocol import ANSWER_CLOSE, DEFAULT_ARGUMENT, HERMES_CALL, RESERVED_TAGS, Protocol, split_result_blocks
from aepo_rl.tasks.base import Demonstration, Example
from aepo_rl.tasks.dataset import DatasetError, dataset_rows
from aepo_rl.tasks.loaders import read_rows

LAYOUTS = ("'messages' (chat messages), 'conversations' (ShareGPT / LLaMA-Factory) or 'prompt' and "
           "'completion' (TRL)")
"""The accepted row layouts, as error messages name them."""
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "function_call": "assistant", "observation": "tool", "tool": "tool"}
"""ShareGPT's ``from`` → the chat role (LLaMA-Factory's tags, and the chat names)."""
_ENDS_WITH_TAG = re.compile(r"</([A-Za-z_][\w-]*)>\s*$")
_HERMES_CALL = re.compile(rf"<{HERMES_CALL}>(.*?)</{HERMES_CALL}>", re.S)


@dataclass(frozen=True)
class Step:
    """One piece of a response: ``text`` (the model's, trained), ``call`` (tool ``tool`` with argument
    ``text``, written in the protocol's format, trained), ``result`` (a tool's output, wrapped as the
    environment wraps it, not trained) or ``block`` (a result block already wrapped, not trained)."""

    kind: str
    text: str
    tool: str = ""
    origin: str = ""
    """Where a call was written (``file:line: assistant message 3``), for errors."""


@dataclass(frozen=True)
class UserDemonstration:
    """One demonstration as read: ``prompt`` messages ({role, content}) and the response's steps."""

    where: str
    prompt: list[dict[str, str]]
    steps: list[Step]
    text_calls: list[tuple[str, str]] = field(default_factory=list)
    """(tool, where) of each call written in an assistant's text (``<search>…</search>``), for
    :meth:`SFTData.check_tools`."""

    def calls(self) -> list[Step]:
        return [step for step in self.steps if step.kind == "call"]

    def answered(self) -> bool:
        """The response writes an ``<answer>`` block (the rewards of §3 read the answer from one)."""
        return any(step.kind == "text" and ANSWER_CLOSE in step.text for step in self.steps)

    def demonstration(self, protocol: Protocol, tokenizer, index: int) -> Demonstration:
        """The demonstration in ``protocol``'s format, its Hermes results wrapped for ``tokenizer`` (a ChatML
        user turn when it speaks ChatML, as the rollout writes them); a model piece after another piece starts
        with a space unless one side has whitespace there, and a call's argument and a ``\\boxed{}`` answer
        start with one (:func:`spaced_values`), as the teacher's demonstrations do."""
        prompt = self.prompt
        if prompt[0]["role"] != "system":
            prompt = [{"role": "system", "content": protocol.system_prompt()}, *prompt]
        pieces: list[tuple[str, bool]] = []
        for step in self.steps:
            if step.kind == "call":
                key = tool_key(protocol, step.tool)
                text = protocol.format_call(key, spaced_argument(protocol.tools[key], step.text))
            elif step.kind == "result":
                text = protocol.format_result(step.text, tokenizer)
            elif step.kind == "text":
                text = spaced_values(protocol, step.text)
            else:
                text = step.text
            trained = step.kind in ("text", "call")
            if trained and pieces and not text[:1].isspace() and not pieces[-1][0][-1:].isspace():
                text = " " + text
            pieces.append((text, trained))
        question = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
        example = Example(id=f"sft-{index}", question=question, answers=[], data_source="sft", messages=prompt)
        return Demonstration(example, pieces)


CODE_ARGUMENT = "code"
"""A tool whose argument is named this (the python tool's) takes code, written as given."""
_BOXED = re.compile(r"\\boxed\{(?=[^\s}])")


def spaced_argument(tool, arg: str) -> str:
    """``arg`` after a space, as in running text, unless it starts with whitespace or is code (a tool whose
    argument is :data:`CODE_ARGUMENT`): a value copied from the question or a result is then the same
    tokens there and in the call (" Vela" both times, not "Vela"). The rollout strips a call's argument."""
    if not arg or arg[:1].isspace() or getattr(tool, "argument", DEFAULT_ARGUMENT) == CODE_ARGUMENT:
        return arg
    return " " + arg


def spaced_values(protocol: Protocol, text: str) -> str:
    """An assistant's ``text`` with each copied value after a space, as the synthetic teacher writes it and as
    the value reads in running text: the argument of a call written in the text (``<search>Vela Korr</search>``
    → ``<search> Vela Korr</search>``; a Hermes ``<tool_call>`` rewritten by ``protocol``) and each
    ``\\boxed{…}`` answer (``\\boxed{ Vela Korr}``; the answer check strips it). Code is left as written."""
    text = _BOXED.sub(lambda m: m.group(0) + " ", text)
    if protocol.fmt == "xml":
        keys = [key for key, tool in protocol.tools.items() if getattr(tool, "argument", None) != CODE_ARGUMENT]
        if not keys:
            return text
        calls = re.compile(rf"<({'|'.join(map(re.escape, keys))})>(?=[^\s<])")
        return calls.sub(lambda m: m.group(0) + " ", text)

    def hermes(match: re.Match) -> str:
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        arguments = call.get("arguments") if isinstance(call, dict) else None
        key = tool_key(protocol, call.get("name")) if isinstance(arguments, dict) and len(arguments) == 1 else None
        value = next(iter(arguments.values())) if key else None
        if not isinstance(value, str):
            return match.group(0)
        return protocol.format_call(key, spaced_argument(protocol.tools[key], value))

    return _HERMES_CALL.sub(hermes, text)


def tool_key(protocol: Protocol, name: str) -> str | None:
    """The tag of the tool called ``name`` (its name or its tag) in ``protocol``, or None."""
    return next((key for key, tool in protocol.tools.items() if name in (tool.name, key)), None)


@dataclass
class SFTData:
    """The demonstrations of files or a dataset, read and checked; ``source`` names them."""

    demos: list[UserDemonstration]
    source: str

    @classmethod
    def from_files(cls, paths: list[str], fmt: str = "xml") -> SFTData:
        """Every row of ``paths``: ``.jsonl`` (one object per line), ``.json`` (an array of objects, or JSON
        Lines) or ``.parquet``; ``fmt`` is ``rollout.tool_format``, which calls written as text must use."""
        return cls([parse_row(row, where, fmt) for path in paths for where, row in read_file(path)], ", ".join(paths))

    @classmethod
    def from_rows(cls, rows: list[tuple[str, dict]], source: str, fmt: str = "xml") -> SFTData:
        """``(where, row)`` pairs, e.g. :func:`aepo_rl.tasks.dataset.dataset_rows` of a ``datasets.Dataset``."""
        return cls([parse_row(row, where, fmt) for where, row in rows], source)

    def check_tools(self, protocol: Protocol) -> None:
        """Every ``tool_calls`` / ``function_call`` call names one of ``protocol``'s tools (the task's, which its
        rollouts can run), and so does every call written in an assistant's text; raises DatasetError naming the
        first that does not."""
        for demo in self.demos:
            for name, origin in [(call.tool, call.origin) for call in demo.calls()] + demo.text_calls:
                if tool_key(protocol, name) is None:
                    names = ", ".join(tool.name for tool in protocol.tools.values())
                    raise DatasetError(f"{origin} calls the tool {name!r}, which the task does not have "
                                       f"(its tools: {names}): rename the call to one of them, or give the task "
                                       "that tool (AEPOTrainer(tools=[...]), docs/python-api.md)")

    def unanswered(self) -> list[str]:
        """Where the demonstrations without an ``<answer>`` block are."""
        return [demo.where for demo in self.demos if not demo.answered()]

    def demonstrations(self, protocol: Protocol, tokenizer) -> list[Demonstration]:
        return [demo.demonstration(protocol, tokenizer, i) for i, demo in enumerate(self.demos)]

    def texts(self) -> list[str]:
        """Every prompt message and response piece, as written in the rows."""
        return [m["content"] for demo in self.demos for m in demo.prompt] + \
               [step.text for demo in self.demos for step in demo.steps]

    def with_texts(self, task) -> TextsOf:
        """``task`` as ``load_policy`` reads it, its ``texts()`` with these demonstrations' added: the tiny
        model's tokenizer learns their words too."""
        return TextsOf(task, self.texts())


@dataclass(frozen=True)
class TextsOf:
    """A task's text and more: what the tiny model's tokenizer trains on (``load_policy`` reads only ``texts()``)."""

    task: Any
    extra: list[str]

    def texts(self) -> list[str]:
        return [*self.task.texts(), *self.extra]


def load_sft_data(cfg: Config, dataset: Any = None) -> SFTData | None:
    """The user's demonstrations: the rows of ``dataset`` (``AEPOTrainer(sft_dataset=...)``, a
    ``datasets.Dataset`` or a list of dicts) or of the files ``sft.data``, read and checked now, before
    any model is built; None when neither is given (SFT trains on the task's own demonstrations)."""
    if dataset is not None and cfg.sft.data:
        raise ConfigError(f"sft_dataset and sft.data={cfg.sft.data} both give demonstrations: keep one")
    if dataset is None and not cfg.sft.data:
        return None
    if cfg.sft.epochs == 0:
        raise ConfigError("demonstrations are given (sft.data or sft_dataset) but sft.epochs=0 skips SFT: set "
                          "sft.epochs >= 1, or leave the demonstrations out")
    fmt = cfg.rollout.tool_format
    if dataset is None:
        return SFTData.from_files(cfg.sft.data, fmt)
    return SFTData.from_rows(dataset_rows(dataset, "sft_dataset"), "sft_dataset", fmt)


# ---------------------------------------------------------------- reading files

def read_file(path: str | Path) -> list[tuple[str, dict]]:
    """``(where, row)`` of each row of a demonstrations file; ``where`` is ``file:line`` (JSONL) or
    ``file row i`` (a JSON array, parquet), counted from 1."""
    path = Path(path)
    if path.suffix == ".parquet" or not path.is_file():
        return _named_rows(read_rows(path), path)
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        return _named_rows([], path)
    if path.suffix != ".json":
        return _named_rows(read_rows(path), path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":  # more than one value: JSON Lines in a .json file
            raise DatasetError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
        try:
            return _named_rows([(f"{path}:{line}", row) for line, row in read_jsonl(path)], path)
        except JsonlError as jsonl_err:
            raise DatasetError(str(jsonl_err)) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON array of demonstrations (objects), got {type(data).__name__}")
    rows = []
    for i, row in enumerate(data, start=1):
        if not isinstance(row, dict):
            raise DatasetError(f"{path} row {i}: expected a JSON object, got {type(row).__name__}")
        rows.append((f"{path} row {i}", row))
    return _named_rows(rows, path)


def _named_rows(rows: list[tuple[str, dict]], path: Path) -> list[tuple[str, dict]]:
    if not rows:
        raise DatasetError(f"{path} has no demonstrations: give one per line (JSONL) or a JSON array of them")
    return rows


# ---------------------------------------------------------------- one row

@dataclass(frozen=True)
class _Message:
    role: str
    content: str
    calls: list[tuple[str, str]]
    """(tool name, its one argument) of each structured call."""
    label: str
    """How errors name it: ``assistant message 3``, ``observation turn 4``, ``completion message 1``."""


def parse_row(row: Mapping, where: str, fmt: str = "xml") -> UserDemonstration:
    """One row in any of the three layouts (:data:`LAYOUTS`); ``where`` names the file and row."""
    if "messages" in row:
        messages = _chat(row["messages"], where, "messages", "message")
        return _split_at_last_user(messages, where, fmt)
    if "conversations" in row:
        return _split_at_last_user(_sharegpt(row, where), where, fmt)
    if "prompt" in row and "completion" in row:
        if isinstance(row["prompt"], str):
            prompt = [_Message("user", row["prompt"], [], "prompt")]
        else:
            prompt = _chat(row["prompt"], where, "prompt", "prompt message")
        if isinstance(row["completion"], str):
            completion = [_Message("assistant", row["completion"], [], "completion")]
        else:
            completion = _chat(row["completion"], where, "completion", "completion message")
        return _demonstration(prompt, completion, where, fmt)
    hint = ""
    if "prompt" in row:
        hint = ("; a row with a 'prompt' and no 'completion' is a question for RL: give it as RL data "
                "(task.train_files, or AEPOTrainer(train_dataset=...))")
    elif "question" in row:
        hint = "; a 'question' row is RL data: give it as task.train_files or AEPOTrainer(train_dataset=...)"
    keys = ", ".join(map(repr, row)) or "none"
    raise DatasetError(f"{where}: unknown demonstration format (the row's fields: {keys}); accepted: {LAYOUTS}{hint}")


def _content(value: Any, where: str) -> str:
    """A message's text: a string, null (an assistant that only calls tools) or a list of text parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise DatasetError(f"{where}: the content must be a string or a list of {{\"type\": \"text\", \"text\": ...}} "
                       f"parts, got {type(value).__name__}")


def _argument(arguments: Any, where: str) -> str:
    """The one argument of a call: an object with one key, or its JSON text (OpenAI's ``arguments``)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: 'arguments' is not valid JSON ({err.msg} at column {err.colno}: "
                               f"{_clip(arguments)}); write it as the JSON text of an object, e.g. "
                               '{"query": "…"} (a truncated export often drops the closing brace)') from None
        if not isinstance(arguments, Mapping):
            raise DatasetError(f"{where}: 'arguments' is JSON {type(arguments).__name__} "
                               f"{_clip(json.dumps(arguments))},"
                               ' not an object; give the argument by name, e.g. {"query": "…"}')
    if not isinstance(arguments, Mapping) or len(arguments) != 1:
        count = f"{len(arguments)} arguments" if isinstance(arguments, Mapping) else type(arguments).__name__
        raise DatasetError(f"{where}: 'arguments' has {count}; a protocol call passes exactly one (§1.1), "
                           'e.g. {"query": "…"}')
    value = next(iter(arguments.values()))
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _clip(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _calls(value: Any, where: str) -> list[tuple[str, str]]:
    """(name, argument) of each OpenAI / Hermes call: ``{"function": {"name", "arguments"}}`` or
    ``{"name", "arguments"}``."""
    if not isinstance(value, list):
        value = [value]
    calls = []
    for j, call in enumerate(value):
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"]:
            raise DatasetError(f"{where}: tool call {j + 1} must be {{\"function\": {{\"name\": ..., \"arguments\": "
                               "...}} (or {\"name\": ..., \"arguments\": ...})")
        calls.append((function["name"], _argument(function.get("arguments", {}), f"{where}: tool call {j + 1}")))
    return calls


def _chat(messages: Any, where: str, field: str, noun: str) -> list[_Message]:
    """Chat messages ``{role, content, tool_calls?}``; ``noun`` names one in errors (``message``)."""
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: '{field}' must be a non-empty list of {{\"role\", \"content\"}} messages")
    out = []
    for i, m in enumerate(messages, start=1):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise DatasetError(f"{where}: {noun} {i} must be an object with a 'role' and a 'content'")
        role = m["role"]
        label = f"{role} {noun} {i}"
        if role not in ROLES:
            raise DatasetError(f"{where}: {noun} {i} has the role {role!r}; roles: {', '.join(ROLES)}")
        calls = _calls(m["tool_calls"], f"{where}: {label}") if m.get("tool_calls") else []
        if calls and role != "assistant":
            raise DatasetError(f"{where}: {label} has tool_calls; only an assistant message calls tools")
        content = _content(m.get("content"), f"{where}: {label}")
        if role == "tool":
            _check_result(content, m.get("content") is None, f"{where}: {label}", "'content'")
        out.append(_Message(role, content, calls, label))
    return out


def _check_result(content: str, missing: bool, where: str, field: str) -> None:
    """A tool result has text: a missing or empty one would train the model on a result the tool never gave."""
    if missing or not content.strip():
        state = f"no {field}" if missing else f"an empty {field}"
        raise DatasetError(f"{where} has {state}: a tool result is the text the tool returned; write it in "
                           f"{field} (a tool that returned nothing: say so, e.g. \"(no output)\"), or drop the "
                           "call and its result from the row")


def _sharegpt(row: Mapping, where: str) -> list[_Message]:
    """ShareGPT / LLaMA-Factory turns (or chat messages under ``conversations``) as messages."""
    turns = row["conversations"]
    if isinstance(turns, list) and turns and all(isinstance(t, Mapping) and "role" in t for t in turns):
        return _chat(turns, where, "conversations", "message")
    if not isinstance(turns, list) or not turns:
        raise DatasetError(f"{where}: 'conversations' must be a non-empty list of {{\"from\", \"value\"}} turns")
    out = ([_Message("system", _content(row["system"], f"{where}: 'system'"), [], "'system'")] if row.get("system")
           else [])
    for i, turn in enumerate(turns, start=1):
        if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
            raise DatasetError(f"{where}: conversations turn {i} must be an object with 'from' and 'value'")
        source = turn["from"]
        if source not in SHAREGPT_ROLES:
            raise DatasetError(f"{where}: conversations turn {i} is from {source!r}; accepted: "
                               f"{', '.join(SHAREGPT_ROLES)}")
        label = f"{source} turn {i}"
        value = _content(turn["value"], f"{where}: {label}")
        if SHAREGPT_ROLES[source] == "tool":
            _check_result(value, turn["value"] is None, f"{where}: {label}", "'value'")
        if source != "function_call":
            out.append(_Message(SHAREGPT_ROLES[source], value, [], label))
            continue
        try:
            call = json.loads(value)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: {label}: the value is not JSON ({err.msg}); it is "
                               '{"name": ..., "arguments": {...}} or a list of them') from None
        out.append(_Message("assistant", "", _calls(call, f"{where}: {label}"), label))
    return out


def _split_at_last_user(messages: list[_Message], where: str, fmt: str) -> UserDemonstration:
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
    if last_user is None:
        raise DatasetError(f"{where}: no user message; a demonstration answers a user's question")
    return _demonstration(messages[:last_user + 1], messages[last_user + 1:], where, fmt)


def _text_call(message: _Message, where: str, fmt: str) -> str | None:
    """The tool called at the end of ``message``'s text, when it ends with a call written in the protocol
    (``…</search>``: ``search``), else None; a call in the other format than ``fmt`` is an error, as the
    rollout would not run it, and so is a Hermes call whose JSON is broken."""
    end = _ENDS_WITH_TAG.search(message.content)
    if end is None or (end.group(1) in RESERVED_TAGS and end.group(1) != HERMES_CALL):
        return None
    hermes = end.group(1) == HERMES_CALL
    if hermes != (fmt == "hermes"):
        written = "a Hermes <tool_call>" if hermes else f"an XML call <{end.group(1)}>…</{end.group(1)}>"
        other = "hermes" if hermes else "xml"
        raise DatasetError(f"{where}: {message.label} writes {written} but rollout.tool_format={fmt}: set "
                           f"rollout.tool_format={other}, or give the call as tool_calls (written in either format)")
    if not hermes:
        return end.group(1)
    body = message.content[:end.start()].rsplit(f"<{HERMES_CALL}>", 1)[-1]
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{where}: {message.label}: its <{HERMES_CALL}> is not valid JSON ({err.msg}: "
                           f"{_clip(body)}); "
                           'write {"name": ..., "arguments": {...}}') from None
    return _calls(call, f"{where}: {message.label}")[0][0]


def _demonstration(prompt: list[_Message], response: list[_Message], where: str, fmt: str) -> UserDemonstration:
    """The prompt's messages and the response's steps; each call is answered by the next tool message."""
    for m in prompt:
        if m.role == "tool" or m.calls:
            raise DatasetError(f"{where}: {m.label} is a tool call or result before the last user message; only the "
                               "reply to the last user message calls tools (one question per row: split a chat of "
                               "several questions into rows)")
    if not any(m.role == "user" for m in prompt):
        raise DatasetError(f"{where}: the prompt has no user message; a demonstration answers a user's question")
    if not response:
        raise DatasetError(f"{where}: no assistant message after the last user message; the reply is what SFT trains")
    if response[0].role != "assistant":
        raise DatasetError(f"{where}: {response[0].label} follows the last user message; the reply starts with "
                           "an assistant message")
    steps: list[Step] = []
    caller: _Message = response[0]
    pending: list[Step | None] = []  # the caller's calls awaiting their result, in order; None: a call in its text
    answered = 0
    text_calls: list[tuple[str, str]] = []
    for m in response:
        if m.role == "assistant":
            if pending:
                break
            if not m.content.strip() and not m.calls:
                raise DatasetError(f"{where}: {m.label} is empty (no text and no tool_calls), and the reply "
                                   "is what SFT trains: write what the assistant said, or drop the message")
            steps += [Step("block" if block else "text", piece) for piece, block in split_result_blocks(m.content)]
            pending = [Step("call", arg, name, f"{where}: {m.label}") for name, arg in m.calls]
            called = _text_call(m, where, fmt)
            if called is not None:
                if pending:
                    raise DatasetError(f"{where}: {m.label} has tool_calls and its text ends with a call too: give "
                                       "each call one way")
                pending = [None]
                text_calls.append((called, f"{where}: {m.label}"))
            caller, answered = m, 0
        elif m.role == "tool":
            if not pending:
                raise DatasetError(f"{where}: {m.label} answers no call: {caller.label} before it has no tool_calls "
                                   "and its text does not end with a call such as <search>…</search>")
            call = pending.pop(0)
            steps += [call] if call else []
            steps.append(Step("result", m.content))
            answered += 1
        else:
            raise DatasetError(f"{where}: {m.label} comes after the reply started; only assistant and tool "
                               "messages follow the last user message")
    if pending:
        calls = ("a call" if not caller.calls else "tool_calls" if len(caller.calls) == 1
                 else f"{len(caller.calls)} tool_calls")
        found = f"only {answered} following tool messages" if answered else "no following tool message"
        raise DatasetError(f"{where}: {caller.label} has {calls} but {found} (each call is answered by the next "
                           "tool message, in order)")
    if response[-1].role != "assistant":
        raise DatasetError(f"{where}: the reply ends with {response[-1].label}, a tool result; end it with the "
                           "assistant's answer")
    return UserDemonstration(where, [{"role": m.role, "content": m.content} for m in prompt], steps, text_calls)
