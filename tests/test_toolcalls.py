"""Tool calling on its own: the parsers, schemas from type hints and docstrings, and a toolbox running calls."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from pathlib import Path

import pytest

from agentroll.errors import UsageError
from agentroll.sandbox.local import LocalSandbox
from agentroll.toolcalls import PYTHON, ParsedCall, Toolbox, call_id, clip, function_tool, parser_for, tool_text
from agentroll.toolcalls.parsers import hermes, llama3_json, mistral
from agentroll.toolcalls.tools import CallThreads, ToolsStuck


# -- parsers ---------------------------------------------------------------------------------------------------
def test_hermes_reads_every_call_in_order():
    text = (
        'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    assert hermes(text) == [
        ParsedCall("search", {"q": "x"}, '{"name": "search", "arguments": {"q": "x"}}'),
        ParsedCall("python", {"code": "print(1)"}, '{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}'),
    ]
    assert hermes("The answer is \\boxed{4}.") == []


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>{"name": "python", "arguments": {"code": </tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'has no "name"'),
        ('<tool_call>["python"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "python", "arguments": "{not json"}</tool_call>', "are not JSON"),
        ('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}', "without its closing </tool_call>"),
        ('<tool_call>{"name": "python", "arguments": {"n": 123456789012345678901234567890}}</tool_call>', "64-bit"),
        ('<tool_call>{"name": "python", "arguments": "{\\"n\\": -99999999999999999999}"}</tool_call>', "64-bit"),
    ],
)
def test_a_malformed_hermes_call_is_a_call_with_its_error(text, why):
    (call,) = hermes(text)
    assert call.error is not None and why in call.error


def test_calls_are_read_after_the_think_block():
    response = '<think>I could <tool_call>{"name": "a"}</tool_call></think>\n\nNo tools needed: 4.'
    assert hermes(tool_text(response)) == []
    assert hermes(tool_text('<think>Hm.</think>\n<tool_call>{"name": "a"}</tool_call>'))[0].name == "a"


def test_a_call_inside_reasoning_that_never_closes_is_not_read():
    unfinished = '<think>Maybe <tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call> and then'
    assert tool_text(unfinished) == "" and hermes(tool_text(unfinished)) == []
    assert tool_text("<think>a</think>b</think>c") == ""  # closed twice: no answer, as answer_content reads it
    plain = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'  # --no-think: the whole response
    assert tool_text(plain, think=False) == plain and hermes(tool_text(plain, think=False))[0].name == "a"


def test_an_integer_past_64_bits_is_a_malformed_call_in_every_format_never_an_error_of_the_run():
    big = "123456789012345678901234567890"
    for calls in (
        llama3_json(f'{{"name": "f", "parameters": {{"n": {big}}}}}'),
        mistral(f'[TOOL_CALLS][{{"name": "f", "arguments": {{"n": [{big}]}}}}]'),
    ):
        (call,) = calls
        assert call.name == "f" and call.error is not None and "64-bit" in call.error


def test_llama3_and_mistral_formats():
    calls = llama3_json('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert llama3_json("The answer is 4.") == []
    assert llama3_json('{"name": "f", "parameters": ')[0].error is not None
    calls = mistral('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]')
    assert [(c.name, c.arguments) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert mistral("no calls") == [] and mistral("[TOOL_CALLS][{").pop().error is not None


def test_a_calls_own_id_is_kept_and_one_is_derived_for_a_call_without():
    (given, bare) = mistral('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "abcDEF123"}, {"name": "g"}]')
    assert (given.id, bare.id) == ("abcDEF123", None)
    assert hermes('<tool_call>{"name": "f", "arguments": {}, "id": 7}</tool_call>')[0].id is None  # not a string
    made = call_id(5, "p000", 2, 0, 1, 0)
    assert re.fullmatch(r"[A-Za-z0-9]{9}", made) and made == call_id(5, "p000", 2, 0, 1, 0)
    assert len({call_id(5, "p000", 2, 0, turn, j) for turn in range(20) for j in range(5)}) == 100
    assert call_id(6, "p000", 2, 0, 1, 0) != made  # seeded


def test_a_parser_of_ones_own_is_loaded_and_checked(tmp_path: Path):
    path = tmp_path / "my_parser.py"
    path.write_text(
        "from agentroll.toolcalls import ParsedCall\n\n"
        "def parse(text):\n    return [ParsedCall('echo', {'text': text}, text)] if text.startswith('!') else []\n\n"
        "def big(text):\n    return [ParsedCall('echo', {'n': 2 ** 70}, text)]\n\n"
        "def broken(text):\n    return 'nope'\n"
    )
    parse = parser_for(f"{path}:parse")
    assert parse("!hi") == [ParsedCall("echo", {"text": "!hi"}, "!hi")] and parse("hi") == []
    (kept,) = parser_for(f"{path}:big")("x")  # records could not hold it: the call is malformed, the run goes on
    assert kept.error is not None and "64-bit" in kept.error
    with pytest.raises(UsageError, match=r"must return a list of agentroll\.toolcalls\.ParsedCall"):
        parser_for(f"{path}:broken")("x")
    with pytest.raises(UsageError, match="not one of hermes, llama3_json, mistral"):
        parser_for("qwen9")


# -- schemas and running ---------------------------------------------------------------------------------------
def lookup(city: str, days: int = 1) -> dict:
    """Look the weather up.

    Args:
        city: where
        days: how many days ahead
    """
    if city == "Atlantis":
        raise LookupError("no such city")
    return {"city": city, "days": days, "sky": "clear"}


async def slow_lookup(city: str) -> str:
    """Look it up slowly.

    Args:
        city: where
    """
    await asyncio.Event().wait()  # never set: it runs until its timeout
    return city


RELEASE = threading.Event()


def stuck(city: str) -> str:
    """A sync tool that hangs.

    Args:
        city: where
    """
    RELEASE.wait(60)
    return city


async def quits(code: int) -> str:
    """An async tool that exits.

    Args:
        code: its exit code
    """
    sys.exit(code)


def quits_now(code: int) -> str:
    """A sync tool that exits.

    Args:
        code: its exit code
    """
    sys.exit(code)


def toolbox(*functions, timeout_s: float = 2.0, max_output: int = 4096, threads: int = 4) -> Toolbox:
    pool = CallThreads(threads, "test-tool")
    return Toolbox([function_tool(f, f.__name__, pool) for f in functions], timeout_s, max_output, pool)


def call(box: Toolbox, name: str | None, arguments, error: str | None = None, sandbox=None):
    return asyncio.run(box.call(ParsedCall(name, arguments, "raw", error), sandbox))


def test_a_functions_schema_comes_from_its_hints_and_docstring():
    (tool,) = toolbox(lookup).tools.values()
    assert tool.schema == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look the weather up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "where"},
                    "days": {"type": "integer", "description": "how many days ahead"},
                },
                "required": ["city"],
            },
        },
    }


def test_a_function_without_docs_is_refused_at_set_up():
    def bare(x: int) -> int:
        return x

    with pytest.raises(UsageError, match="cannot make its JSON schema"):
        toolbox(bare)


def test_every_way_a_call_goes_is_a_status_and_an_output_the_model_reads():
    box = toolbox(lookup, slow_lookup, stuck)
    ok = call(box, "lookup", {"city": "Paris", "days": 2})
    assert (ok.status, ok.output) == ("ok", '{"city":"Paris","days":2,"sky":"clear"}')
    assert ok.record["error"] is None and ok.record["result"] == ok.output
    raised = call(box, "lookup", {"city": "Atlantis"})
    assert (raised.status, raised.output) == ("failed", "error: LookupError: no such city")
    unknown = call(box, "search", {})
    assert unknown.status == "unknown" and unknown.output.startswith("error: unknown tool 'search' (the tools: lookup")
    malformed = call(box, None, "{broken", error="the call is not valid JSON")
    assert (malformed.status, malformed.output) == ("malformed", "error: the call is not valid JSON")
    assert call(box, "lookup", {}).output == "error: missing argument 'city'"
    assert call(box, "lookup", {"city": "x", "when": 1}).output.startswith("error: unknown argument 'when'")
    assert call(box, "lookup", {"city": 3}).output == "error: argument 'city' must be string, got int"
    assert call(box, "lookup", {"city": "x", "days": True}).status == "failed"  # a boolean is no integer
    for name in ("slow_lookup", "stuck"):  # async awaited with its timeout; sync cut off in its own thread
        late = call(box, name, {"city": "x"})
        assert (late.status, late.output) == ("timeout", "error: timed out after 2s")
    RELEASE.set()
    assert box.not_run(ParsedCall("lookup", {}, "raw"), "max_turns reached").record["result"] is None


def test_a_tool_that_calls_sys_exit_fails_alike_sync_or_async():
    box = toolbox(quits, quits_now)
    for name in ("quits", "quits_now"):
        exited = call(box, name, {"code": 3})
        assert (exited.status, exited.output) == ("failed", "error: RuntimeError: SystemExit: 3")


def test_a_pool_held_by_hung_calls_is_raised_not_shown_to_the_model():
    held = threading.Event()

    def hangs(city: str) -> str:
        """Hangs.

        Args:
            city: where
        """
        held.wait(60)
        return city

    box = toolbox(hangs, lookup, timeout_s=0.2, threads=1)

    async def go():
        first = await box.call(ParsedCall("hangs", {"city": "x"}, "raw"), None)
        assert first.status == "timeout"  # the call itself: it overran, as the model's call may
        return await box.call(ParsedCall("lookup", {"city": "Paris"}, "raw"), None)

    try:
        with pytest.raises(
            ToolsStuck,
            match=re.escape(
                "tool 'lookup' cannot run: all 1 tool threads are held by calls past tool_timeout=0.2s (of hangs)"
            ),
        ):
            asyncio.run(go())
    finally:
        held.set()
    assert ToolsStuck.exit_code == 5


def test_outputs_are_cut_and_the_record_keeps_what_the_model_saw():
    box = toolbox(lookup, max_output=20)
    result = call(box, "lookup", {"city": "Paris"})
    assert result.output == clip('{"city":"Paris","days":1,"sky":"clear"}', 20) == result.record["result"]
    assert result.output.endswith("[... 19 more characters cut]")


@pytest.mark.bwrap  # model code in the local sandbox
def test_the_python_tool_runs_code_in_the_sandbox():
    box, short = Toolbox([PYTHON], 20.0), Toolbox([PYTHON], 1.0)  # short only where the program overruns
    sandbox = LocalSandbox()
    printed = call(box, "python", {"code": "print(6 * 7)"}, sandbox=sandbox)
    assert (printed.status, printed.output) == ("ok", "42")
    crashed = call(box, "python", {"code": "print('so far')\n1 / 0"}, sandbox=sandbox)
    assert crashed.status == "failed" and crashed.record["error"] == "exit code 1"
    assert 'File "main.py", line 2, in <module>' in crashed.output and "agentroll-sandbox" not in crashed.output
    assert crashed.output.startswith("so far\n[stderr]\nTraceback") and crashed.output.endswith(
        "ZeroDivisionError: division by zero\n[exit code 1]"
    )
    looped = call(short, "python", {"code": "while True: pass"}, sandbox=sandbox)
    assert (looped.status, looped.output) == ("timeout", "error: timed out after 1s")
    assert call(box, "python", {"code": "x = 1"}, sandbox=sandbox).output == "[no output]"


def test_a_toolbox_is_made_from_its_spec(tmp_path: Path):
    (tmp_path / "my_tools.py").write_text(
        'def add(a: int, b: int) -> int:\n    """Add.\n\n    Args:\n        a: one\n        b: two\n    """\n'
        "    return a + b\n"
    )
    box = Toolbox.from_spec(f"python, {tmp_path / 'my_tools.py'}:add")
    assert [s["function"]["name"] for s in box.schemas] == ["python", "add"]
    assert call(box, "add", {"a": 2, "b": 3}).output == "5"
    with pytest.raises(UsageError, match="two tools are named 'python'"):
        Toolbox.from_spec("python,python")
    with pytest.raises(UsageError, match=r"expected python, FILE\.py:FUNCTION"):
        Toolbox.from_spec("search")
    with pytest.raises(UsageError, match="needs at least one tool"):
        Toolbox.from_spec("")
