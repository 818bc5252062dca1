"""`--reward code`: the last fenced ```python block of the answer, run against the row's tests in the sandbox.

The label holds the tests, as an object or as a JSON string of one (LiveCodeBench and TACO store it so):
`{"inputs": [...], "outputs": [...]}`, test i feeding `inputs[i]` on stdin and expecting `outputs[i]` on stdout,
compared line by line with trailing white space ignored (a list of lines stands for the lines joined). With
`"fn_name"` the tests are call-based (APPS, TACO): `inputs[i]` are the arguments (a JSON list, or a string of one
JSON value per line), the function of that name (or `Solution().NAME`) is called with them, and its return value
must equal `outputs[i]` (or `outputs[i][0]`, as APPS wraps it; numbers within 1e-6).

Stdin is the input as given, with a final newline added only when it has none (APPS, TACO and LiveCodeBench
inputs mostly end in one; a second would be a blank line to a `for line in sys.stdin` program).

The reward is 1 when every test passes (else 0, stopping at the first failure), or with `partial` the fraction
passed. Each test runs in a fresh sandboxed process with its own timeout. `reward_info` says how many passed and
why the first failure failed (with `partial`, each failure, up to `SHOWN` of them within `INFO_LIMIT`
characters): wrong output (the first line that differs), error (the exception), timeout, memory, output limit.
A sandbox that cannot run code at all stops the run (exit 5): zeros would poison the data. A SandboxFusion
server that fails on one program only (it runs others) fails that test: the sample scores as a failed check
(`failed="error"`, counted in `reward_errors`), and the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import RewardError, json_kind
from ..process.concurrency import gather_or_cancel
from ..sandbox import FAILED_ON_IT, RunResult, Sandbox, SandboxUnavailable
from .base import NO_CONTENT, RewardRequest, RewardResult

__all__ = ["CodeReward", "CodeTests", "last_python_block", "parse_tests"]

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.S | re.I)
SHOWN = 5  # failures named in reward_info with partial credit
INFO_LIMIT = 600  # ... and the characters they may take
MARK = "\x1eagentroll-result\x1e"  # where the call-based harness's JSON answer starts in stdout
HARNESS = """import json as _agentroll_json, sys as _agentroll_sys, types as _agentroll_types
_agentroll_args = _agentroll_json.loads(_agentroll_sys.stdin.read())
_agentroll_module = _agentroll_types.ModuleType("solution")
_agentroll_sys.modules["solution"] = _agentroll_module
exec(compile({source!r}, "solution.py", "exec"), _agentroll_module.__dict__)
_agentroll_fn = getattr(_agentroll_module, {name!r}, None)
if _agentroll_fn is None and hasattr(_agentroll_module, "Solution"):
    _agentroll_fn = getattr(_agentroll_module.Solution(), {name!r}, None)
if not callable(_agentroll_fn):
    raise NameError("the program defines no function {name}")
_agentroll_out = _agentroll_fn(*_agentroll_args)
_agentroll_sys.stdout.write("\\n{mark}" + _agentroll_json.dumps(_agentroll_out, default=repr) + "\\n")
"""  # the solution runs as a module named "solution", as APPS/TACO graders load it: its __main__ block stays idle


@dataclass(frozen=True, slots=True)
class CodeTests:
    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None


def parse_tests(label: Any) -> CodeTests:
    """A row's tests, or ValueError saying what is wrong with the label."""
    given = label
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except ValueError:
            raise ValueError('is a string that is not JSON: expected {"inputs": [...], "outputs": [...]}') from None
    if not isinstance(label, dict):
        got = f"the string {_short(given)!r} (JSON for {json_kind(label)})" if given is not label else json_kind(label)
        raise ValueError(f'must be {{"inputs": [...], "outputs": [...]}} (as an object or a JSON string), got {got}')
    inputs, outputs, name = label.get("inputs"), label.get("outputs"), label.get("fn_name")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError('needs "inputs" and "outputs" lists')
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"has {len(inputs)} inputs and {len(outputs)} outputs: they must pair up, at least one")
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise ValueError(f'"fn_name" {name!r} is not a function name')
    return CodeTests(inputs, outputs, name)


def last_python_block(content: str) -> str | None:
    blocks = _FENCE.findall(content)
    return blocks[-1] if blocks else None


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(map(str, value))
    return value if isinstance(value, str) else json.dumps(value)


def _short(text: str, size: int = 60) -> str:
    return text if len(text) <= size else text[:size] + "..."


def _equal(got: Any, want: Any) -> bool:
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want if isinstance(got, bool) and isinstance(want, bool) else False
    if isinstance(got, int | float) and isinstance(want, int | float):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_equal(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_equal(got[k], want[k]) for k in got)
    return bool(got == want)


