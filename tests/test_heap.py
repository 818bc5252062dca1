"""The garbage collector is set for a long run only in a process the command line owns (agentroll.heap)."""

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
print(gc.get_freeze_count(), gc.get_threshold()[0])
heap.own()
heap.settle()
print(gc.get_freeze_count() > 1000, gc.get_threshold()[0])
"""


def test_settle_freezes_the_loaded_heap_only_where_the_command_line_owns_the_process():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    before, after = done.stdout.split("\n")[:2]
    assert before.split()[0] == "0" and before.split()[1] != str(heap.YOUNG)  # not owned: nothing changed
    assert after == f"True {heap.YOUNG}"


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
