"""Faults, signals and crashes: real subprocesses, real signals, a real server on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from agentroll.folder import read_groups
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, generations, read_records, run_cli, settings, write_problems


def start_sim(problems, **faults) -> SimServer:
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(**faults))
    server.start()
    return server


def generate_args(problems, out, url, *extra):
    return [
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        "exact",
        "--shard-size",
        "20",
        *extra,
    ]


def popen(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    return subprocess.Popen(
        [sys.executable, "-m", "agentroll", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


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
        proc = run_cli(
            *generate_args(
                problems,
                out,
                server.url,
                "--num-parallel",
                "3",
                "--samples-per-prompt",
                "2",
                "--concurrency",
                "6",
                "--max-retries",
                "10",
            )
        )
        assert proc.returncode == 0, proc.stderr.decode()
        records = assert_exactly_once(out, 20, 2)
        sent = Counter(
            (
                tuple(e["request"]["prompt"]),
                tuple(e["response"]["choices"][0]["token_ids"]),
                tuple(e["response"]["choices"][0]["logprobs"]["token_logprobs"]),
            )
            for e in generations(server)
        )
        got = Counter(
            (tuple(r["prompt_token_ids"]), tuple(r["response_token_ids"]), tuple(r["response_logprobs"]))
            for r in records
        )
        assert got == sent
        assert server.peak_in_flight <= 6
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["complete"] and manifest["last_run"]["requests"]["retries"] > 0
        assert manifest["last_run"]["requests"]["failures"] == 0
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("sig", "after"), [(signal.SIGTERM, 60), (signal.SIGKILL, 5), (signal.SIGKILL, 60), (signal.SIGKILL, 200)]
)
def test_stopped_mid_run_then_rerun_gives_every_execution_exactly_once(tmp_path, sig, after):
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = start_sim(problems, latency_s=0.02)
    try:
        out = tmp_path / "out"
        args = generate_args(problems, out, server.url, "--num-parallel", "2", "--concurrency", "4")
        proc = popen(*args)
        assert server.wait_for_completions(after, timeout=60)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
        first_calls = len(generations(server))
        if sig == signal.SIGTERM:
            assert proc.returncode == 143 and b"Traceback" not in stderr
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["complete"] is False and manifest["records"] == len(read_records(out)) > 0
            assert not list(out.glob("*.partial"))
            assert manifest["last_run"]["exit"] == {"code": 143, "reason": "stopped by SIGTERM"}
        else:
            assert proc.returncode == -signal.SIGKILL
            assert "exit" not in json.loads((out / "manifest.json").read_text())["last_run"]  # killed: no word
        with pytest.raises(TimeoutError):  # a follower waits for the resume (it would end on a run's own end)
            list(read_groups(out, follow=True, poll_s=0.05, timeout_s=0.3))
        rerun = run_cli(*args)
        assert rerun.returncode == 0, rerun.stderr.decode()
        records = assert_exactly_once(out, 120, 1)
        rerun_calls = len(generations(server)) - first_calls
        assert rerun_calls <= len(records)
        if after >= 60:  # by then executions were complete: the rerun does not redo them
            assert rerun_calls < len(records)
        assert json.loads((out / "manifest.json").read_text())["complete"] is True
        assert json.loads((out / "manifest.json").read_text())["last_run"]["exit"] == {"code": 0, "reason": "complete"}
    finally:
        server.stop()


def test_a_reader_closing_stdout_ends_the_run_quietly_with_sigpipes_code(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = start_sim(problems)
    try:
        proc = popen(*generate_args(problems, "-", server.url, "--num-parallel", "2"))
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        proc.stdout.close()
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 141  # not 0: the rest of the input was never generated
        assert first["problem_id"].startswith("p") and b"Traceback" not in stderr and b"Error" not in stderr
    finally:
        server.stop()


def test_a_wrong_api_key_stops_the_run_with_one_line(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 3)
    server = SimServer(script=Script.from_jsonl(problems), api_key="sesame")
    server.start()
    try:
        args = generate_args(problems, tmp_path / "out", server.url)
        (tmp_path / "wrong.txt").write_text("nope\n")  # from a file: on the command line it adds a warning
        wrong = run_cli(*args, "--api-key-file", str(tmp_path / "wrong.txt"))
        assert wrong.returncode == 4 and b"answered 401: Unauthorized" in wrong.stderr
        assert b"Traceback" not in wrong.stderr and len(wrong.stderr.decode().strip().splitlines()) == 1
        assert run_cli(*args, "--api-key", "sesame").returncode == 0
    finally:
        server.stop()


def test_a_400_fails_its_group_which_is_not_written_and_the_run_exits_8(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 4)
    server = SimServer(script=Script.from_jsonl(problems), max_model_len=100)  # rewriter prompts do not fit
    server.start()
    try:
        args = generate_args(
            problems,
            tmp_path / "out",
            server.url,
            "--num-parallel",
            "2",
            "--max-context-len",
            "4096",
            "--max-tokens",
            "50",
        )
        proc = run_cli(*args)
        assert proc.returncode == 8, proc.stderr.decode()
        assert b"This model's maximum context length is 100 tokens" in proc.stderr
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        stats = manifest["last_run"]["stats"]
        assert stats["stages"]["rewriter"]["failed_calls"] > 0 and stats["stages"]["solver"]["failed_calls"] == 0
        assert manifest["last_run"]["requests"]["retries"] == 0  # a 400 is not retried
        assert not manifest["complete"] and stats["groups_failed"] + stats["groups_written"] == 4
        missing = stats["groups_failed"]
        assert missing > 0 and f"error: {missing} of 4 groups could not be produced".encode() in proc.stderr
        written = {r["problem_id"] for r in read_records(tmp_path / "out")}
        assert len(written) == stats["groups_written"] and manifest["groups"] == len(written)
        over = run_cli(*args, "--max-failures", "1", "--overwrite", "--concurrency", "1")
        assert over.returncode == 7 and b"--max-failures 1" in over.stderr
    finally:
        server.stop()


def test_a_timed_out_request_closes_its_connection_so_the_server_aborts_it(problems):
    import asyncio

    from agentroll.client import CallFailed, CompletionClient

    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=30))
    server.start()

    async def go():
        client = CompletionClient([server.url], settings(timeout_s=0.2, max_retries=1, backoff_base_s=0.01))
        try:
            with pytest.raises(CallFailed, match=r"timed out after 0\.2s"):
                await client.complete([1, 2, 3], {"max_tokens": 4}, server.model)
            # still inside the run: the server saw both attempts go away without waiting for their answers
            return await asyncio.to_thread(server.wait_until, lambda: server.aborted >= 2, 10)
        finally:
            await client.aclose()

    try:
        assert asyncio.run(go()) is True
        assert server.completions == 0
    finally:
        server.stop()


def test_two_endpoints_one_dies_mid_run_and_nothing_is_lost(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 60)
    first = start_sim(problems, latency_s=0.01)
    second = start_sim(problems, latency_s=0.01)
    try:
        out = tmp_path / "out"
        proc = popen(
            *generate_args(problems, out, f"{first.url}/v1,{second.url}", "--num-parallel", "2", "--concurrency", "8")
        )
        assert first.wait_for_completions(30, timeout=60)
        first.stop()
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr.decode()
        records = assert_exactly_once(out, 60, 1)
        assert {r["endpoint"] for r in records} == {first.url, second.url}
        assert b"out of rotation" in stderr
        assert json.loads((out / "manifest.json").read_text())["complete"] is True
    finally:
        first.stop()
        second.stop()


def test_when_every_endpoint_is_down_the_run_pauses_then_fails_clearly_and_stays_resumable(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 60)
    server = start_sim(problems, latency_s=0.01)
    out = tmp_path / "out"
    args = generate_args(
        problems,
        out,
        server.url,
        "--num-parallel",
        "2",
        "--concurrency",
        "4",
        "--down-timeout",
        "1",
        "--probe-interval",
        "0.2",
        "--max-retries",
        "20",
    )
    proc = popen(*args)
    assert server.wait_for_completions(20, timeout=60)
    server.stop()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 4, stderr.decode()
    assert b"every endpoint has been down for 1s" in stderr and b"Traceback" not in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == len(read_records(out)) and not list(out.glob("*.partial"))
    revived = start_sim(problems)
    try:
        rerun = run_cli(*[revived.url if a == server.url else a for a in args])
        assert rerun.returncode == 0, rerun.stderr.decode()
        assert_exactly_once(out, 60, 1)
    finally:
        revived.stop()


def test_disk_full_is_a_clear_error_with_no_torn_shard_and_a_rerun_completes(tmp_path, sim, problems):
    import resource

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))  # a few groups fit, not all

    out = tmp_path / "out"
    args = generate_args(problems, out, sim.url, "--num-parallel", "2", "--shard-size", "1000", "--max-tokens", "80")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "agentroll", *args], capture_output=True, env=env, preexec_fn=small_files, timeout=120
    )
    assert proc.returncode == 6 and b"File too large" in proc.stderr and b"Traceback" not in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    kept = read_records(out)  # every line parses: nothing torn
    assert manifest["records"] == len(kept) and len(kept) > 0
    assert run_cli(*args).returncode == 0
    assert_exactly_once(out, 8, 1)


def test_an_output_path_that_cannot_be_a_folder_is_a_clear_error(tmp_path, sim, problems):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_cli(*generate_args(problems, blocker / "out", sim.url))
    assert proc.returncode == 6 and b"output folder" in proc.stderr and b"Traceback" not in proc.stderr


def test_skip_invalid_counts_bad_rows_and_goes_on(tmp_path, sim, problems):
    lines = problems.read_text().splitlines()
    lines[1] = '{"prompt": "no label"}'
    lines.append(lines[0])  # a duplicate id
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    proc = run_cli(*generate_args(bad, tmp_path / "out", sim.url, "--skip-invalid", "--num-parallel", "1"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"bad.jsonl:2: field 'label': missing" in proc.stderr and b"duplicate id 'p000'" in proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["last_run"]["stats"]["invalid_rows"] == 2 and manifest["executions"] == 7


def test_a_second_ctrl_c_stops_at_once_and_the_folder_still_resumes(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = start_sim(problems, latency_s=0.02)
    try:
        out = tmp_path / "out"
        args = generate_args(problems, out, server.url, "--num-parallel", "2", "--concurrency", "4")
        proc = popen(*args)
        assert server.wait_for_completions(40, timeout=60)
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        rerun = run_cli(*args)
        assert rerun.returncode == 0, rerun.stderr.decode()
        assert_exactly_once(out, 120, 1)
    finally:
        server.stop()
