"""The agent protocol (docs/algorithm.md §1.1, §3): how calls, results and answers are written.

One module for both sides of a trajectory. The rollout side is :class:`Protocol`, built from
the tools in use and a format; it gives the system-prompt line of each tool, the stop strings,
the call parser and the result wrapping. The reward side is a set of functions of the decoded
response alone (verl's ``compute_score`` knows no tools): :func:`format_error`,
:func:`tools_used` and :func:`model_text`. This module imports nothing heavy, so
``aepo_rl.rewards`` can import it when verl loads ``integrations/verl/reward.py`` by path.

Formats (``rollout.tool_format``):

- ``xml`` (the release, §1.1): the model writes ``<search>query</search>``; a round stops at
  the closing tag and the environment appends ``" <result>\\n{output}\\n</result>"``.
- ``hermes`` (chat-template models): ``<tool_call>{"name": "search", "arguments": {"query": "…"}}</tool_call>``,
  answered with ``<tool_response>…</tool_response>``, inside a user turn when the tokenizer
  speaks ChatML.

In both, ``<think>…</think>`` is free reasoning and ``<answer>\\boxed{…}</answer>`` ends the
trajectory. The last call of a segment is the one executed and an empty body ends the
trajectory (§1.1). A Hermes body that is not valid JSON, names an unknown tool or passes other
than one argument is answered with an error result, and generation continues.

A tool needs only ``name``, ``tag`` and ``description`` (see ``aepo_rl.tools.base.Tool``);
two optional attributes shape its prompt line ``<tag>argument</tag> usage``: ``argument``
(default ``"input"``) and ``usage`` (default: the description without its final period).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FORMATS = ("xml", "hermes")
THINK, RESULT, ANSWER = "think", "result", "answer"
"""The fixed grammar tags of §1.1: free reasoning, the environment's result block, the final answer."""
HERMES_CALL, HERMES_RESPONSE = "tool_call", "tool_response"
BUILTIN_CALL_TAGS = ("search", "python")
"""The release's tools (§1.1). Their tags are always calls in the format check (§3), their two
calls earn the multi-tool bonus, and they are single tokens of the tiny model."""
RESERVED_TAGS = (THINK, RESULT, ANSWER, HERMES_CALL, HERMES_RESPONSE)
"""Tags with a fixed meaning: no tool may use one."""
ANSWER_CLOSE = f"</{ANSWER}>"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
DEFAULT_ARGUMENT = "input"

_TAG_NAME = re.compile(r"[A-Za-z_][\w-]*")
_CALL_BEFORE_RESULT = re.compile(rf"</({_TAG_NAME.pattern})>\s*<{RESULT}>")
_RESULT_BLOCK = re.compile(rf"<({RESULT}|{HERMES_RESPONSE})>.*?</\1>", re.S)
_HERMES_BODY = re.compile(rf"<{HERMES_CALL}>(.*?)</{HERMES_CALL}>", re.S)


def token_tags(call_tags: tuple[str, ...] = BUILTIN_CALL_TAGS) -> list[str]:
    """Every tag of the protocol, opening then closing: the calls, result, answer, think, then the
    Hermes pair. With the default calls this is the tiny model's added-token list, in its order."""
    names = (*call_tags, RESULT, ANSWER, THINK, HERMES_CALL, HERMES_RESPONSE)
    return [tag for name in names for tag in (f"<{name}>", f"</{name}>")]


# ---------------------------------------------------------------- rollout side

@dataclass(frozen=True)
class ToolCallRequest:
    """A call parsed from one segment: run ``tools[key].run(arg)``, or report ``error``."""

    key: str | None
    """Key of the tool in the rollout's tools dict (its tag); None when the call is unusable."""
    name: str
    arg: str
    error: str | None = None
    """Why the call cannot run; its text becomes the tool result and generation continues."""


def _last_body(text: str, open_tag: str, close_tag: str) -> str:
    """Body of the last ``open…close`` pair ending at the end of ``text`` ("" if no opener)."""
    end = text.rfind(close_tag)
    start = text.rfind(open_tag, 0, end)
    return "" if start < 0 or end < 0 else text[start + len(open_tag):end].strip()


