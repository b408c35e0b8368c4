"""Tools the agent calls: search (BM25, Search-R1 API) and a sandboxed python."""

from aepo_rl.tools.base import Tool, ToolError, argument_error, get_tool, register_tool
from aepo_rl.tools.corpus import CorpusError, load_corpus
from aepo_rl.tools.python import PythonSandbox, SandboxUnavailable
from aepo_rl.tools.search import SearchIndex, SearchTool

__all__ = ["CorpusError", "PythonSandbox", "SandboxUnavailable", "SearchIndex", "SearchTool", "Tool", "ToolError",
           "argument_error", "get_tool", "load_corpus", "register_tool"]
