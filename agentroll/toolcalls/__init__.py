"""Tool calling: parsers for the calls models write (`parsers.py`) and the tools they call (`tools.py`).

The `tool-use` system (`agentroll.systems.tool_use`) offers a `Toolbox`'s schemas through the chat template's
`tools` argument, reads the calls in each response with a parser, runs them, and continues the conversation by
token ids with the results as `tool` messages. docs/tool-use.md.
"""

from __future__ import annotations

from .parsers import PARSERS, ParsedCall, Parser, call_id, parser_for, tool_text
from .tools import PYTHON, Tool, Toolbox, ToolResult, clip, function_tool

__all__ = [
    "PARSERS",
    "PYTHON",
    "ParsedCall",
    "Parser",
    "Tool",
    "ToolResult",
    "Toolbox",
    "call_id",
    "clip",
    "function_tool",
    "parser_for",
    "tool_text",
]
