"""The garbage collector is set only in a process the command line owns (agentroll.heap): off through start-up,
then on again, frozen, once the run has started (or at once for a command with no run)."""

from __future__ import annotations

import subprocess
import sys

from agentroll import heap
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, run_cli

PROBE = """
import gc
from agentroll import heap
heap.settle()
print(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()[0])
heap.own()
print(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()[0])
heap.settle()
print(gc.isenabled(), gc.get_freeze_count() > 1000, gc.get_threshold()[0])
"""

# the real command line, reporting its collector as the process ends
COMMAND = """
import atexit, gc, sys
state = lambda: ("gc", gc.isenabled(), gc.get_freeze_count() > 1000, gc.get_threshold()[0])
atexit.register(lambda: print(*state(), file=sys.stderr))
sys.argv = ["agentroll", *sys.argv[1:]]
from agentroll.cli import main
main()
"""


def test_settle_freezes_the_loaded_heap_only_where_the_command_line_owns_the_process():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    unowned, owned, settled = done.stdout.split("\n")[:3]
    assert unowned.split()[:2] == ["True", "0"] and unowned.split()[2] != str(heap.YOUNG)  # nothing changed
    assert owned.split()[:2] == ["False", "0"]  # start-up: no collections, nothing frozen yet
    assert settled == f"True True {heap.YOUNG}"


def collector_at_exit(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", COMMAND, *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr.strip().splitlines()[-1]


def test_every_command_turns_the_collector_back_on(problems, tmp_path):
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        run = collector_at_exit("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url,
                                "--tokenizer", TOKENIZER, "--limit", "1", "-q")  # fmt: skip
    finally:
        server.stop()
    assert run == (0, f"gc True True {heap.YOUNG}")
    assert collector_at_exit("stats", str(tmp_path / "out")) == (0, f"gc True True {heap.YOUNG}")  # no run: at once
    driver = collector_at_exit("generate", str(problems), "-o", str(tmp_path / "o2"), "--ray", "")  # refused there
    assert driver == (2, f"gc True True {heap.YOUNG}")


def test_a_run_settles_the_heap_once_it_has_started(problems, tmp_path, monkeypatch):
    calls: list[bool] = []
    monkeypatch.setattr(heap, "settle", lambda: calls.append(True))
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        done = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url,
                       "--tokenizer", TOKENIZER, "--limit", "1", "-q")  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr.decode()
    assert calls == [True]
