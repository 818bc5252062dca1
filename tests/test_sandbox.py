"""The sandbox: local runs (limits, fresh directories, scrubbed environment, no network, the whole tree killed,
nothing surviving agentroll), with bubblewrap and with `--sandbox unsafe-local`, and a SandboxFusion server over
HTTP. Hostile programs have their own tests: test_sandbox_escapes.py, test_hostile_generate.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

import agentroll.sandbox.local
from agentroll.sandbox import RunResult, SandboxSettings, SandboxUnavailable, make_sandbox
from agentroll.sandbox._unsafe import Mode
from agentroll.sandbox.local import LocalSandbox
from agentroll.sandbox.remote import RemoteSandbox, parse

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

UNSAFE = "unsafe-local"


def run(code: str, stdin: str | None = None, timeout_s: float = 10.0, **settings) -> RunResult:
    async def main() -> RunResult:
        sandbox = LocalSandbox(SandboxSettings(**settings))
        try:
            return await sandbox.run(code, stdin, timeout_s)
        finally:
            await sandbox.aclose()

    return asyncio.run(main())


def sleepers(marker: str) -> list[psutil.Process]:
    """Processes running `sleep MARKER` (a unique number of seconds: the only way to see them from here, as
    their pids live in the run's own pid namespace)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and proc.info["cmdline"][-1] == marker:
            found.append(proc)
    return found


def until(condition, timeout_s: float = 20.0) -> bool:
    """Poll an outside process's state (nothing here can signal us) until it holds or time is up."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def shared_dir() -> Path:
    """A directory the sandbox's user may write to and remove from, as the system's temp directory is."""
    path = Path(tempfile.mkdtemp(prefix="agentroll-test-"))
    path.chmod(0o1777)
    return path


# -- outcomes --------------------------------------------------------------------------------------------------
def test_a_program_reads_stdin_and_its_output_comes_back():
    result = run("name = input()\nprint(f'hello {name}')\nimport sys; print('note', file=sys.stderr)", "world\n")
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 0, "hello world\n", "note\n")


def test_an_exception_is_an_error_with_its_traceback():
    result = run("raise ValueError('boom')")
    assert result.status == "error" and result.exit_code == 1
    assert result.stderr.rstrip().endswith("ValueError: boom")


def test_a_loop_is_killed_at_its_timeout():
    result = run("while True:\n    pass\n", timeout_s=0.5)
    assert result.status == "timeout" and result.exit_code is None


def test_a_memory_hog_stops_at_its_memory_limit():
    result = run("blocks = []\nwhile True:\n    blocks.append(bytes(1 << 26))\n", memory_mb=256)
    assert result.status == "memory", result.stderr
    assert "MemoryError" in result.stderr


def test_writing_past_the_output_cap_ends_the_run():
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", max_output_bytes=100_000)
    assert result.status == "output_limit"
    assert len(result.stdout) == 100_000


def test_the_process_limit_stops_a_fork_bomb():
    code = (
        "import os, time\nmade = 0\nfor _ in range(50):\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    made += 1\nprint(made)\n"
    )
    result = run(code, processes=8)
    assert result.status == "ok" and 0 < int(result.stdout) < 8


@pytest.mark.parametrize("mode", ["bwrap", UNSAFE])
def test_the_environment_is_scrubbed_and_the_directory_is_fresh(monkeypatch, mode):
    monkeypatch.setenv("AGENTROLL_TEST_SECRET", "hunter2")
    code = "import os, json\nseen = os.path.exists('made.txt')\nopen('made.txt', 'w').write('x')\n"
    code += "print(json.dumps([seen, dict(os.environ)]))"
    first, second = run(code, mode=mode), run(code, mode=mode)
    (seen, env), (seen2, _) = json.loads(first.stdout), json.loads(second.stdout)
    assert "AGENTROLL_TEST_SECRET" not in env and "hunter2" not in first.stdout
    assert set(env) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "LC_CTYPE",
        "PWD",
    }
    assert not seen and not seen2  # the second run does not find the first one's file


def test_an_unsafe_local_run_directory_is_removed():
    base = shared_dir()
    result = run("open('made.txt', 'w').write('x')\nprint('done')", mode=UNSAFE, tmp_dir=str(base))
    assert result.stdout == "done\n" and list(base.iterdir()) == []


@pytest.mark.parametrize("mode", ["bwrap", UNSAFE])
def test_paths_in_the_run_directory_are_shown_relative_to_it_so_runs_read_alike(mode):
    code = "import os\nprint(__file__, os.getcwd(), os.environ['HOME'])\nraise ValueError(os.path.abspath('data.txt'))"
    first, second = run(code, mode=mode), run(code, mode=mode)
    assert first.stdout == "main.py . .\n"
    assert 'File "main.py", line 3, in <module>' in first.stderr and first.stderr.endswith("ValueError: data.txt\n")
    assert (first.stdout, first.stderr) == (second.stdout, second.stderr)
    assert "agentroll-sandbox" not in first.stdout + first.stderr


def test_the_program_may_reopen_its_own_pipes_by_path():
    code = "print(open('/dev/stdin').read().upper(), end='', flush=True)\nopen('/dev/stdout', 'w').write(' and back')"
    result = run(code, "through the path")
    assert (result.status, result.stdout) == ("ok", "THROUGH THE PATH and back"), result.stderr


def test_the_launcher_removes_the_run_directory_itself(monkeypatch):
    """agentroll may be killed between its launcher's end and its own clean-up: the launcher does not wait."""
    base = shared_dir()
    monkeypatch.setattr("agentroll.sandbox._unsafe.shutil.rmtree", lambda *a, **k: None)  # agentroll's own, off
    result = run("open('made.txt', 'w').write('x')\nprint('done')", mode=UNSAFE, tmp_dir=str(base))
    assert result.stdout == "done\n" and list(base.iterdir()) == []


def test_a_launcher_whose_agentroll_is_already_gone_removes_the_directory(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    workdir = tmp_path / "agentroll-sandbox-run"
    workdir.mkdir()
    (workdir / "main.py").write_text("print('never')")
    config = {
        "parent": gone.pid,
        "workdir": str(workdir),
        "status_fd": 1,
        "namespaces": "none",
        "argv": [sys.executable, "main.py"],
        "env": {},
        "limits": {"cpu_s": 5},
    }
    launcher = str(Path(agentroll.sandbox.local.__file__).with_name("_launch.py"))  # unsafe-local's
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-B", launcher, json.dumps(config)],
        capture_output=True,
        timeout=60,
        start_new_session=True,
    )  # as agentroll starts it: the group it kills is its own
    assert b"never" not in out.stdout and not workdir.exists()


def test_run_directories_of_a_gone_agentroll_are_swept_at_start():
    tmp_path = shared_dir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"agentroll-sandbox-{gone.pid}-abc"
    live, other = tmp_path / f"agentroll-sandbox-{os.getpid()}-x", tmp_path / "agentroll-sandbox-notapid"
    for folder in (stale, live, other):
        folder.mkdir()
    asyncio.run(LocalSandbox(SandboxSettings(mode=UNSAFE, tmp_dir=str(tmp_path))).describe())
    assert not stale.exists() and live.exists() and other.exists()


def test_the_network_is_cut_where_the_sandbox_says_so():
    async def main() -> tuple[str, RunResult]:
        sandbox = LocalSandbox()
        described = await sandbox.describe()
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('reached')"
            return described, await sandbox.run(code, None, 10)

    described, result = asyncio.run(main())
    if "no network" not in described:
        pytest.skip(f"this machine gives the sandbox no network namespace ({described})")
    assert result.status == "error" and "reached" not in result.stdout
    assert "unreachable" in result.stderr or "refused" in result.stderr


@pytest.mark.parametrize("mode", ["bwrap", UNSAFE])
def test_the_code_runs_as_nobody_when_agentroll_is_root(mode):
    if os.geteuid() != 0:
        pytest.skip("agentroll runs as root only on some machines")
    result = run("import os\nprint(os.getuid())\nopen('/root/agentroll-should-not-write', 'w')", mode=mode)
    assert result.stdout.strip() == "65534"
    assert result.status == "error" and ("PermissionError" in result.stderr or "FileNotFoundError" in result.stderr)
    assert not os.path.exists("/root/agentroll-should-not-write")


@pytest.mark.parametrize("mode", ["bwrap", UNSAFE])
def test_the_whole_group_dies_at_the_timeout_even_a_child_that_left_it(mode):
    marker = f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    code = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '"
        + marker
        + "'])\nimport time\ntime.sleep(300)\n"
    )
    result = run(code, timeout_s=1.0, mode=mode)
    assert result.status == "timeout"
    described = asyncio.run(LocalSandbox(SandboxSettings(mode=mode)).describe())
    survivors = sleepers(marker)
    for proc in survivors:  # leave nothing behind, whatever the verdict
        proc.kill()
    if "pid" not in described:
        pytest.skip(f"without a pid namespace a child that leaves the group can survive ({described})")
    assert survivors == []


