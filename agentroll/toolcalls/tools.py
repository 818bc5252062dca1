"""The tools a model is offered: the built-in `python` (code run in the sandbox) and a user's own functions.

A user's function (`my_tools.py:search`) gets its JSON schema from its type hints and its docstring (a summary,
then `Args:` with a line per argument), made by transformers' `get_json_schema`, the schema its chat templates
expect. An async function is awaited; a sync one runs in a thread of the toolbox's own pool (at most `threads`),
so it never blocks the event loop. Every call is bounded by `timeout_s`.

Whatever goes wrong with a call (it cannot be read, names no tool, has bad arguments, raises, even
`sys.exit()`, runs too long) becomes the tool's output, `error: ...`, for the model to read, and a status the
run counts; nothing of it ends the run. What is not the model's doing is raised instead: a sandbox that cannot
run code at all (`SandboxUnavailable`), and a pool whose every thread is held by a hung call (`ToolsStuck`, exit
5: every later call would fail the same way). Outputs are cut to `max_output` characters, and the record keeps
exactly what the model was shown.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import RewardError, UsageError, first_line
from ..process.loading import load_object
from ..rewards._threads import CallThreads, PoolExhausted
from ..sandbox import SandboxUnavailable
from .parsers import ParsedCall

if TYPE_CHECKING:
    from ..sandbox import RunResult, Sandbox

__all__ = ["PYTHON", "Tool", "ToolResult", "Toolbox", "ToolsStuck", "clip", "function_tool"]

PYTHON_DESCRIPTION = (
    "Run a Python program in a sandbox and get what it prints (stdout, then stderr). Each call "
    "is a fresh process: nothing is kept between calls, and there is no network."
)
JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class ToolsStuck(RewardError):
    """Every tool thread is held by a call past its timeout: no sync tool can run again in this run (exit 5)."""


class ToolFailed(Exception):
    """The tool ran and failed: `output` is what the model is told, the message why (for the record)."""

    def __init__(self, why: str, output: str) -> None:
        super().__init__(why)
        self.output = output


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any], float, Sandbox | None], Awaitable[str]]  # arguments, timeout, sandbox

    @property
    def schema(self) -> dict[str, Any]:
        """As chat templates take it (and as vLLM hands tools to them): type, then the function's name,
        description and parameters, in that order."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True, slots=True)
class ToolResult:
    """`status`: ok, malformed, unknown, failed, timeout or not_run. `output`: what the model is shown."""

    status: str
    output: str
    record: dict[str, Any]  # the record's `tool_calls` entry


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


# -- the built-in python tool -----------------------------------------------------------------------------------
def python_output(result: RunResult, timeout_s: float) -> str:
    if result.status == "sandbox_error":  # the server's words, not the program's stderr
        return f"[{result.stderr}]"
    parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
    if result.stderr.strip():
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    parts += {
        "timeout": [f"[timed out after {timeout_s:g}s]"],
        "memory": ["[ran out of memory]"],
        "output_limit": ["[stopped: it wrote more than the output limit]"],
    }.get(result.status, [])
    if result.status == "error" and result.exit_code is not None:
        parts.append(f"[exit code {result.exit_code}]")
    return "\n".join(parts) or "[no output]"


async def _run_python(arguments: dict[str, Any], timeout_s: float, sandbox: Sandbox | None) -> str:
    if sandbox is None:
        raise UsageError("the python tool needs a sandbox")
    result = await sandbox.run(arguments["code"], None, timeout_s)
    output = python_output(result, timeout_s)
    if result.status == "timeout":
        raise asyncio.TimeoutError
    if result.status != "ok":
        why = {
            "memory": "ran out of memory",
            "output_limit": "wrote more than the output limit",
            "sandbox_error": result.stderr[:300],
        }.get(result.status, f"exit code {result.exit_code}")
        raise ToolFailed(why, output)
    return output


PYTHON = Tool(
    "python",
    PYTHON_DESCRIPTION,
    {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": "The whole program, as a file would hold it; print what you need to see.",
            }
        },
        "required": ["code"],
    },
    _run_python,
)


