"""Faults, signals and crashes: real subprocesses, real signals, a real server on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, read_records, run_cli, write_problems


def start_sim(problems, **faults) -> SimServer:
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(**faults))
    server.start()
    return server


def generate_args(problems, out, url, *extra):
    return ["generate", str(problems), "-o", str(out), "--base-url", url, "--tokenizer", TOKENIZER,
            "--reward", "exact", "--shard-size", "20", *extra]


def popen(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    return subprocess.Popen([sys.executable, "-m", "agentroll", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def assert_exactly_once(out, problems_count: int, k: int) -> list[dict]:
    records = read_records(out)
    executions = Counter()
    for r in records:
        if r["stage"] == "solver" and r["worker"] == 0:
            executions[(r["problem_id"], r["sample_index"])] += 1
    by_rollout = Counter(r["rollout_id"] for r in records)
    assert all(by_rollout[r["rollout_id"]] == r["rollout_size"] for r in records)  # no half executions
    assert len(by_rollout) == problems_count * k == len(executions) and set(executions.values()) == {1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == len(records) and manifest["executions"] == len(by_rollout)
    assert not list(out.glob("*.partial"))
    return records


def test_transient_errors_and_dropped_connections_are_retried_to_a_complete_exact_output(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 20)
    server = start_sim(problems, error_rate=0.12, drop_rate=0.04)
    try:
        out = tmp_path / "out"
        proc = run_cli(*generate_args(problems, out, server.url, "--num-parallel", "3", "--samples-per-prompt",
                                      "2", "--concurrency", "6", "--max-retries", "10"))
        assert proc.returncode == 0, proc.stderr.decode()
        records = assert_exactly_once(out, 20, 2)
        sent = Counter((tuple(e["request"]["prompt"]), tuple(e["response"]["choices"][0]["token_ids"]),
                        tuple(e["response"]["choices"][0]["logprobs"]["token_logprobs"])) for e in server.log)
        got = Counter((tuple(r["prompt_token_ids"]), tuple(r["response_token_ids"]), tuple(r["response_logprobs"]))
                      for r in records)
        assert got == sent
        assert server.peak_in_flight <= 6
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] and manifest["last_run"]["requests"]["retries"] > 0
        assert manifest["last_run"]["requests"]["failures"] == 0
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopped_mid_run_then_rerun_gives_every_execution_exactly_once(tmp_path, sig):
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = start_sim(problems, latency_s=0.02)
    try:
        out = tmp_path / "out"
        args = generate_args(problems, out, server.url, "--num-parallel", "2", "--concurrency", "4")
        proc = popen(*args)
        assert server.wait_for_completions(60, timeout=60)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        first_calls = server.completions
        if sig == signal.SIGTERM:
            assert proc.returncode == 143 and b"Traceback" not in stderr
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["complete"] is False and manifest["records"] == len(read_records(out)) > 0
            assert not list(out.glob("*.partial"))
        else:
            assert proc.returncode == -signal.SIGKILL
        rerun = run_cli(*args)
        assert rerun.returncode == 0, rerun.stderr.decode()
        records = assert_exactly_once(out, 120, 1)
        rerun_calls = server.completions - first_calls
        assert rerun_calls < len(records)  # work kept from the stopped run was not redone
        assert json.loads((out / "manifest.json").read_text())["complete"] is True
    finally:
        server.stop()


def test_a_reader_closing_stdout_ends_the_run_quietly(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = start_sim(problems)
    try:
        proc = popen(*generate_args(problems, "-", server.url, "--num-parallel", "2"))
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        proc.stdout.close()
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert first["problem_id"].startswith("p") and b"Traceback" not in stderr and b"Error" not in stderr
    finally:
        server.stop()
