"""Each way a run used to exit 0 with data missing or wrong, run as a user would (a subprocess, real HTTP)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agentroll.client import CompletionClient
from agentroll.process import children
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, read_records, run_cli, settings, write_problems


def start(problems: Path, **faults) -> SimServer:
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(**faults), seed=11)
    server.start()
    return server


def args(problems, out, url, *extra: str) -> list[str]:
    return [
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "2",
        "--reward",
        "exact",
        *extra,
    ]


def whole_groups(out: Path, k: int = 2) -> Counter:
    """problem id -> executions on disk; fails if a group is partial or an execution appears twice."""
    executions = Counter()
    seen = set()
    for r in read_records(out):
        key = (r["problem_id"], r["sample_index"], r["rollout_id"])
        if key not in seen:
            seen.add(key)
            executions[r["problem_id"]] += 1
    assert all(n == k for n in executions.values()), executions
    return executions


def test_a_run_whose_every_call_fails_exits_8_and_says_how_many_groups_are_missing(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 5)
    server = start(problems, error_rate=1.0)
    try:
        proc = run_cli(*args(problems, tmp_path / "out", server.url, "--max-retries", "0"))
    finally:
        server.stop()
    assert proc.returncode == 8, proc.stderr.decode()
    assert b"error: 5 of 5 groups could not be produced" in proc.stderr and b"Traceback" not in proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert not manifest["complete"] and manifest["records"] == 0 and read_records(tmp_path / "out") == []


def test_a_failed_server_side_render_fails_its_group_and_a_rerun_completes_it(tmp_path):
    # about half the groups fail (five renders each at 0.12): all or none failing is below one in a million
    problems = write_problems(tmp_path / "p.jsonl", 24)
    out = tmp_path / "out"
    server = start(problems, tokenize_error_rate=0.12)
    try:
        flaky = run_cli(*args(problems, out, server.url, "--chat-render", "server", "--max-retries", "0"))
        assert flaky.returncode == 8, flaky.stderr.decode()
        assert b"prompt on the server failed" in flaky.stderr
        stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
        assert stats["groups_failed"] > 0 and stats["groups_failed"] + stats["groups_written"] == 24
        assert_no_stage_went_missing(out)
        written_first = set(whole_groups(out))
        server.faults.tokenize_error_rate = 0.0
        rerun = run_cli(*args(problems, out, server.url, "--chat-render", "server", "--max-retries", "0"))
        assert rerun.returncode == 0, rerun.stderr.decode()
    finally:
        server.stop()
    assert set(whole_groups(out)) == {f"p{i:03d}" for i in range(24)} and written_first < set(whole_groups(out))


def assert_no_stage_went_missing(out: Path, n: int = 2) -> None:
    """Every written execution whose solvers had an answer has its N rewriters, and one whose rewriters had an
    answer has its selector: a failed render was never recorded as a stage that had nothing to say."""
    by_rollout: dict[str, list[dict]] = {}
    for r in read_records(out):
        by_rollout.setdefault(r["rollout_id"], []).append(r)
    assert by_rollout
    for records in by_rollout.values():
        stages = Counter(r["stage"] for r in records)
        if any(r["content"] for r in records if r["stage"] == "solver"):
            assert stages["rewriter"] == n, stages
        if any(r["content"] for r in records if r["stage"] == "rewriter"):
            assert stages["selector"] == 1, stages


def test_renders_and_probes_do_not_wait_behind_the_completions_in_flight(problems):
    """/tokenize has its own cap and timeout: with every completion slot held, a render still goes through."""
    server = start(problems, latency_s=30)

    async def go():
        client = CompletionClient([server.url], settings(concurrency=2, max_retries=0))
        try:
            held = [asyncio.create_task(client.complete([5, 6, 7], {"max_tokens": 4}, server.model)) for _ in range(2)]
            await asyncio.to_thread(server.wait_until, lambda: server.in_flight == 2, 20)
            tokens = await client.post_with_retries("/tokenize", {"model": server.model, "prompt": "hello"})
            still_held = server.in_flight == 2 and server.completions == 0
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return tokens, still_held
        finally:
            await client.aclose()

    try:
        tokens, still_held = asyncio.run(go())
    finally:
        server.stop()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and still_held


def test_malformed_answers_are_failed_calls_never_tracebacks(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 4)
    server = start(problems, malformed_rate=1.0)
    try:
        bad = run_cli(*args(problems, tmp_path / "bad", server.url, "--max-retries", "2"))
        assert bad.returncode == 8 and b"Traceback" not in bad.stderr
        assert b"no choices" in bad.stderr or b"not a JSON object" in bad.stderr or b"not JSON" in bad.stderr
        server.faults.malformed_rate = 0.15
        mostly = run_cli(*args(problems, tmp_path / "ok", server.url, "--max-retries", "8"))
        assert mostly.returncode == 0, mostly.stderr.decode()
        retries = json.loads((tmp_path / "ok" / "manifest.json").read_text())["last_run"]["requests"]["retries"]
        assert retries > 0 and len(whole_groups(tmp_path / "ok")) == 4
    finally:
        server.stop()


def test_a_chat_row_that_the_template_rejects_is_a_bad_row(sim, tmp_path):
    strict = tmp_path / "strict-tokenizer"
    shutil.copytree(TOKENIZER, strict)
    config = json.loads((strict / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool "
        "turns here') }}{% endif %}"
        + config["chat_template"].split("{% for message", 1)[0]
        + "{% endfor %}"
        + config["chat_template"]
    )
    (strict / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [
        {"prompt": "What is 1 plus 1?", "label": "2"},
        {"prompt": [{"role": "tool", "content": "x"}, {"role": "user", "content": "What is 2 plus 2?"}], "label": "4"},
    ]
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [
        "generate",
        str(source),
        "--base-url",
        sim.url,
        "--tokenizer",
        str(strict),
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--chat-render",
        "local",
    ]
    refused = run_cli(*base, "-o", str(tmp_path / "a"))
    assert refused.returncode == 3, refused.stderr.decode()
    assert f"{source}:2: field 'prompt': the chat template rejects".encode() in refused.stderr
    assert b"no tool turns here" in refused.stderr and b"Traceback" not in refused.stderr
    skipped = run_cli(*base, "-o", str(tmp_path / "b"), "--skip-invalid")
    assert skipped.returncode == 0, skipped.stderr.decode()
    assert {r["label"] for r in read_records(tmp_path / "b")} == {"2"}
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["last_run"]["stats"]["invalid_rows"] == 1


def stopped_after_one_row(problems, out) -> tuple[int | None, bytes]:
    """`generate -` fed one row with stdin left open (a slow producer), sent SIGTERM once the server has that
    row's calls: (exit code, stderr). `out` "-" puts the records on stdout."""
    server = start(problems)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentroll", *args("-", out, server.url)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE if out == "-" else None,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(problems.read_bytes().splitlines(True)[0])
        proc.stdin.flush()
        assert server.wait_for_completions(4, timeout=60), "the first row was not sent before stdin closed"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)  # returns although stdin was never closed
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    return proc.returncode, stderr


