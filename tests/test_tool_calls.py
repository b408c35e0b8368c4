"""The rollout side of the protocol: stop strings, parsing calls in both formats, the result wrapping (§1.1)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from aepo_rl.protocol import Protocol


@dataclass
class Named:
    name: str
    tag: str
    description: str = ""

    def run(self, arg):
        return arg


TOOLS = {"search": Named("search", "search"), "python": Named("python", "python")}
XML, HERMES = Protocol(TOOLS, "xml"), Protocol(TOOLS, "hermes")


def test_stop_strings():
    assert XML.stop_strings() == ("</search>", "</python>", "</answer>")
    assert HERMES.stop_strings() == ("</tool_call>", "</answer>")
    with pytest.raises(ValueError, match="tool_format"):
        Protocol(TOOLS, "json")


def test_xml_takes_the_last_tag_body():
    text = "<think>hm</think> <search>old</search> then <search>  Velmora founder \n</search>"
    req = XML.parse_call(text, "</search>")
    assert (req.key, req.name, req.arg, req.error) == ("search", "search", "Velmora founder", None)
    code = XML.parse_call("<python>print(1)\nprint(2)</python>", "</python>")
    assert code.arg == "print(1)\nprint(2)"


@pytest.mark.parametrize("text", ["<search></search>", "<search>  \n </search>", "no opener</search>"])
def test_xml_empty_or_orphan_close_is_empty(text):
    assert XML.parse_call(text, "</search>") is None


def test_hermes_valid_calls():
    req = HERMES.parse_call('x <tool_call>{"name": "search", "arguments": {"query": "capital of Oz"}}</tool_call>',
                            "</tool_call>")
    assert (req.key, req.name, req.arg, req.error) == ("search", "search", "capital of Oz", None)
    text = '<tool_call>{"name": "python", "arguments": "print(2)"}</tool_call>'
    req = HERMES.parse_call(text, "</tool_call>")
    assert (req.key, req.arg) == ("python", "print(2)")


@pytest.mark.parametrize("body, message", [
    ('{"name": "search", "arguments": {"query": "a"', "Error: the tool call is not valid JSON"),
    ('[1, 2]', 'Error: a tool call must be {"name": ..., "arguments": {...}}.'),
    ('{"name": "browse", "arguments": {"url": "x"}}', "Error: unknown tool 'browse'; available: search, python."),
    ('{"name": "search", "arguments": {"query": "a", "k": 3}}', "Error: tool 'search' takes exactly one argument."),
])
def test_hermes_garbage_becomes_an_error_result(body, message):
    req = HERMES.parse_call(f"<tool_call>{body}</tool_call>", "</tool_call>")
    assert req.error.startswith(message)


@pytest.mark.parametrize("text", ["<tool_call> </tool_call>", "</tool_call>",
                                  '<tool_call>{"name": "search", "arguments": {"query": " "}}</tool_call>'])
def test_hermes_empty_is_empty(text):
    assert HERMES.parse_call(text, "</tool_call>") is None


def test_result_wrapping(tiny_tokenizer):
    assert XML.result_wrapping(tiny_tokenizer) == (" <result>\n", "\n</result>")
    prefix, suffix = HERMES.result_wrapping(tiny_tokenizer)  # the tiny tokenizer speaks ChatML
    assert prefix == "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    assert suffix == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

    class Plain:
        def get_vocab(self):
            return {"a": 0}

    assert HERMES.result_wrapping(Plain()) == ("\n<tool_response>\n", "\n</tool_response>\n")