def test_a_child_that_escapes_with_the_programs_stdout_does_not_hold_the_run():
    """Without namespaces (forced here) a child can leave the group and keep stdout open: the run still ends when
    the program does, with its output."""
    marker = f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"

    async def main() -> RunResult:
        sandbox = LocalSandbox(SandboxSettings(mode=UNSAFE))
        real = await sandbox._ready()
        assert isinstance(real, Mode)
        sandbox.plan = Mode("none", real.uid, real.python, real.settings)
        code = (
            "import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '"
            + marker
            + "'])\nprint('done', flush=True)\n"
        )
        return await sandbox.run(code, None, 60)

    try:
        result = asyncio.run(main())
    finally:
        for proc in sleepers(marker):
            proc.kill()
    assert (result.status, result.stdout) == ("ok", "done\n")


def test_a_cancelled_run_kills_its_program():
    marker = f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"

    async def main() -> bool:
        sandbox = LocalSandbox()
        task = asyncio.ensure_future(sandbox.run(f"import os\nos.execv('/bin/sleep', ['sleep', '{marker}'])"))
        while not sleepers(marker):  # the loop stays free while the program runs
            await asyncio.sleep(0.02)
            assert not task.done(), task.result()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return not sleepers(marker)

    assert asyncio.run(main())


