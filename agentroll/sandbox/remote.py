"""A SandboxFusion server (`--sandbox-url`): `POST /run_code`, the API verl's code rewards use.

Request: `{"code", "language": "python", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB", "files",
"fetch_files"}`. Answer: `{"status": "Success" | "Failed" | "SandboxError", "message", "compile_result",
"run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "execution_time", "return_code", "stdout",
"stderr"}, "files"}`. A `SandboxError` (the sandbox's own failure), a dropped connection, an HTTP timeout or
408/429/5xx is retried with backoff (`max_retries`). When the last attempt fails too, a trivial program is sent
(retried the same way): if it runs, the server is up and the failure was this program's doing (a worker it
crashed, an answer the server could not make), so it is this program's outcome, `sandbox_error`, scored as a
failure; if not, or for any other answer (a 4xx), `SandboxUnavailable`. Each attempt may take the run's timeout
plus `slack_s`.

The reply is read with a cap, as a local run's output is: each stream is kept to `max_output_bytes` (more is
`output_limit`), and a reply larger than two such streams could ever take in JSON (every byte escaped as
`\\uXXXX`) is not read further: the program wrote more than the cap, whatever the server kept of it.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import orjson

from ..errors import UsageError
from . import FAILED_ON_IT, RunResult, SandboxSettings, SandboxUnavailable, Status

RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
ESCAPED = 6  # the most bytes of JSON one byte of output can take (escaped as a backslash, u and 4 digits)
ERROR_BYTES = 1 << 16  # what is read of an answer that is not a result
PROBE = "pass"  # what tells a server that is down from a program it fails on


class RemoteSandbox:
    kind = "sandboxfusion"

    def __init__(self, settings: SandboxSettings, backoff_base_s: float = 0.5) -> None:
        url = (settings.url or "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--sandbox-url {settings.url!r} must be an http:// or https:// URL")
        self.settings = settings
        self.url = url.removesuffix("/run_code") + "/run_code"
        self.backoff_base_s = backoff_base_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(settings.slots)
        self._http: aiohttp.ClientSession | None = None

    async def describe(self) -> str:
        return f"SandboxFusion at {self.url}: isolation as that server is set up"

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._http is None or loop is not self._loop:
            self._loop = loop
            self._slots = asyncio.Semaphore(self.settings.slots)
            self._http = aiohttp.ClientSession(
                headers={"content-type": "application/json"}, connector=aiohttp.TCPConnector(limit=0)
            )
        return self._http

    async def run(self, code: str, stdin: str | None = None, timeout_s: float = 10.0) -> RunResult:
        s = self.settings
        body = orjson.dumps(
            {
                "code": code,
                "language": "python",
                "stdin": stdin or "",
                "run_timeout": timeout_s,
                "compile_timeout": timeout_s,
                "memory_limit_MB": s.memory_mb,
                "files": {},
                "fetch_files": [],
            }
        )
        timeout = aiohttp.ClientTimeout(total=timeout_s + s.slack_s, sock_connect=s.connect_timeout_s)
        result, problem = await self._attempts(body, timeout)
        if result is not None:
            return result
        # every attempt failed: the server is down, or this program makes it fail (a worker it crashes, an
        # answer the server cannot make). A trivial program tells which: if it runs, the failure is this
        # program's alone, its outcome (scored as a failure), never the run's end
        probe = orjson.dumps({**orjson.loads(body), "code": PROBE, "stdin": ""})
        works, _ = await self._attempts(probe, timeout)
        if works is not None and works.status == "ok":
            return RunResult("sandbox_error", "", f"{FAILED_ON_IT}: {problem}", None, 0.0)
        raise SandboxUnavailable(f"sandbox {self.url} failed {s.max_retries + 1} times; last: {problem}")

    async def _attempts(self, body: bytes, timeout: aiohttp.ClientTimeout) -> tuple[RunResult | None, str]:
        """The answer to `body`, tried `max_retries` more times while the server fails (a SandboxError, 408,
        429, 5xx, no answer in time, a dropped connection); else None and the last failure."""
        s = self.settings
        session = self._session()
        problem = ""
        for attempt in range(s.max_retries + 1):
            try:
                async with self._slots, session.post(self.url, data=body, timeout=timeout) as response:
                    status = response.status
                    cap = 2 * ESCAPED * s.max_output_bytes + ERROR_BYTES if status == 200 else ERROR_BYTES
                    reply, whole = await read_capped(response, cap)
            except asyncio.TimeoutError:
                problem = f"no answer within {timeout.total:g}s"
            except aiohttp.ClientError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200 and not whole:  # the server kept more than the cap: so did the program
                    return RunResult("output_limit", "", "", None, 0.0), ""
                if status == 200:
                    result = parse(reply, self.url)
                    if result is not None:
                        return capped(result, s.max_output_bytes), ""
                    problem = f"SandboxError: {_message(reply)}"
                elif status in RETRYABLE:
                    problem = f"HTTP {status}: {reply[:200].decode('utf-8', 'replace')}"
                else:
                    raise SandboxUnavailable(
                        f"sandbox {self.url} answered HTTP {status}: {reply[:200].decode('utf-8', 'replace')}"
                    )
            if attempt < s.max_retries:
                cap = self.backoff_base_s * 2**attempt
                await asyncio.sleep(random.uniform(cap / 2, cap))
        return None, problem

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """The body, and True; or, when it is longer than `cap` bytes, nothing of it and False (the rest is never
    read: the connection is dropped)."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > cap:
            response.close()
            return b"", False
        chunks.append(chunk)
    return b"".join(chunks), True


