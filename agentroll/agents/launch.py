"""An agent, run once per execution: a program (any command) or an async Python function.

A program is started through `/bin/sh -c COMMAND` in a session (process group) of its own, with
`OPENAI_BASE_URL` (and `OPENAI_API_BASE`, which older clients read) pointing at the proxy (on loopback, which
`NO_PROXY` is made to name: a cluster's `HTTP_PROXY` is not in the way), `OPENAI_API_KEY` the
execution's credential, `AGENTROLL_MODEL` the served model, `AGENTROLL_SAMPLE_INDEX` which of the K executions it
is, the row as JSON on its standard input and in `AGENTROLL_PROBLEM` (when under 64 KiB: an environment variable
is limited), and `OPENAI_AGENTS_DISABLE_TRACING=1` unless set (the OpenAI Agents SDK would send traces to OpenAI).
Its whole process group is killed when it ends, when its wall-clock `timeout` passes, or when the execution ends
otherwise (a failed call, a stop); the run's `Watchdog` kills it when agentroll dies without cleaning up (kill -9).
A function gets an `openai.AsyncOpenAI` bound to the proxy and the row.

Its final answer is what it returns (a function) or the last line it prints (a program), or a JSON object
`{"answer": ..., "reward": ...}` (the whole output or its last line); `reward` is the agent's own score, used
with `--reward agent`. An agent that crashes, exits non-zero or runs out of time raises `AgentFailed` with the
tail of its standard error on one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import os
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from ..errors import UsageError
from ..process.children import die_with, spawn, stop_group
from ..process.loading import load_object

__all__ = ["AgentFailed", "Outcome", "Watchdog", "direct", "outcome_of", "run_function", "run_program"]

TAIL = 64 << 10  # bytes of its standard error kept (for the warning)
ANSWER = 16 << 20  # bytes of its standard output kept: its answer is the end of it
PROBLEM_ENV = 64 << 10  # largest row passed in AGENTROLL_PROBLEM
WATCH = str(Path(__file__).with_name("_watch.py"))


class AgentFailed(Exception):
    """The agent crashed, exited non-zero or ran out of time (`timed_out`): an infrastructure failure of its
    execution."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Outcome:
    answer: str | None
    reward: float | None = None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _reported(data: dict[str, Any]) -> Outcome:
    reward = data.get("reward")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise AgentFailed(f"its reward must be a finite number, got {reward!r}")
    return Outcome(_text(data.get("answer")), None if reward is None else float(reward))


def _object(text: str) -> dict[str, Any] | None:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and "answer" in data else None


def outcome_of(value: Any, cut: bool = False) -> Outcome:
    """A function's return value, or a program's standard output (bytes), as its answer and reward. `cut`: the
    output's start was let go (only its last `ANSWER` bytes were kept), so only a last line kept whole is read."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace").strip()
        if not text:
            return Outcome(None)
        lines = text.splitlines()
        if cut and len(lines) < 2:
            raise AgentFailed(
                f"printed an answer line longer than the {ANSWER >> 20} MiB of its output agentroll keeps"
            )
        found = None if cut else _object(text)
        last = lines[-1].strip()
        found = found if found is not None else _object(last)
        return _reported(found) if found is not None else Outcome(last)
    if isinstance(value, dict):
        if "answer" not in value:
            raise AgentFailed('it returned an object without "answer"')
        return _reported(value)
    return Outcome(_text(value))


def direct(env: dict[str, str], host: str = "127.0.0.1") -> dict[str, str]:
    """`env` with `host` among the hosts reached without an HTTP proxy (`NO_PROXY` and `no_proxy`, both read by
    httpx, requests, urllib and curl, made one list)."""
    hosts = [h.strip() for name in ("NO_PROXY", "no_proxy") for h in env.get(name, "").split(",") if h.strip()]
    listed = ",".join(dict.fromkeys([*hosts, host]))
    return {**env, "NO_PROXY": listed, "no_proxy": listed}


def tail_line(data: bytes, limit: int = 400) -> str:
    """The end of an output as one line: its last non-empty lines joined by " | ", at most `limit` characters."""
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    joined = " | ".join(lines[-4:])
    return joined if len(joined) <= limit else "..." + joined[-limit:]


class Kept(bytearray):
    """The end of an output, at most `limit` bytes; `cut` once anything before it was let go."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.cut = limit, False