@pytest.mark.parametrize("mode", ["bwrap", UNSAFE])
def test_nothing_survives_a_kill_9_of_agentroll(mode):
    described = asyncio.run(LocalSandbox(SandboxSettings(mode=mode)).describe())
    if "pid" not in described:
        pytest.skip(f"without a pid namespace a child that leaves the group can outlive agentroll ({described})")
    base = shared_dir()
    marker = f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    script = (
        "import asyncio, sys\nfrom agentroll.sandbox import SandboxSettings\nfrom agentroll.sandbox.local import "
        "LocalSandbox\ncode = \"import os\\nif os.fork() == 0:\\n    os.setsid()\\n    os.execv('/bin/sleep', "
        f"['sleep', '{marker}'])\\nprint('started', flush=True)\\nimport time\\ntime.sleep(300)\\n\"\n"
        f"asyncio.run(LocalSandbox(SandboxSettings(mode={mode!r}, tmp_dir={str(base)!r})).run(code, None, 600))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert until(lambda: bool(sleepers(marker)) or proc.poll() is not None) and proc.poll() is None
        assert bool(list(base.iterdir())) == (mode == UNSAFE)  # the run's directory: on the host only when unsafe
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert until(lambda: not sleepers(marker)), "a process of the run outlived agentroll"
        assert until(lambda: not list(base.iterdir())), f"left behind: {list(base.iterdir())}"
    finally:
        for left in sleepers(marker):
            left.kill()
        proc.kill()


def test_runs_are_bounded_and_waiting_ones_do_not_block_the_loop():
    async def main() -> tuple[int, int]:
        sandbox = LocalSandbox(SandboxSettings(concurrency=2))
        gate, peak, running = asyncio.Event(), [0], [0]

        async def parked(mode, code, stdin, timeout_s):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await gate.wait()
            running[0] -= 1
            return RunResult("ok", code, "", 0, 0.0)

        await sandbox.describe()
        sandbox._run = parked  # type: ignore[method-assign]
        tasks = [asyncio.ensure_future(sandbox.run(str(i))) for i in range(6)]
        while running[0] < 2:
            await asyncio.sleep(0)
        for _ in range(20):  # the others stay queued however long the loop spins
            await asyncio.sleep(0)
        queued = sum(not t.done() for t in tasks)
        gate.set()
        results = await asyncio.gather(*tasks)
        assert [r.stdout for r in results] == [str(i) for i in range(6)]
        return peak[0], queued

    peak, queued = asyncio.run(main())
    assert peak == 2 and queued == 6


# -- SandboxFusion ---------------------------------------------------------------------------------------------
class FakeFusion:
    """A SandboxFusion `/run_code` on loopback that runs code in a local sandbox; `faults` are answered first,
    one per request: an HTTP status, or "sandbox-error" for `{"status": "SandboxError"}`. `answer`: a handler
    of its own instead (a reply of a given shape). `poison`: a program holding one of its keys is answered that
    fault every time (a program that makes the server fail)."""

    def __init__(
        self, faults: list[int | str] | None = None, answer: Any = None, poison: dict[str, int | str] | None = None
    ) -> None:
        self.answer = answer
        self.faults = list(faults or [])
        self.poison = dict(poison or {})
        self.bodies: list[dict] = []
        self.local = LocalSandbox()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        poisoned = [fault for key, fault in self.poison.items() if key in body["code"]]
        if self.faults or poisoned:
            fault = poisoned[0] if poisoned else self.faults.pop(0)
            if fault == "sandbox-error":
                return web.json_response({"status": "SandboxError", "message": "worker pod lost", "run_result": None})
            return web.Response(status=int(fault), text="overloaded")
        result = await self.local.run(body["code"], body.get("stdin"), body["run_timeout"])
        state = "TimeLimitExceeded" if result.status == "timeout" else "Finished"
        run_result = {
            "status": state,
            "execution_time": result.duration_s,
            "return_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        }
        status = "Success" if state == "Finished" and result.exit_code == 0 else "Failed"
        return web.json_response(
            {
                "status": status,
                "message": "",
                "compile_result": None,
                "run_result": run_result,
                "executor_pod_name": None,
                "files": {},
            }
        )

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/run_code", self.answer or self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def remote(fake: FakeFusion, code: str, stdin: str | None = None, timeout_s: float = 5.0, **settings) -> RunResult:
    async def main() -> RunResult:
        async with fake as url:
            sandbox = make_sandbox(SandboxSettings(url=url, memory_mb=300, **settings))
            assert isinstance(sandbox, RemoteSandbox)
            try:
                return await sandbox.run(code, stdin, timeout_s)
            finally:
                await sandbox.aclose()

    return asyncio.run(main())


def test_sandboxfusion_gets_its_request_shape_and_its_answer_is_read():
    fake = FakeFusion()
    result = remote(fake, "print(int(input()) * 2)", "21\n")
    assert (result.status, result.stdout, result.exit_code) == ("ok", "42\n", 0)
    assert fake.bodies == [
        {
            "code": "print(int(input()) * 2)",
            "language": "python",
            "stdin": "21\n",
            "run_timeout": 5.0,
            "compile_timeout": 5.0,
            "memory_limit_MB": 300,
            "files": {},
            "fetch_files": [],
        }
    ]


def test_sandboxfusion_timeouts_and_errors_are_outcomes():
    assert remote(FakeFusion(), "while True: pass", timeout_s=0.5).status == "timeout"
    crashed = remote(FakeFusion(), "raise KeyError('k')")
    assert crashed.status == "error" and crashed.exit_code == 1 and "KeyError" in crashed.stderr


def test_sandboxfusion_failures_are_retried_then_answered():
    fake = FakeFusion([503, "sandbox-error", 502])
    result = remote(fake, "print('at last')", max_retries=3)
    assert result.stdout == "at last\n" and len(fake.bodies) == 4


def test_a_sandboxfusion_that_stays_down_or_refuses_is_unavailable():
    """Down for good: the program's 3 attempts fail, and so do those of the trivial program that would have
    told its failure from the server's."""
    fake = FakeFusion([503] * 6)
    with pytest.raises(SandboxUnavailable, match="failed 3 times; last: HTTP 503"):
        remote(fake, "print(1)", max_retries=2)
    assert [b["code"] for b in fake.bodies] == ["print(1)"] * 3 + ["pass"] * 3
    with pytest.raises(SandboxUnavailable, match="answered HTTP 422"):
        remote(FakeFusion([422]), "print(1)")


@pytest.mark.parametrize("fault", ["sandbox-error", 500, 502])
def test_a_program_that_makes_sandboxfusion_fail_costs_only_its_own_sample(fault):
    """A program the server fails on every time (a SandboxError, a 5xx: a worker it crashes) ended the run (exit
    5) once its retries were spent, as a server that is down does. The server still runs a trivial program, so
    the failure is that program's own: a `sandbox_error` outcome, scored 0 as a failed check (counted in
    reward_errors), while the other answers are scored as ever."""
    from agentroll.rewards import RewardRequest, RewardSet, RewardSettings

    poison = "import crash_the_worker"
    label = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    fake = FakeFusion(poison={poison: fault})

    async def main() -> tuple[RunResult, list]:
        async with fake as url:
            sandbox = make_sandbox(SandboxSettings(url=url, max_retries=1))
            rewards = RewardSet(RewardSettings("code", sandbox=SandboxSettings(url=url, max_retries=1)))
            try:
                alone = await sandbox.run(poison, None, 5.0)
                answers = [f"```python\n{poison}\n```", "```python\nprint(sum(map(int, input().split())))\n```"]
                scored = await rewards.get("code").score([RewardRequest(a, label, "p", "solver") for a in answers])
                return alone, scored
            finally:
                await sandbox.aclose()
                await rewards.aclose()

    alone, (poisoned, fine) = asyncio.run(main())
    assert alone.status == "sandbox_error" and alone.stderr.startswith("the sandbox failed on this program: ")
    assert (poisoned.value, poisoned.failed) == (0.0, "error")
    assert poisoned.info is not None and "test 1: the sandbox failed on this program" in poisoned.info
    assert (fine.value, fine.failed) == (1.0, None)


def test_a_python_tool_call_the_sandbox_fails_on_is_a_failed_call():
    from agentroll.toolcalls.tools import ToolFailed, _run_python

    async def main() -> str:
        async with FakeFusion(poison={"boom": 503}) as url:
            sandbox = make_sandbox(SandboxSettings(url=url, max_retries=0))
            try:
                await _run_python({"code": "boom"}, 5.0, sandbox)
            except ToolFailed as exc:
                return str(exc.output)
            finally:
                await sandbox.aclose()
        return "not failed"

    assert asyncio.run(main()) == "[the sandbox failed on this program: HTTP 503: overloaded]"


def test_sandboxfusion_answers_are_classified():
    def answer(run_result, status="Failed") -> bytes:
        return json.dumps({"status": status, "message": "", "run_result": run_result}).encode()

    memory = parse(
        answer(
            {
                "status": "Finished",
                "return_code": 1,
                "stdout": "",
                "stderr": "...\nMemoryError\n",
                "execution_time": 0.2,
            }
        ),
        "u",
    )
    assert memory is not None and memory.status == "memory"
    killed = parse(answer({"status": "Finished", "return_code": 137, "stdout": "", "stderr": ""}), "u")
    assert killed is not None and killed.status == "memory"
    assert parse(answer({"status": "Error", "stderr": "cannot exec"}), "u") is None  # the sandbox's own failure
    assert parse(answer(None, "SandboxError"), "u") is None
    with pytest.raises(SandboxUnavailable, match="not JSON"):
        parse(b"<html>", "u")
    with pytest.raises(SandboxUnavailable, match="without a SandboxFusion status"):
        parse(b'{"ok": true}', "u")


def test_a_sandboxfusion_reply_is_read_with_the_output_cap():
    """A server answering 64 MB of stdout (streamed, so the server itself holds little): the client reads no
    more than the output cap allows, keeps the cap, and says the program wrote too much."""
    import tracemalloc

    cap = 1 << 20

    async def huge(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status": "Success", "message": "", "run_result": {"status": "Finished", ')
        await response.write(b'"return_code": 0, "stderr": "", "execution_time": 0.1, "stdout": "')
        chunk = b"x" * (1 << 20)
        for _ in range(64):
            await response.write(chunk)
        await response.write(b'"}}')
        return response

    async def bigger_than_cap(request: web.Request) -> web.Response:
        await request.read()
        run_result = {"status": "Finished", "return_code": 0, "stdout": "y" * (3 << 20), "stderr": ""}
        return web.json_response({"status": "Success", "message": "", "run_result": run_result})

    async def main(handler) -> tuple[RunResult, int]:
        async with FakeFusion(answer=handler) as url:
            sandbox = make_sandbox(SandboxSettings(url=url, max_output_bytes=cap, max_retries=0))
            try:
                tracemalloc.start()
                result = await sandbox.run("print('x' * 10**9)", None, 5.0)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                return result, peak
            finally:
                await sandbox.aclose()

    result, peak = asyncio.run(main(huge))
    assert result.status == "output_limit" and len(result.stdout) <= cap
    assert peak < 24 * cap, peak  # today's client kept the whole reply, and its text: over 128 MB
    result, _ = asyncio.run(main(bigger_than_cap))
    assert (result.status, result.stdout) == ("output_limit", "y" * cap)


@pytest.mark.parametrize("prlimit", [True, False])
def test_the_runs_limits_are_set_inside_by_prlimit_or_else_by_the_interpreter(prlimit):
    """util-linux's prlimit sets them; where it is missing, a few lines of Python do, before the program starts."""
    import dataclasses

    code = "import resource\nprint([resource.getrlimit(getattr(resource, 'RLIMIT_' + n)) for n in "
    code += "('NPROC', 'FSIZE', 'CORE', 'NOFILE', 'CPU')])"

    async def main() -> RunResult:
        sandbox = LocalSandbox(SandboxSettings(processes=9, disk_mb=16))
        try:
            plan = await sandbox._ready()
            if not prlimit:
                sandbox.plan = dataclasses.replace(plan, prlimit=None)  # type: ignore[type-var]
            return await sandbox.run(code, None, 4.5)
        finally:
            await sandbox.aclose()

    result = asyncio.run(main())
    assert result.status == "ok", result.stderr
    assert json.loads(result.stdout.replace("(", "[").replace(")", "]")) == [
        [10, 10],  # 9 of the program's, and the sandbox's init
        [16 << 20, 16 << 20],
        [0, 0],
        [1024, 1024],
        [6, 7],  # the timeout's whole seconds + 1, then SIGKILL a second later
    ]


def test_an_interpreter_prefix_that_would_show_too_much_is_not_bound(monkeypatch, tmp_path):
    """Its prefixes are bound read-only into every run: never `/`, a home, nor one that holds the working
    directory (a venv at the root of the project with the dataset, say); /usr is bound anyway."""
    from agentroll.sandbox._bwrap import prefixes_allowed

    home, project = tmp_path / "home", tmp_path / "project"
    (project / "data").mkdir(parents=True)
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project / "data")
    venv, base = str(tmp_path / "venv"), str(tmp_path / "venv" / "base")
    assert prefixes_allowed(["/usr", venv, base]) == ([venv], None)
    for wrong in ("/", str(home), str(project)):
        binds, why = prefixes_allowed(["/usr", wrong])
        assert binds == [] and why is not None and wrong in why


def test_a_start_given_up_half_way_leaves_no_process_nor_open_pipe(monkeypatch):
    """A run that ends before the sandbox's first program has run (a bad row, say) cancels its start wherever it
    is: nothing of it is left running or open (the suite turns a pipe left to the collector into a failure)."""
    import gc

    async def main(steps: int) -> None:
        sandbox = LocalSandbox(SandboxSettings())
        task = asyncio.ensure_future(sandbox.describe())
        for _ in range(steps):  # the loop's own steps: where the start is when cancelled varies with them
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sandbox.aclose()

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for steps in range(0, 120, 4):
        asyncio.run(main(steps))
        gc.collect()
    assert {p.pid for p in psutil.Process().children(recursive=True)} - before == set()


def test_a_run_the_machine_cannot_prepare_is_tried_again_then_the_sandbox_is_said_unavailable(monkeypatch):
    """Where a run's cgroup or descriptors cannot be had (a process out of descriptors, a cgroup hierarchy that
    refuses another group), that is the machine's failure, not the program's nor an OSError out of the sandbox:
    tried once more, then SandboxUnavailable (the run ends saying so); nothing of a half-made run is left (its
    cgroup, as root, or a descriptor)."""
    import errno

    real = os.memfd_create
    failures = {"left": 0}

    def memfd_create(name: str, flags: int = 0) -> int:
        if name == "agentroll-program" and failures["left"] > 0:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real(name, flags)

    monkeypatch.setattr(os, "memfd_create", memfd_create)

    async def main() -> tuple[RunResult, set[str], set[str], list[Path]]:
        sandbox = LocalSandbox(SandboxSettings())
        try:
            assert (await sandbox.run("print(1)")).stdout == "1\n"  # set up and probed
            before = set(os.listdir("/proc/self/fd"))
            failures["left"] = 1
            again = await sandbox.run("print(2)")
            failures["left"] = 2
            with pytest.raises(SandboxUnavailable, match=r"could not be prepared: .*Too many open files"):
                await sandbox.run("print(3)")
            own = sandbox._cgroups.own if sandbox._cgroups is not None else []
            left = [d for _, parent in own for d in parent.iterdir() if d.is_dir() and d.name.startswith("run-")]
            return again, before, set(os.listdir("/proc/self/fd")), left
        finally:
            await sandbox.aclose()

    again, before, after, left = asyncio.run(main())
    assert (again.status, again.stdout) == ("ok", "2\n")
    assert failures["left"] == 0 and left == [] and after - before == set()


def test_the_runs_own_uid_is_near_the_top_of_the_mapped_ids_and_nobodys_or_a_taken_one_never():
    from agentroll.sandbox._bwrap import NOBODY
    from agentroll.sandbox._lease import own_uid

    assert own_uid([(0, 0, 4294967295)], set()) == (1 << 31) - 2  # the whole range: below 2**31
    assert own_uid([(0, 100000, 65536)], {NOBODY, NOBODY + 1}) == 65533  # a container's 65,536 ids
    assert own_uid([(0, 100000, 65536)], {NOBODY, NOBODY + 1, 65533}) == 65532
    assert own_uid([(0, 0, 1)], {0}) is None  # a user namespace mapping root alone
    assert own_uid([(0, 0, 4294967295)], set(range((1 << 31) - 70, 1 << 31))) is None


def test_a_uid_leased_is_not_leased_again_until_let_go_and_a_place_others_may_write_is_not_used(tmp_path, monkeypatch):
    """The lease is an flock on the uid's file: a second sandbox (in this process too) skips to the next uid;
    closing the first's descriptor frees it. A directory someone else may write, or not root's, is refused: its
    leases could be faked or taken away."""
    from agentroll.sandbox import _lease

    place = tmp_path / "uids"
    place.mkdir(mode=0o700)
    first = _lease.take([7, 8], str(place))
    second = _lease.take([7, 8], str(place))
    assert first is not None and second is not None and (first[0], second[0]) == (7, 8)
    assert _lease.take([7, 8], str(place)) is None
    os.close(first[1])
    again = _lease.take([7, 8], str(place))
    assert again is not None and again[0] == 7
    for fd in (second[1], again[1]):
        os.close(fd)
    if os.geteuid() == 0:
        open_to_all = tmp_path / "open"
        open_to_all.mkdir()
        open_to_all.chmod(0o777)
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 4242, 4242)
        for wrong in (open_to_all, theirs):
            monkeypatch.setattr(_lease, "PLACES", (str(wrong),))
            assert _lease.directory() != str(wrong)