class Protocol:
    """The protocol for the tools in use (``tools``: tool by tag, as a task's ``tools()`` gives them, or a
    list of tools, as ``TreeRolloutFunc`` takes them) in format ``fmt`` ("xml" | "hermes"). Tools are read
    for ``name``, ``tag``, ``description`` and the optional ``argument`` / ``usage``; classes work as well
    as instances."""

    def __init__(self, tools: Mapping[str, Any] | Sequence[Any], fmt: str = "xml"):
        if fmt not in FORMATS:
            raise ValueError(f"unknown rollout.tool_format '{fmt}' (xml | hermes)")
        if not isinstance(tools, Mapping):
            if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
                raise TypeError(f"Protocol(tools): give a list of tools or a dict of them by tag, got "
                                f"{type(tools).__name__} (get_tool('search', ...) builds a registered one)")
            tools = {getattr(tool, "tag", None) or getattr(tool, "name", ""): tool for tool in tools}
        for key, tool in tools.items():
            if not _TAG_NAME.fullmatch(key) or key in RESERVED_TAGS:
                raise ValueError(f"tool '{getattr(tool, 'name', key)}' cannot use the tag <{key}>: a tag is a letter "
                                 f"or '_' then letters, digits, '_' or '-', and not one of {RESERVED_TAGS}")
            if getattr(tool, "tag", key) != key:
                raise ValueError(f"the tools dict keys tool '{tool.name}' as '{key}' but its tag is '{tool.tag}': "
                                 "key each tool by its tag")
        self.tools, self.fmt = dict(tools), fmt

    # -- what the model is told ---------------------------------------------------------------
    def format_call(self, key: str, arg: str) -> str:
        """The text of a call of tool ``key`` with argument ``arg``, as the model writes it."""
        if self.fmt == "xml":
            return f"<{key}>{arg}</{key}>"
        tool = self.tools[key]
        call = {"name": tool.name, "arguments": {getattr(tool, "argument", DEFAULT_ARGUMENT): arg}}
        return f"<{HERMES_CALL}>{json.dumps(call, ensure_ascii=False)}</{HERMES_CALL}>"

    @staticmethod
    def format_answer(answer: str) -> str:
        """The final answer block, ``<answer>\\boxed{answer}</answer>`` (§1.1)."""
        return f"<{ANSWER}>\\boxed{{{answer}}}</{ANSWER}>"

    def tool_line(self, key: str) -> str:
        """A tool's part of the system prompt: a sample call, then what it does (§1.1)."""
        tool = self.tools[key]
        usage = getattr(tool, "usage", None) or tool.description.strip().rstrip(".")
        return f"{self.format_call(key, getattr(tool, 'argument', DEFAULT_ARGUMENT))} {usage}"

    def system_prompt(self) -> str:
        """The short system message describing the protocol for these tools (§1.1)."""
        uses = ", ".join(self.tool_line(key) for key in self.tools)
        result = RESULT if self.fmt == "xml" else HERMES_RESPONSE
        return (f"Use tools to answer. {uses}; results come in <{result}></{result}>. "
                f"Think in <{THINK}></{THINK}> if needed. Answer as {self.format_answer('answer')}.")

    # -- the rollout's side ---------------------------------------------------------------------
    def stop_strings(self) -> tuple[str, ...]:
        """Strings that end a round: every closing call tag, and ``</answer>`` (§1.1)."""
        if self.fmt == "xml":
            return tuple(f"</{key}>" for key in self.tools) + (ANSWER_CLOSE,)
        return (f"</{HERMES_CALL}>", ANSWER_CLOSE)

    def parse_call(self, text: str, stop: str) -> ToolCallRequest | None:
        """The call closed by ``stop`` at the end of segment ``text``; None for an empty body (ends it)."""
        if self.fmt == "xml":
            key = stop[2:-1]
            body = _last_body(text, f"<{key}>", stop)
            return ToolCallRequest(key=key, name=self.tools[key].name, arg=body) if body else None
        body = _last_body(text, f"<{HERMES_CALL}>", f"</{HERMES_CALL}>")
        if not body:
            return None
        try:
            call = json.loads(body)
        except json.JSONDecodeError as err:
            error = f"Error: the tool call is not valid JSON ({err.msg} at char {err.pos})."
            return ToolCallRequest(None, "?", body, error=error)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ToolCallRequest(None, "?", body, error='Error: a tool call must be '
                                                          '{"name": ..., "arguments": {...}}.')
        name = call["name"]
        key = next((k for k, tool in self.tools.items() if name in (tool.name, k)), None)
        if key is None:
            available = ", ".join(t.name for t in self.tools.values())
            return ToolCallRequest(None, name, body, error=f"Error: unknown tool '{name}'; available: {available}.")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            arg = arguments
        elif isinstance(arguments, dict) and len(arguments) == 1:
            arg = str(next(iter(arguments.values())))
        else:
            return ToolCallRequest(key, name, body, error=f"Error: tool '{name}' takes exactly one argument.")
        return ToolCallRequest(key, name, arg.strip()) if arg.strip() else None

    def result_wrapping(self, tokenizer=None, *, chatml: bool | None = None) -> tuple[str, str]:
        """(prefix, suffix) the environment writes around a tool's output (§1.1). Hermes needs the
        ``tokenizer``: a result is a user turn when its vocabulary has the ChatML tokens (or say
        so with ``chatml``, as a teacher writing demonstrations before any tokenizer exists does)."""
        if self.fmt == "xml":
            return f" <{RESULT}>\n", f"\n</{RESULT}>"
        if chatml is None:
            if tokenizer is None:
                raise ValueError("the Hermes result wrapping depends on the tokenizer (ChatML or not): pass it")
            vocab = tokenizer.get_vocab()
            chatml = all(t in vocab for t in CHATML_TOKENS)
        open_, close = f"<{HERMES_RESPONSE}>", f"</{HERMES_RESPONSE}>"
        if chatml:
            return f"<|im_end|>\n<|im_start|>user\n{open_}\n", f"\n{close}<|im_end|>\n<|im_start|>assistant\n"
        return f"\n{open_}\n", f"\n{close}\n"

    def format_result(self, output: str, tokenizer=None, *, chatml: bool | None = None) -> str:
        """A tool result block exactly as the rollout appends it after the call (§1.1)."""
        prefix, suffix = self.result_wrapping(tokenizer, chatml=chatml)
        return f"{prefix}{output}{suffix}"


