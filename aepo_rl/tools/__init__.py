"""Tools the agent calls: search (BM25, Search-R1 API) and a sandboxed python."""

from aepo_rl.tools.base import Tool, get_tool, register_tool, registered_tools

__all__ = ["Tool", "get_tool", "register_tool", "registered_tools"]
