"""The garbage collector is set only in a process the command line owns (agentroll.process.heap): off through start-up,
then on again, frozen, once the run has started (or at once for a command with no run)."""

from __future__ import annotations

import subprocess
import sys

from agentroll.process import heap

from .conftest import TOKENIZER, cli_at_exit, run_cli

PROBE = """
import gc
from agentroll.process import heap
heap.settle()
print(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()[0])
heap.own()
print(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()[0])
heap.settle()
print(gc.isenabled(), gc.get_freeze_count() > 1000, gc.get_threshold()[0])
"""

COLLECTOR = '"gc", gc.isenabled(), gc.get_freeze_count() > 1000, gc.get_threshold()[0]'  # at the command's exit


def test_settle_freezes_the_loaded_heap_only_where_the_command_line_owns_the_process():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    unowned, owned, settled = done.stdout.split("\n")[:3]
    assert unowned.split()[:2] == ["True", "0"] and unowned.split()[2] != str(heap.YOUNG)  # nothing changed
    assert owned.split()[:2] == ["False", "0"]  # start-up: no collections, nothing frozen yet
    assert settled == f"True True {heap.YOUNG}"


def test_every_command_turns_the_collector_back_on(sim, problems, tmp_path):
    run = cli_at_exit(COLLECTOR, "generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url,
                      "--tokenizer", TOKENIZER, "--limit", "1", "-q")  # fmt: skip
    assert run == (0, f"gc True True {heap.YOUNG}")
    assert cli_at_exit(COLLECTOR, "stats", str(tmp_path / "out")) == (0, f"gc True True {heap.YOUNG}")  # at once
    driver = cli_at_exit(COLLECTOR, "generate", str(problems), "-o", str(tmp_path / "o2"), "--ray", "")  # refused
    assert driver == (2, f"gc True True {heap.YOUNG}")


def test_a_run_settles_the_heap_once_it_has_started(sim, problems, tmp_path, monkeypatch):
    calls: list[bool] = []
    monkeypatch.setattr(heap, "settle", lambda: calls.append(True))
    done = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url,
                   "--tokenizer", TOKENIZER, "--limit", "1", "-q")  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert calls == [True]