# ---------------------------------------------------------------- reward side: text alone (§3)

def model_text(text: str) -> str:
    """The response without the environment's ``<result>`` / ``<tool_response>`` blocks."""
    return _RESULT_BLOCK.sub("", text)


_ENVIRONMENT_TEXT = re.compile(rf"\s*(?:<\|im_end\|>\s*<\|im_start\|>user\s*)?<({RESULT}|{HERMES_RESPONSE})>.*?</\1>"
                               r"(?:\s*<\|im_end\|>\s*<\|im_start\|>assistant\n)?", re.S)


def split_result_blocks(text: str) -> list[tuple[str, bool]]:
    """``text`` cut in order into non-empty pieces, each with whether the environment wrote it: a
    ``<result>…</result>`` or ``<tool_response>…</tool_response>`` block with the whitespace before it
    and, around a Hermes result, the ChatML turn markers (:meth:`Protocol.result_wrapping`); else the model."""
    pieces, pos = [], 0
    for block in _ENVIRONMENT_TEXT.finditer(text):
        pieces += [(text[pos:block.start()], False), (block.group(0), True)]
        pos = block.end()
    pieces.append((text[pos:], False))
    return [(piece, is_result) for piece, is_result in pieces if piece]


def answered_in_hermes(text: str) -> bool:
    """The environment answered a call with a ``<tool_response>`` block (``rollout.tool_format=hermes``);
    only then do Hermes tags count, elsewhere ``<tool_call>`` is plain text as in the release."""
    return f"<{HERMES_RESPONSE}>" in text