# -- a user's function --------------------------------------------------------------------------------------------
def function_tool(function: Callable[..., Any], spec: str, threads: CallThreads) -> Tool:
    """A user's function as a tool, its schema made from its hints and docstring."""
    from transformers.utils import get_json_schema

    try:
        made = get_json_schema(function)["function"]
    except Exception as exc:  # transformers' TypeHintParsingException, DocstringParsingException
        raise UsageError(
            f"tool {spec!r}: cannot make its JSON schema: {first_line(exc)} (give it type hints and a "
            "docstring with an Args: line per argument)"
        ) from exc
    name = str(made["name"])
    is_async = inspect.iscoroutinefunction(function)

    async def awaited(arguments: dict[str, Any]) -> Any:
        try:
            return await function(**arguments)
        except SystemExit as exc:  # caught here: out of a task, asyncio would re-raise it from the event loop
            raise RuntimeError(f"SystemExit: {exc}") from None

    async def run(arguments: dict[str, Any], timeout_s: float, sandbox: Sandbox | None) -> str:
        if is_async:
            value = await asyncio.wait_for(awaited(arguments), timeout_s)
        else:  # a call past its time keeps its thread until it returns (Python cannot stop a thread)
            try:
                value = await threads.run(lambda given: function(**given[1]), (name, arguments), timeout_s)
            except PoolExhausted as exc:
                hung = sorted({str(a[0]) for a in exc.stuck})
                raise ToolsStuck(
                    f"tool {name!r} cannot run: all {exc.size} tool threads are held by calls past "
                    f"tool_timeout={timeout_s:g}s (of {', '.join(hung)}): fix the tool, or raise "
                    "--system-option tool_threads"
                ) from None
        return as_text(value)

    return Tool(
        name,
        str(made.get("description") or ""),
        dict(made.get("parameters") or {"type": "object", "properties": {}}),
        run,
    )


def bad_arguments(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """What is wrong with the arguments by the tool's schema (required, known, of their JSON type), or None."""
    properties = tool.parameters.get("properties") or {}
    missing = [name for name in tool.parameters.get("required") or () if name not in arguments]
    if missing:
        return f"missing argument {', '.join(map(repr, missing))}"
    unknown = [name for name in arguments if name not in properties]
    if unknown:
        return f"unknown argument {', '.join(map(repr, unknown))} (it takes {', '.join(properties) or 'none'})"
    for name, value in arguments.items():
        kinds = properties[name].get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if properties[name].get("nullable"):
            kinds.append("null")
        allowed = tuple(t for k in kinds for t in JSON_TYPES.get(k, (object,)))
        if kinds and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            return f"argument {name!r} must be {' or '.join(kinds)}, got {type(value).__name__}"
    return None


class Toolbox:
    """The tools of a run, by name, and how their calls run."""

    def __init__(
        self, tools: list[Tool], timeout_s: float = 10.0, max_output: int = 4096, threads: CallThreads | None = None
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise UsageError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.timeout_s, self.max_output = timeout_s, max_output
        self.threads = threads or CallThreads(16, "agentroll-tool")

    @classmethod
    def from_spec(cls, spec: str, timeout_s: float = 10.0, max_output: int = 4096, threads: int = 16) -> Toolbox:
        """`python,my_tools.py:search,pkg.module:lookup`: the built-in python tool and the user's functions."""
        pool = CallThreads(threads, "agentroll-tool")
        tools = []
        for item in (part.strip() for part in spec.split(",")):
            if item == "python":
                tools.append(PYTHON)
            elif ":" in item:
                function = load_object(item, "tool", UsageError, "function")
                if not callable(function):
                    raise UsageError(f"tool {item!r} is not a function")
                tools.append(function_tool(function, item, pool))
            elif item:
                raise UsageError(f"tool {item!r}: expected python, FILE.py:FUNCTION or MODULE:FUNCTION")
        if not tools:
            raise UsageError("the tool-use system needs at least one tool (--system-option tools=python,...)")
        return cls(tools, timeout_s, max_output, pool)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    def not_run(self, call: ParsedCall, why: str) -> ToolResult:
        return self._result(call, "not_run", "", f"not run: {why}", 0.0)

    async def call(self, call: ParsedCall, sandbox: Sandbox | None) -> ToolResult:
        """Run one call; everything that goes wrong is its output (see the module)."""
        if call.error is not None:
            return self._result(call, "malformed", f"error: {call.error}", call.error, 0.0)
        tool = self.tools.get(call.name or "")
        if tool is None:
            why = f"unknown tool {call.name!r} (the tools: {', '.join(self.tools)})"
            return self._result(call, "unknown", f"error: {why}", why, 0.0)
        wrong = bad_arguments(tool, call.arguments)
        if wrong is not None:
            return self._result(call, "failed", f"error: {wrong}", wrong, 0.0)
        start = time.monotonic()
        try:
            output = await tool.run(call.arguments, self.timeout_s, sandbox)
        except asyncio.TimeoutError:
            why = f"timed out after {self.timeout_s:g}s"
            return self._result(call, "timeout", f"error: {why}", why, time.monotonic() - start)
        except ToolFailed as exc:
            return self._result(call, "failed", exc.output, str(exc), time.monotonic() - start)
        except (UsageError, SandboxUnavailable, ToolsStuck):
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return self._result(call, "failed", f"error: {why}", first_line(exc), time.monotonic() - start)
        return self._result(call, "ok", output, None, time.monotonic() - start)

    def _result(self, call: ParsedCall, status: str, output: str, error: str | None, took: float) -> ToolResult:
        shown = clip(output, self.max_output)
        record = {
            "name": call.name,
            "arguments": call.arguments,
            "result": shown if status != "not_run" else None,
            "duration_s": round(took, 4),
            "error": error,
            "status": status,
        }
        return ToolResult(status, shown, record)

    def close(self) -> None:
        self.threads.close()
