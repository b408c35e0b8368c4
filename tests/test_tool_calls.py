"""Parsing tool calls in both formats and the result wrapping (§1.1)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from aepo_rl.rollout.tool_calls import parse_tool_call, result_wrapping, stop_strings


@dataclass
class Named:
    name: str
    tag: str
    description: str = ""

    def run(self, arg):
        return arg


TOOLS = {"search": Named("search", "search"), "python": Named("python", "python")}


def test_stop_strings():
    assert stop_strings("xml", TOOLS) == ("</search>", "</python>", "</answer>")
    assert stop_strings("hermes", TOOLS) == ("</tool_call>", "</answer>")
    with pytest.raises(ValueError, match="tool_format"):
        stop_strings("json", TOOLS)


def test_xml_takes_the_last_tag_body():
    text = "<think>hm</think> <search>old</search> then <search>  Velmora founder \n</search>"
    req = parse_tool_call(text, "</search>", "xml", TOOLS)
    assert (req.key, req.name, req.arg, req.error) == ("search", "search", "Velmora founder", None)
    code = parse_tool_call("<python>print(1)\nprint(2)</python>", "</python>", "xml", TOOLS)
    assert code.arg == "print(1)\nprint(2)"


@pytest.mark.parametrize("text", ["<search></search>", "<search>  \n </search>", "no opener</search>"])
def test_xml_empty_or_orphan_close_is_empty(text):
    assert parse_tool_call(text, "</search>", "xml", TOOLS) is None


def test_hermes_valid_calls():
    req = parse_tool_call('x <tool_call>{"name": "search", "arguments": {"query": "capital of Oz"}}</tool_call>',
                          "</tool_call>", "hermes", TOOLS)
    assert (req.key, req.name, req.arg, req.error) == ("search", "search", "capital of Oz", None)
    text = '<tool_call>{"name": "python", "arguments": "print(2)"}</tool_call>'
    req = parse_tool_call(text, "</tool_call>", "hermes", TOOLS)
    assert (req.key, req.arg) == ("python", "print(2)")


@pytest.mark.parametrize("body, message", [
    ('{"name": "search", "arguments": {"query": "a"', "Error: the tool call is not valid JSON"),
    ('[1, 2]', 'Error: a tool call must be {"name": ..., "arguments": {...}}.'),
    ('{"name": "browse", "arguments": {"url": "x"}}', "Error: unknown tool 'browse'; available: search, python."),
    ('{"name": "search", "arguments": {"query": "a", "k": 3}}', "Error: tool 'search' takes exactly one argument."),
])
def test_hermes_garbage_becomes_an_error_result(body, message):
    req = parse_tool_call(f"<tool_call>{body}</tool_call>", "</tool_call>", "hermes", TOOLS)
    assert req.error.startswith(message)


@pytest.mark.parametrize("text", ["<tool_call> </tool_call>", "</tool_call>",
                                  '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>'])
def test_hermes_empty_is_empty(text):
    assert parse_tool_call(text, "</tool_call>", "hermes", TOOLS) is None


def test_result_wrapping(tiny_tokenizer):
    assert result_wrapping("xml", tiny_tokenizer) == (" <result>\n", "\n</result>")
    prefix, suffix = result_wrapping("hermes", tiny_tokenizer)  # the tiny tokenizer speaks ChatML
    assert prefix == "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    assert suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    class Plain:
        def get_vocab(self):
            return {"a": 0}

    assert result_wrapping("hermes", Plain()) == ("\n<tool_response>\n", "\n</tool_response>\n")
