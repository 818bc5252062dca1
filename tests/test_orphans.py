"""Nothing agentroll starts outlives it: SIGKILL the command mid-run, and every process under it is gone soon.

The math reward's worker is the process at stake (it used to be a multiprocessing pool, whose worker and
resource tracker lived on for ever after a `kill -9`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, write_problems

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def report_and_hang(label: str, answer: str, timeout_s: int) -> bool:
    """The math check, in the worker, for the demo test (AGENTROLL_MATH_CHECK): tell the test which process is
    checking, then never return, so the demo is certainly mid-run and its worker busy when it is killed."""
    with socket.create_connection(("127.0.0.1", int(os.environ["ORPHAN_TEST_PORT"]))) as s:
        s.sendall(str(os.getpid()).encode())
    time.sleep(3600)  # stands for a check stuck in sympy; the test kills it long before
    return False


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def is_math_worker(process: psutil.Process) -> bool:
    try:
        return any(part.endswith("_worker.py") for part in process.cmdline())
    except psutil.NoSuchProcess:
        return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_and_survivors(proc: subprocess.Popen[bytes], under: list[psutil.Process]) -> list[psutil.Process]:
    """SIGKILL agentroll; the processes of `under` still alive after GONE_WITHIN_S (polled up to that deadline)."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := [p for p in under if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:  # leave nothing behind for the next test, whatever this one found
        p.kill()
    return left


def test_killing_generate_mid_run_leaves_no_process_behind(tmp_path):
    count, samples, parallel = 40, 2, 2
    problems = write_problems(tmp_path / "problems.jsonl", count)
    # labels only sympy decides (`3\sqrt{2}`): whole numbers would be settled by the reward's fast path, in the
    # parent, and no math worker would ever start
    rows = [json.loads(line) for line in problems.read_text().splitlines()]
    problems.write_text("".join(json.dumps({**r, "label": f"{r['label']}\\sqrt{{2}}"}) + "\n" for r in rows))
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.3), record=False)
    url = server.start()
    log = (tmp_path / "stderr.txt").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            url,
            "--tokenizer",
            TOKENIZER,
            "--samples-per-prompt",
            str(samples),
            "--num-parallel",
            str(parallel),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=environment(),
    )
    try:
        # A completion past the last solver call is a rewriter's or a selector's: some execution's solvers have
        # been scored, so the math worker exists; and many calls are left, so the run is mid-way.
        solver_calls = count * samples * parallel
        assert server.wait_for_completions(solver_calls + 1, timeout=120), (tmp_path / "stderr.txt").read_text()
        assert proc.poll() is None
        under = psutil.Process(proc.pid).children(recursive=True)
        assert any(is_math_worker(p) for p in under), [p.cmdline() for p in under]
        assert kill_and_survivors(proc, under) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        server.stop()


def test_killing_demo_while_a_check_hangs_leaves_no_process_behind(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(120)
        port = listener.getsockname()[1]
        env = environment(AGENTROLL_MATH_CHECK="tests.test_orphans:report_and_hang", ORPHAN_TEST_PORT=str(port))
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentroll", "demo", "-o", str(tmp_path / "demo"), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            connection, _ = listener.accept()  # a worker is in a check: the demo is mid-run
            with connection:
                connection.settimeout(30)
                checking = int(connection.recv(64))
            under = psutil.Process(proc.pid).children(recursive=True)
            assert checking in [p.pid for p in under] and is_math_worker(psutil.Process(checking))
            assert kill_and_survivors(proc, under) == []
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
