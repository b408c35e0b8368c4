"""Tool calls in model text: the release's XML tags or Hermes ``<tool_call>`` JSON (§1.1).

XML (release): the model writes ``<search>query</search>`` or ``<python>code</python>``; a
round stops at the closing tag and the environment appends ``" <result>\\n{output}\\n</result>"``.
Hermes (chat-template models): ``<tool_call>{"name": "search", "arguments": {"query": "…"}}</tool_call>``;
the result comes back as ``<tool_response>…</tool_response>``, inside a user turn when the
tokenizer speaks ChatML. In both formats ``<answer>…</answer>`` ends the trajectory, the last
call of a segment is the one executed, and an empty body ends the trajectory (§1.1). A
Hermes body that is not valid JSON, names an unknown tool or passes other than one argument
is answered with an error result, and generation continues.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from aepo_rl.tools.base import Tool

ANSWER_CLOSE = "</answer>"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class ToolCallRequest:
    """A call parsed from one segment: run ``tools[key].run(arg)``, or report ``error``."""

    key: str | None
    """Key of the tool in the rollout's tools dict (its tag); None when the call is unusable."""
    name: str
    arg: str
    error: str | None = None
    """Why the call cannot run; its text becomes the tool result and generation continues."""


def stop_strings(fmt: str, tools: dict[str, Tool]) -> tuple[str, ...]:
    """Strings that end a round: every closing call tag, and ``</answer>``."""
    if fmt == "xml":
        return tuple(f"</{tag}>" for tag in tools) + (ANSWER_CLOSE,)
    if fmt == "hermes":
        return (HERMES_CLOSE, ANSWER_CLOSE)
    raise ValueError(f"unknown rollout.tool_format '{fmt}' (xml | hermes)")


def _last_body(text: str, open_tag: str, close_tag: str) -> str:
    """Body of the last ``open…close`` pair ending at the end of ``text`` ("" if no opener)."""
    end = text.rfind(close_tag)
    start = text.rfind(open_tag, 0, end)
    return "" if start < 0 or end < 0 else text[start + len(open_tag):end].strip()


def parse_tool_call(text: str, stop: str, fmt: str, tools: dict[str, Tool]) -> ToolCallRequest | None:
    """The call closed by ``stop`` at the end of segment ``text``; None for an empty body (ends it)."""
    if fmt == "xml":
        tag = stop[2:-1]
        body = _last_body(text, f"<{tag}>", stop)
        return ToolCallRequest(key=tag, name=tools[tag].name, arg=body) if body else None
    body = _last_body(text, HERMES_OPEN, HERMES_CLOSE)
    if not body:
        return None
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        error = f"Error: the tool call is not valid JSON ({err.msg} at char {err.pos})."
        return ToolCallRequest(None, "?", body, error=error)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCallRequest(None, "?", body, error='Error: a tool call must be {"name": ..., "arguments": {...}}.')
    name = call["name"]
    key = next((k for k, tool in tools.items() if name in (tool.name, k)), None)
    if key is None:
        available = ", ".join(t.name for t in tools.values())
        return ToolCallRequest(None, name, body, error=f"Error: unknown tool '{name}'; available: {available}.")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        arg = arguments
    elif isinstance(arguments, dict) and len(arguments) == 1:
        arg = str(next(iter(arguments.values())))
    else:
        return ToolCallRequest(key, name, body, error=f"Error: tool '{name}' takes exactly one argument.")
    return ToolCallRequest(key, name, arg.strip()) if arg.strip() else None


def result_wrapping(fmt: str, tokenizer) -> tuple[str, str]:
    """(prefix, suffix) the environment writes around a tool's output (§1.1)."""
    if fmt == "xml":
        return " <result>\n", "\n</result>"
    vocab = tokenizer.get_vocab()
    if all(t in vocab for t in CHATML_TOKENS):
        return ("<|im_end|>\n<|im_start|>user\n<tool_response>\n",
                "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    return "\n<tool_response>\n", "\n</tool_response>\n"