def call_arguments(given: Any) -> list[Any]:
    """A call-based test's input as the function's arguments: a list as it is, a string as one JSON value a line."""
    if isinstance(given, list):
        return given
    if isinstance(given, str):
        return [json.loads(line) for line in given.split("\n") if line.strip()]
    return [given]


def _each(failed: list[tuple[int, str]], used: int) -> str:
    """`; test N: why` for each failure, at most SHOWN of them within INFO_LIMIT characters, then how many more."""
    text = ""
    for shown, (at, why) in enumerate(failed):
        item = f"; test {at + 1}: {why}"
        if shown == SHOWN or (shown and used + len(text) + len(item) > INFO_LIMIT):
            return f"{text}; and {len(failed) - shown} more failed"
        text += item
    return text


def _failure(result: RunResult, timeout_s: float, memory_mb: int) -> str:
    if result.status == "timeout":
        return f"timeout after {timeout_s:g}s"
    if result.status == "memory":
        return f"memory: over its {memory_mb} MB"
    if result.status == "output_limit":
        return "wrote more than the output limit"
    if result.status == "sandbox_error":  # SandboxFusion's, on this program alone: a failed check, counted
        return _short(result.stderr, 200)
    tail = result.stderr.strip().rsplit("\n", 1)[-1] if result.stderr.strip() else f"exit code {result.exit_code}"
    return f"error: {_short(tail, 120)}"


class CodeReward:
    name = "code"

    def __init__(
        self, sandbox: Callable[[], Sandbox], timeout_s: float = 6.0, partial: bool = False, memory_mb: int = 1024
    ) -> None:
        self._sandbox, self.timeout_s, self.partial, self.memory_mb = sandbox, timeout_s, partial, memory_mb

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        if request.content is None:
            return NO_CONTENT
        try:
            tests = parse_tests(request.label)
        except ValueError as exc:
            return RewardResult(0.0, f"the label {exc}", failed="error")
        code = last_python_block(request.content)
        if code is None:
            return RewardResult(0.0, "no ```python block in the answer")
        total = len(tests.inputs)
        try:
            if self.partial:
                verdicts = await gather_or_cancel(*(self._test(code, tests, i) for i in range(total)))
            else:
                verdicts = []
                for i in range(total):
                    verdicts.append(await self._test(code, tests, i))
                    if verdicts[-1] is not None:
                        break
        except SandboxUnavailable as exc:
            raise RewardError(f"--reward code: {exc}") from exc
        passed = sum(v is None for v in verdicts)
        failed = [(i, v) for i, v in enumerate(verdicts) if v is not None]
        info = f"passed {passed} of {total} tests"
        if self.partial:
            info += _each(failed, len(info))
        elif failed:
            at, why = failed[0]
            info += f"; test {at + 1}: {why}" + (" (later tests not run)" if at + 1 < total else "")
        value = passed / total if self.partial else float(passed == total)
        flagged = any(why.startswith(FAILED_ON_IT) for _, why in failed)
        return RewardResult(value, info, failed="error" if flagged else None)

    async def _test(self, code: str, tests: CodeTests, i: int) -> str | None:
        """None when test i passes, else why not."""
        sandbox = self._sandbox()
        if tests.fn_name is None:
            given = _text(tests.inputs[i])
            result = await sandbox.run(code, given if given.endswith("\n") else given + "\n", self.timeout_s)
            if result.status != "ok":
                return _failure(result, self.timeout_s, self.memory_mb)
            got, want = _lines(result.stdout), _lines(_text(tests.outputs[i]))
            if got == want:
                return None
            at = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            seen = got[at] if at < len(got) else "(nothing)"
            wanted = want[at] if at < len(want) else "(nothing)"
            return f"wrong output: line {at + 1}: expected {_short(wanted)!r}, got {_short(seen)!r}"
        try:
            arguments = json.dumps(call_arguments(tests.inputs[i]))
        except ValueError:
            return "its arguments in the label are not JSON"
        program = HARNESS.format(source=code, name=tests.fn_name, mark=MARK)
        result = await sandbox.run(program, arguments, self.timeout_s)
        if result.status != "ok":
            return _failure(result, self.timeout_s, self.memory_mb)
        _, mark, tail = result.stdout.rpartition(MARK)
        try:
            returned: Any = json.loads(tail) if mark else None
        except ValueError:
            returned = None
        want = tests.outputs[i]
        if mark and (
            _equal(returned, want) or (isinstance(want, list) and len(want) == 1 and _equal(returned, want[0]))
        ):
            return None
        return f"wrong output: expected {_short(json.dumps(want))}, got {_short(tail.strip() or '(nothing)')}"

    async def aclose(self) -> None:
        pass