def test_stdin_rows_are_run_as_they_arrive_and_sigterm_does_not_wait_for_stdin(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 3)
    out = tmp_path / "out"
    code, stderr = stopped_after_one_row(problems, out)
    assert code == 143, stderr.decode()
    assert b"SIGTERM: finishing up; the output folder stays resumable" in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"] == len(read_records(out)) and not manifest["complete"]
    server = start(problems)
    try:
        rerun = run_cli(*args("-", out, server.url), stdin=b"\xef\xbb\xbf" + problems.read_bytes())  # BOM too
    finally:
        server.stop()
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert set(whole_groups(out)) == {"p000", "p001", "p002"}


def test_a_stop_with_the_records_on_stdout_does_not_promise_a_folder(tmp_path):
    code, stderr = stopped_after_one_row(write_problems(tmp_path / "p.jsonl", 3), "-")
    assert code == 143, stderr.decode()
    assert b"those in flight are lost (-o -: no folder to resume)" in stderr and b"stays resumable" not in stderr


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--reward-concurrency", "0", b"--reward-concurrency must be a whole number of at least 1"),
        ("--probe-interval", "0", b"--probe-interval must be a number of seconds above 0"),
        ("--shard-size", "0", b"--shard-size must be a whole number of at least 1"),
        ("--partition", "3/2", b"--partition '3/2': need 0 <= I < N"),
    ],
)
def test_bad_numeric_options_are_one_line_usage_errors(problems, tmp_path, flag, value, message):
    proc = run_cli(*args(problems, tmp_path / "out", "http://127.0.0.1:9", flag, value))
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.decode().strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_serve_sim_names_its_tokenizer_so_generate_needs_no_tokenizer_flag(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_", "HF_"))}
    imports = (tmp_path / "imports.txt").open("wb")
    serve = children.spawn(
        [sys.executable, "-X", "importtime", "-m", "agentroll", "serve-sim", "--port", "0", "--answers", str(problems)],
        stdout=subprocess.PIPE,
        stderr=imports,
        env=env,
    )  # dies with this test run
    try:
        assert serve.stdout is not None
        url = serve.stdout.readline().decode().split()[-1]
        assert url.startswith("http://127.0.0.1:")
        # like vLLM, it has its chat template ready before it listens: a first /tokenize does not wait for
        # transformers' import (which start-up benchmarks would count as the client's time)
        assert "transformers.utils.chat_template_utils" in (tmp_path / "imports.txt").read_text()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                str(problems),
                "-o",
                str(tmp_path / "o"),
                "--base-url",
                url,
                "--num-parallel",
                "1",
                "--reward",
                "exact",
            ],
            capture_output=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        assert b"hub" not in proc.stderr and len(whole_groups(tmp_path / "o", 1)) == 2
    finally:
        children.stop_group(serve, grace_s=10)
        imports.close()
        if serve.stdout is not None:
            serve.stdout.close()