async def _drain(stream: asyncio.StreamReader, keep: Kept) -> None:
    while chunk := await stream.read(1 << 16):
        keep += chunk
        if len(keep) > keep.limit:
            del keep[: len(keep) - keep.limit]
            keep.cut = True


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class Watchdog:
    """The run's `_watch.py`, told of each agent program's process group: it kills those still running when
    agentroll ends, even killed outright. Telling it never blocks or fails the run (a watchdog gone is only a
    protection lost)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        watch = [sys.executable, "-I", "-S", "-B", WATCH]
        self._process = spawn(watch, signal.SIGTERM, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None)
        assert self._process.stdin is not None
        os.set_blocking(self._process.stdin.fileno(), False)

    def _tell(self, line: str) -> None:
        if self._process is not None and self._process.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                os.write(self._process.stdin.fileno(), line.encode())

    def started(self, group: int) -> None:
        self._tell(f"+{group}\n")

    def ended(self, group: int) -> None:
        self._tell(f"-{group}\n")

    async def aclose(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            with contextlib.suppress(OSError):
                process.stdin.close()  # its input ends: it kills what is listed (nothing, by now) and exits
            await asyncio.to_thread(stop_group, process, 5.0)


async def run_program(
    command: str, env: dict[str, str], row: bytes, timeout_s: float, watchdog: Watchdog | None = None
) -> Outcome:
    """Run `command` for one execution (see the module's docstring)."""
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=partial(die_with, os.getpid()),
    )
    if watchdog is not None:
        watchdog.started(process.pid)  # its group's id: the session it leads
    out, err = Kept(ANSWER), Kept(TAIL)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    readers = [asyncio.ensure_future(_drain(process.stdout, out)), asyncio.ensure_future(_drain(process.stderr, err))]
    # the row is handed over while the timeout runs: an agent that never reads a row larger than a pipe holds
    readers.append(asyncio.ensure_future(_feed(process.stdin, row + b"\n")))
    try:
        try:
            code = await asyncio.wait_for(process.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise AgentFailed(f"ran past its timeout of {timeout_s:g}s{_said(err)}", timed_out=True) from None
    finally:
        _kill(process.pid)  # the group: whatever it started, still running or not
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        try:
            await asyncio.shield(_reap(process, readers))
        finally:
            if watchdog is not None:  # killed already: its id is never left listed, to be reused by another group
                watchdog.ended(process.pid)
    if code < 0:
        raise AgentFailed(f"was killed by signal {-code}{_said(err)}")
    if code != 0:
        raise AgentFailed(f"exited with code {code}{_said(err)}")
    return outcome_of(bytes(out), out.cut)


async def _reap(process: asyncio.subprocess.Process, readers: list[asyncio.Task[None]]) -> None:
    """Wait for the killed program, for its outputs to close and its input to be let go (a few seconds at most: a
    process that left the group may hold them open)."""
    await process.wait()
    _, pending = await asyncio.wait(readers, timeout=5.0)
    for reader in pending:
        reader.cancel()


def _said(err: bytearray) -> str:
    line = tail_line(bytes(err))
    return f"; its stderr ends: {line}" if line else " (nothing on its stderr)"


def load_function(spec: str) -> Any:
    """`FILE.py:NAME` or `MODULE:NAME`, an `async def run(client, problem)`."""
    found = load_object(spec, "agent", UsageError, "function")
    if not inspect.iscoroutinefunction(found):
        raise UsageError(f"--system-option agent={spec}: expected an async function run(client, problem)")
    return found


def openai_client(url: str, key: str, timeout_s: float) -> Any:
    try:
        import openai
    except ImportError:
        raise UsageError(
            "--system-option agent=...: the openai package is missing: pip install 'agentroll[agent]'"
        ) from None
    # trust_env off: the proxy is on loopback, never behind the HTTP_PROXY the environment may name
    http = openai.DefaultAsyncHttpxClient(trust_env=False)
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http)


async def _returned(function: Any, client: Any, row: dict[str, Any]) -> Any:
    """The function's value. A sys.exit in it (a harness that was a script) is its failure: caught here, in its
    own task, since asyncio hands a SystemExit past every task to the loop, ending agentroll with its code."""
    try:
        return await function(client, row)
    except SystemExit as exc:
        raise AgentFailed(f"raised SystemExit({exc.code}): a function returns its answer") from None


async def run_function(function: Any, client: Any, row: dict[str, Any], timeout_s: float) -> Outcome:
    """Await `function(client, row)` for one execution, within `timeout_s`."""
    try:
        value = await asyncio.wait_for(_returned(function, client, row), timeout_s)
    except asyncio.TimeoutError:
        raise AgentFailed(f"ran past its timeout of {timeout_s:g}s", timed_out=True) from None
    except (asyncio.CancelledError, UsageError, AgentFailed):
        raise
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)
        at = f" (at {os.path.basename(where[-1].filename)}:{where[-1].lineno})" if where else ""
        raise AgentFailed(f"raised {type(exc).__name__}: {' '.join(str(exc).split())[:400]}{at}") from exc
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return outcome_of(value)