def capped(result: RunResult, cap: int) -> RunResult:
    """Each stream kept to its first `cap` bytes, as a local run's are: more is `output_limit`."""
    streams = [result.stdout.encode("utf-8", "replace"), result.stderr.encode("utf-8", "replace")]
    if all(len(stream) <= cap for stream in streams):
        return result
    out, err = (stream[:cap].decode("utf-8", "ignore") for stream in streams)
    return RunResult("output_limit", out, err, result.exit_code, result.duration_s)


def _message(reply: bytes) -> str:
    try:
        return str(orjson.loads(reply).get("message") or "")[:200]
    except (orjson.JSONDecodeError, AttributeError):
        return ""


def parse(reply: bytes, url: str) -> RunResult | None:
    """A `/run_code` answer as a RunResult; None for a `SandboxError` (retried)."""
    try:
        data: Any = orjson.loads(reply)
    except orjson.JSONDecodeError:
        raise SandboxUnavailable(f"sandbox {url} answered something that is not JSON: {reply[:200]!r}") from None
    if not isinstance(data, dict) or data.get("status") not in ("Success", "Failed", "SandboxError"):
        raise SandboxUnavailable(f"sandbox {url} answered without a SandboxFusion status: {reply[:200]!r}")
    if data["status"] == "SandboxError":
        return None
    run = data.get("run_result")
    if not isinstance(run, dict):  # nothing ran (a compile step failed, for a compiled language)
        compiled = data.get("compile_result") or {}
        return RunResult("error", "", str(compiled.get("stderr") or data.get("message") or ""), None, 0.0)
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    code = run.get("return_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    took = run.get("execution_time")
    duration = round(float(took), 4) if isinstance(took, int | float) and not isinstance(took, bool) else 0.0
    state = run.get("status")
    if state == "Error":  # the command could not be run: the sandbox's failure
        return None
    status: Status
    if state == "TimeLimitExceeded":
        status, code = "timeout", None
    elif code == 0:
        status = "ok"
    elif stderr.rstrip().rsplit("\n", 1)[-1].startswith("MemoryError") or code in (-9, 137):
        status = "memory"  # a MemoryError, or killed by the memory limit (its cgroup's OOM kill)
    else:
        status = "error"
    return RunResult(status, stdout, stderr, code, duration)