def xml_call_tags(text: str) -> tuple[str, ...]:
    """The XML call tags of a response: the built-in ones (search, python), then, in order of first
    appearance, every other tag whose closing tag is followed (after whitespace) by a ``<result>``
    block, since the environment writes a result only after a call. Reserved tags never are."""
    found = (m.group(1) for m in _CALL_BEFORE_RESULT.finditer(text))
    extra = (tag for tag in found if tag not in RESERVED_TAGS and tag not in BUILTIN_CALL_TAGS)
    return BUILTIN_CALL_TAGS + tuple(dict.fromkeys(extra))


def tools_used(text: str) -> set[str]:
    """The tools the model called: XML call tags (:func:`xml_call_tags`) closed in its own text
    and, in a Hermes response, the ``name`` of each ``<tool_call>`` whose body is a JSON object."""
    own = model_text(text)
    used = {tag for tag in xml_call_tags(text) if f"</{tag}>" in own}
    if not answered_in_hermes(text):
        return used
    for body in _HERMES_BODY.findall(own):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            used.add(call["name"])
    return used


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` in ``text`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def answer_block(text: str) -> str | None:
    """Body of the last ``<answer>…</answer>`` block, or None."""
    blocks = re.findall(rf"<{ANSWER}>(.*?)</{ANSWER}>", text, re.S)
    return blocks[-1] if blocks else None


def format_error(text: str) -> str | None:
    """Why the response breaks the §3 format, or None when it is well formed.

    Rules: balanced ``<think>`` tags; every call tag (:func:`xml_call_tags`) followed, in order,
    by its closing tag and a ``<result>…</result>`` block (a Hermes ``<tool_call>``: by
    ``</tool_call>`` and a ``<tool_response>…</tool_response>`` block); exactly one ``<answer>``
    block holding a ``\\boxed{}``. Tags inside a call, an answer or a result block are not
    checked; other tags are plain text. Hermes tags count only in a response the environment
    answered with ``<tool_response>`` blocks; elsewhere ``<tool_call>`` is plain text, as in the
    release's check.
    """
    calls = xml_call_tags(text)
    hermes = (HERMES_CALL, HERMES_RESPONSE) if answered_in_hermes(text) else ()
    tags = re.compile(rf"</?({'|'.join(map(re.escape, (THINK, *calls, RESULT, ANSWER, *hermes)))})>")
    answers, think_depth, pos = 0, 0, 0
    while (m := tags.search(text, pos)) is not None:
        tag, name, pos = m.group(0), m.group(1), m.end()
        if tag == f"<{THINK}>":
            think_depth += 1
        elif tag == f"</{THINK}>":
            think_depth -= 1
            if think_depth < 0:
                return f"</{THINK}> without <{THINK}>"
        elif tag == f"<{name}>" and name in (*calls, HERMES_CALL, ANSWER):
            close = f"</{name}>"
            end = text.find(close, pos)  # the body (code, query, answer) is not parsed for tags
            if end < 0:
                return f"missing {close}"
            pos = end + len(close)
            if name == ANSWER:
                answers += 1
                continue
            result = f"<{HERMES_RESPONSE if name == HERMES_CALL else RESULT}>"
            following = tags.search(text, pos)
            if following is None or following.group(0) != result:
                return f"expected {result} after {close} but found {following.group(0) if following else 'nothing'}"
            closing = result.replace("<", "</")
            end = text.find(closing, following.end())
            if end < 0:
                return f"unclosed {result} block"
            pos = end + len(closing)
        else:
            return f"unexpected {tag}"
    if think_depth != 0:
        return f"unbalanced <{THINK}> tags"
    if answers != 1:
        return f"{answers} <{ANSWER}> blocks (exactly one required)"
    if last_boxed(answer_block(model_text(text)) or "") is None:
        return "no \\boxed{} in the answer"
    return None