def test_a_tokenizer_neither_on_disk_nor_reachable_fails_at_once_in_one_line(sim, problems, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_", "HF_"))}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # a closed port on loopback: the hub "offline"
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "o"),
            "--base-url",
            sim.url,
            "--tokenizer",
            "some-org/some-model",
        ],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    line = proc.stderr.decode().strip()
    assert len(line.splitlines()) == 1
    assert "cannot load tokenizer 'some-org/some-model': not on disk, and the hub is out of reach" in line
    assert "127.0.0.1:9" in line


def test_the_uniform_filter_judges_whole_groups_only_and_never_records_a_failure_as_filtered(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 16)
    out = tmp_path / "out"
    server = start(problems, error_rate=0.08)
    extra = ("--filter-uniform-groups", "--max-retries", "0")
    try:
        first = run_cli(*args(problems, out, server.url, *extra))
        assert first.returncode == 8, first.stderr.decode()
        filtered = {
            json.loads(line)["problem_id"] for line in (out / ".agentroll" / "filtered.jsonl").read_text().splitlines()
        }
        stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
        written = set(whole_groups(out))
        # a failed group recorded as filtered (or written) would be counted twice (failed groups are folded in
        # the log after the first few, so they are counted here, not named)
        assert stats["groups_failed"] > 0 and not written & filtered
        assert stats["groups_failed"] + len(filtered) + len(written) == 16
        server.faults.error_rate = 0.0
        second = run_cli(*args(problems, out, server.url, *extra))
        assert second.returncode == 0, second.stderr.decode()
    finally:
        server.stop()
    filtered = {
        json.loads(line)["problem_id"] for line in (out / ".agentroll" / "filtered.jsonl").read_text().splitlines()
    }
    written = set(whole_groups(out))
    assert written | filtered == {f"p{i:03d}" for i in range(16)} and not written & filtered
    for pid in written:  # every written group is mixed: its final rewards differ
        finals = {r["final_reward"] for r in read_records(out) if r["problem_id"] == pid}
        assert len(finals) > 1


def test_a_response_vllm_aborted_is_retried_and_never_written_as_what_the_model_said(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 6)
    server = start(problems, abort_rate=0.3)
    try:
        ok = run_cli(*args(problems, tmp_path / "ok", server.url, "--max-retries", "10"))
        assert ok.returncode == 0, ok.stderr.decode()
        requests = json.loads((tmp_path / "ok" / "manifest.json").read_text())["last_run"]["requests"]
        assert requests["retries"] > 0
        records = read_records(tmp_path / "ok")
        assert records and {r["status"] for r in records} <= {"completed", "truncated"}
        assert {r["finish_reason"] for r in records} <= {"stop", "length"} and len(whole_groups(tmp_path / "ok")) == 6
        server.faults.abort_rate = 1.0
        never = run_cli(*args(problems, tmp_path / "never", server.url, "--max-retries", "1"))
        assert never.returncode == 8 and b"finish_reason 'abort'" in never.stderr
        assert read_records(tmp_path / "never") == []
    finally:
        server.stop()


def test_a_context_too_small_for_any_prompt_is_not_a_quiet_success_under_skip_invalid(sim, problems, tmp_path):
    proc = run_cli(*args(problems, tmp_path / "out", sim.url, "--max-context-len", "10", "--skip-invalid"))
    assert proc.returncode == 3, proc.stderr.decode()
    assert b"every row read (8) was invalid" in proc.stderr and b"no room to generate" in proc.stderr


def test_input_from_a_named_pipe_and_output_to_a_full_disk(sim, problems, tmp_path):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentroll", *args(fifo, tmp_path / "out", sim.url)], stderr=subprocess.PIPE
    )
    with open(fifo, "wb") as f:  # blocks until agentroll opens it for reading
        f.write(problems.read_bytes())
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    assert len(whole_groups(tmp_path / "out")) == 8

    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "agentroll", *args(problems, "-", sim.url)],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    assert proc.returncode == 6 and b"cannot write to stdout: No space left on device" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_demo_refuses_a_folder_that_holds_real_rollouts(tmp_path):
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "rollouts-00000.jsonl").write_text('{"problem_id": "keep me"}\n')
    proc = run_cli("demo", "-o", str(folder), "-q")
    assert proc.returncode == 6 and b"holds something other than an earlier demo" in proc.stderr
    assert (folder / "rollouts-00000.jsonl").read_text() == '{"problem_id": "keep me"}\n'
