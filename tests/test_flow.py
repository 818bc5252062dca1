"""Work that flows: depth-first groups, priority slots, vLLM's request priority, progress, signals, faults."""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

import agentroll
from agentroll.cli import REPEATS, LogLines, RichBar, app
from agentroll.client import CallFailed, CompletionClient, FunctionTransport, TransportFailure
from agentroll.client.slots import ClientCounters
from agentroll.folder import Manifest
from agentroll.record.stats import RunStats
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, read_records, settings, write_problems

runner = CliRunner()
ANSWER = orjson.dumps(
    {
        "choices": [
            {
                "text": "x",
                "token_ids": [1],
                "logprobs": {"token_logprobs": [-0.5]},
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ]
    }
)


def generate(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["generate", *args])
    return result.exit_code, result.output


# -- depth first ----------------------------------------------------------------------------------------------


def test_with_the_defaults_groups_are_on_disk_steadily_not_all_at_the_end(tmp_path):
    """The check the issue keeps: when half the calls have been made, a good share of the groups is out."""
    problems = write_problems(tmp_path / "p.jsonl", 48)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.05), max_running=16, record=False)
    server.start()
    seen: list[tuple[int, int]] = []  # (requests made, groups handed out) each time a group comes

    async def run() -> None:
        async with agentroll.Generator(
            base_url=server.url, tokenizer=TOKENIZER, num_parallel=2, samples_per_prompt=2, reward="exact"
        ) as gen:
            rows = [orjson.loads(line) for line in problems.read_bytes().splitlines()]
            async for _ in gen.stream(rows):
                seen.append((gen.counters.requests, len(seen) + 1))

    try:
        asyncio.run(run())
    finally:
        server.stop()
    total = seen[-1][0]
    out_at_half = max(groups for requests, groups in seen if requests <= total / 2)
    assert len(seen) == 48
    assert out_at_half >= 0.3 * 48, seen  # breadth first handed out none by then


def grant_order(priorities: list[tuple[int, int]]) -> list[int]:
    """With one slot held, calls ask with `priorities`; the order they are answered in, by their index."""
    gate = asyncio.Event()
    answered: list[int] = []

    async def handler(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        sent = orjson.loads(body or b"{}")
        if sent.get("prompt") == [0]:
            await gate.wait()
        else:
            answered.append(sent["prompt"][0] - 1)
        return 200, ANSWER

    async def go() -> None:
        client = CompletionClient(["http://127.0.0.1:9"], settings(concurrency=1), transport=FunctionTransport(handler))
        held = asyncio.create_task(client.complete([0], {"max_tokens": 1}, "m"))
        while client.counters.in_flight == 0:
            await asyncio.sleep(0)
        waiting = [
            asyncio.create_task(client.complete([i + 1], {"max_tokens": 1}, "m", priority=p))
            for i, p in enumerate(priorities)
        ]
        while client.counters.queued < len(priorities):
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(held, *waiting)
        await client.aclose()

    asyncio.run(go())
    return answered


def test_when_slots_are_scarce_older_groups_go_first_and_within_one_its_earlier_stages():
    """Within a group, the call of an earlier stage goes first: a group is written when its last execution ends,
    and the execution furthest behind (still at an earlier stage) has the most work left, so serving it first
    ends the group soonest (critical path first); serving the nearly done ones first would only make them wait
    for it. Across groups the older one goes first, whatever its stage."""
    assert grant_order([(5, 0), (1, 2), (3, 0), (1, 0), (0, 1)]) == [4, 3, 1, 2, 0]


# -- vLLM's request priority ---------------------------------------------------------------------------------


def test_the_simulator_orders_its_queue_by_priority_under_the_priority_policy(problems):
    async def go(policy: str) -> list[int]:
        server = SimServer(
            script=Script.from_jsonl(problems), faults=Faults(latency_s=0.2), max_running=1, scheduling_policy=policy
        )
        server.start()
        client = CompletionClient([server.url], settings(concurrency=8, max_retries=0))
        client.send_priority = True
        try:
            first = asyncio.create_task(client.complete([5, 6, 7], {"max_tokens": 2}, server.model, priority=(9, 0)))
            await asyncio.to_thread(server.wait_until, lambda: server.scheduler.running == 1, 20)
            rest = [
                asyncio.create_task(client.complete([5, 6, 7 + g], {"max_tokens": 2}, server.model, priority=(g, 0)))
                for g in (4, 2, 3)
            ]
            await asyncio.to_thread(server.wait_until, lambda: server.scheduler.waiting == 3, 20)
            await asyncio.gather(first, *rest)
            return server.scheduler.admitted
        finally:
            await client.aclose()
            server.stop()

    assert asyncio.run(go("priority")) == [9, 2, 3, 4]

    async def refused() -> None:  # fcfs: vLLM's documented contract refuses a non-zero priority
        server = SimServer(script=Script.from_jsonl(problems))
        server.start()
        client = CompletionClient([server.url], settings(max_retries=0))
        client.send_priority = True
        try:
            await client.complete([5, 6, 7], {"max_tokens": 2}, server.model, priority=(3, 0))
        finally:
            await client.aclose()
            server.stop()

    with pytest.raises(CallFailed, match="Got priority 3 but Priority scheduling is not enabled"):
        asyncio.run(refused())


@pytest.mark.parametrize(
    ("policy", "flag", "code", "sent"),
    [("priority", "auto", 0, True), ("fcfs", "auto", 0, False), ("fcfs", "on", 4, None), ("priority", "off", 0, False)],
)
def test_generate_sends_the_priority_when_the_server_takes_it(problems, tmp_path, policy, flag, code, sent):
    server = SimServer(script=Script.from_jsonl(problems), scheduling_policy=policy)
    server.start()
    try:
        exit_code, output = generate(
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--server-priority",
            flag,
            "-q",
        )
        bodies = [e["request"] for e in server.log]
    finally:
        server.stop()
    assert exit_code == code, output
    if sent is None:
        assert "--scheduling-policy priority" in output
        return
    assert Manifest.load(tmp_path / "out").servers[-1]["priority"] is sent
    generations = [b for b in bodies if b.get("max_tokens") != 1]
    assert generations and all(("priority" in b) is sent for b in generations)
    if sent:
        assert len({b["priority"] for b in generations}) == 8  # one number per group


# -- a hung reward ------------------------------------------------------------------------------------------


def test_a_reward_that_hangs_on_one_problem_costs_only_its_samples(problems, tmp_path, sim):
    """Its worker process is killed at --reward-timeout and replaced: that problem's checks score 0 saying why,
    every group is written, and the run exits 0 (it used to end with exit 5 once the hung calls held every
    thread)."""
    hang = tmp_path / "hang.py"
    hang.write_text(
        "import threading\nSTOP = threading.Event()\n\ndef reward(request):\n"
        "    if request.problem_id == 'p000':\n        STOP.wait()\n    return 1.0\n"
    )
    code, output = generate(
        str(problems),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        f"{hang}:reward",
        "--reward-timeout",
        "0.3",
        "--reward-concurrency",
        "2",
        "--num-parallel",
        "2",
        "-q",
    )
    assert code == 0, output
    assert Manifest.load(tmp_path / "out").groups == 8
    hung = [r for r in read_records(tmp_path / "out") if r["problem_id"] == "p000" and r["stage"] != "selector"]
    assert hung and {(r["raw_reward"], r["reward_info"]) for r in hung} == {
        (0.0, "reward function timed out after 0.3s")
    }


# -- progress a person can read ----------------------------------------------------------------------------------


def figures(settled: int) -> tuple[RunStats, ClientCounters]:
    stats = RunStats(
        groups_written=settled,
        groups_failed=1,
        executions=settled,
        system_correct=settled // 2,
        final_reward_sum=settled / 2,
    )
    return stats, ClientCounters(requests=10 * settled, in_flight=7, queued=3, failures=2, retries=5)


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """time.monotonic as the test moves it: clock[0] seconds."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_log_lines_say_done_total_rates_and_eta_from_start_to_end(caplog, clock):
    lines = LogLines(every_s=10.0)
    with caplog.at_level(logging.INFO, logger="agentroll"):
        lines.start(40)
        lines.advance(RunStats(), ClientCounters())  # the runner's, at once
        for step in range(1, 5):
            clock[0] += 5.0
            lines.advance(*figures(2 * step))
        lines.stop()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4  # at the start, every 10 s, and at the end
    assert said[0].startswith("progress: groups 0/40 (0%)")
    assert "groups 9/40 (22%), 0.45 groups/s, 4.0 requests/s, ETA 1m09s" in said[-1]
    assert "in flight 7, queued 3" in said[-1] and "groups failed 1, calls failed 2, retries 5" in said[-1]
    assert "mean reward 0.500, system accuracy 0.500" in said[-1]


def test_the_terminal_bar_shows_rates_eta_calls_and_named_failures(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("agentroll.cli.progress.err", Console(file=out, width=160, force_terminal=True))
    bar = RichBar()
    bar.start(40)
    bar.advance(*figures(8))
    bar.live.refresh()
    bar.stop()
    shown = out.getvalue()
    for text in (
        "groups",
        "9/40",
        "groups/s",
        "requests/s",
        "ETA",
        "elapsed",
        "in flight 7, queued 3",
        "groups failed 1",
        "calls failed 2",
    ):
        assert text in shown, text


def test_the_runner_reports_progress_before_any_group_is_done(problems, tmp_path):
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.3))
    server.start()
    early: list[tuple[int, int]] = []

    class Seen(agentroll.run.progress.Progress):  # type: ignore[name-defined]
        interval_s = 0.02

        def advance(self, stats, requests):
            early.append((stats.groups_settled, requests.in_flight))

    try:
        from agentroll.cli import run_generate

        code = run_generate(
            {"input": str(problems), "output": str(tmp_path / "out")},
            {"base_url": [server.url], "tokenizer": TOKENIZER, "reward": "exact"},
            quiet=True,
            debug=False,
            progress=Seen(),
        )
    finally:
        server.stop()
    assert code == 0
    assert any(settled == 0 and in_flight > 0 for settled, in_flight in early)


def test_a_warning_that_repeats_is_said_once_with_a_count(caplog):
    handler = logging.StreamHandler(io.StringIO())
    REPEATS.counts.clear()
    handler.addFilter(REPEATS)
    logger = logging.getLogger("agentroll.test-repeats")
    logger.addHandler(handler)
    try:
        for _ in range(25):
            logger.warning("the same thing")
    finally:
        logger.removeHandler(handler)
    lines = handler.stream.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == ["the same thing", "the same thing (said 10 times so far)"]
    assert REPEATS.said() == ["said 25 times in all: the same thing"]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(caplog):
    up = asyncio.Event()

    async def handler(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        if not up.is_set():
            raise TransportFailure("ConnectionRefusedError")
        return (200, b"") if url.endswith("/health") else (200, ANSWER)

    async def go() -> None:
        client = CompletionClient(
            ["http://127.0.0.1:9"],
            settings(concurrency=16, probe_interval_s=0.05, backoff_base_s=0.01, max_retries=50),
            transport=FunctionTransport(handler),
        )
        calls = [asyncio.create_task(client.complete([i], {"max_tokens": 1}, "m")) for i in range(40)]
        while not client.endpoints[0].down:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # the outage lasts a while: calls keep arriving and waiting meanwhile
        up.set()
        await asyncio.gather(*calls)
        await client.aclose()

    with caplog.at_level(logging.WARNING, logger="agentroll"):
        asyncio.run(go())
    said = [r.getMessage() for r in caplog.records]
    assert sum("every endpoint is down" in s for s in said) == 1
    assert sum("out of rotation" in s for s in said) == 1
    assert sum("is back after" in s for s in said) == 1


# -- transient faults cost only their retries ----------------------------------------------------------------------


def test_an_endpoint_failing_most_calls_is_benched_while_another_serves_the_last_kept_while_retries_absorb():
    async def go() -> tuple[bool, bool, int]:
        answered, fails_in_3 = [0], [2]  # of every 3 calls endpoint :1 answers, this many fail

        def handler(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
            if url.endswith("/health"):
                return 200, b""
            if url.startswith("http://127.0.0.1:1/"):
                answered[0] += 1
                if answered[0] % 3 < fails_in_3[0]:
                    return 500, b'{"error": {"message": "boom"}}'
            return 200, ANSWER

        client = CompletionClient(
            ["http://127.0.0.1:1", "http://127.0.0.1:2"],
            settings(concurrency=8, backoff_base_s=0.001),
            transport=FunctionTransport(handler),
        )
        await asyncio.gather(*(client.complete([i], {"max_tokens": 1}, "m") for i in range(200)))
        benched, other = client.endpoints[0].down, client.endpoints[1].down
        await client.aclose()
        fails_in_3[0] = 1  # a third of its calls fail: retries absorb that
        alone = CompletionClient(
            ["http://127.0.0.1:1"],
            settings(concurrency=8, backoff_base_s=0.001),
            transport=FunctionTransport(handler),
        )
        results = await asyncio.gather(
            *(alone.complete([i], {"max_tokens": 1}, "m") for i in range(200)), return_exceptions=True
        )
        kept = not alone.endpoints[0].down  # retries still succeed: the last endpoint is never benched
        await alone.aclose()
        return benched and not other, kept, sum(isinstance(r, Exception) for r in results)

    moved, kept, failed = asyncio.run(go())
    assert moved and kept and failed == 0


# -- signals that tell the truth ---------------------------------------------------------------------------------


def test_a_signal_after_the_folder_is_complete_leaves_the_exit_at_0(problems, tmp_path, sim, monkeypatch):
    from agentroll.engine.generator import Generator

    closing = Generator.aclose

    async def aclose(self):  # the folder is closed complete by now: the signal comes at the very end
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0)
        await closing(self)

    monkeypatch.setattr(Generator, "aclose", aclose)
    code, output = generate(
        str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--reward", "exact"
    )
    assert code == 0, output
    assert Manifest.load(tmp_path / "out").complete


LATE_SIGNAL = """
import os, signal, sys
import agentroll.cli.generate as g
SIGNAL = getattr(signal, sys.argv.pop(1))
shown = g.print_summary
def summary(result):  # the event loop is over and the folder closed complete: a signal comes now
    os.kill(os.getpid(), SIGNAL)
    shown(result)
g.print_summary = summary
from agentroll.cli import main
sys.argv[0] = "agentroll"
main()
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_the_summary_of_a_complete_run_leaves_the_exit_at_0(problems, tmp_path, sim, name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    args = ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER]
    run = subprocess.run(
        [sys.executable, "-c", LATE_SIGNAL, name, *args, "--reward", "exact"],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr.decode()
    assert Manifest.load(tmp_path / "out").complete and b"groups written 8" in run.stderr


def test_two_interrupts_within_a_second_are_one(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 20)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.5))
    server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    try:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                str(problems),
                "-o",
                str(tmp_path / "out"),
                "--base-url",
                server.url,
                "--tokenizer",
                TOKENIZER,
                "--reward",
                "exact",
            ],
            stderr=subprocess.PIPE,
            env=env,
        )
        manifest = tmp_path / "out" / "manifest.json"  # the run is past its start-up probes
        assert server.wait_until(lambda: manifest.exists() and server.in_flight > 0, 60)
        run.send_signal(signal.SIGINT)
        said = []
        assert run.stderr is not None
        for line in run.stderr:  # the first one was taken...
            said.append(line)
            if b"finishing up" in line:
                break
        run.send_signal(signal.SIGINT)  # ...and the same interrupt comes again, a moment later
        rest = run.communicate(timeout=60)[1]
    finally:
        server.stop()
    stderr = b"".join(said) + (rest or b"")
    assert run.returncode == 130, stderr.decode()
    assert b"second interrupt" not in stderr and b"groups written" in stderr  # stopped cleanly, with its summary
    assert Manifest.load(tmp_path / "out").groups >= 0


def test_under_ray_two_interrupts_within_a_second_are_one(monkeypatch, tmp_path):
    """`--ray`: the job's own handlers debounce too; a second interrupt would kill the tasks and exit."""
    import agentroll.run.cluster
    from agentroll.cli import run_generate

    seen: list[str] = []

    class Job:
        def __init__(self, *args: object) -> None:
            self.stopped: int | None = None

        def connect(self) -> None: ...

        def run(self):
            os.kill(os.getpid(), signal.SIGINT)  # the interrupt, and its echo a moment later
            os.kill(os.getpid(), signal.SIGINT)
            result = type("Result", (), {"code": 128 + (self.stopped or 0), "message": None})
            return result()

        def stop(self, signum: int) -> None:
            seen.append("stop")
            self.stopped = signum

        def kill(self) -> None:
            seen.append("kill")

        def close(self) -> None: ...

    def exit_at_once(code: int) -> None:
        raise AssertionError(f"os._exit({code})")

    monkeypatch.setattr(agentroll.run.cluster, "RayJob", Job)
    monkeypatch.setattr(os, "_exit", exit_at_once)
    code = run_generate({"input": "x.jsonl", "output": str(tmp_path), "ray": "local"}, {}, quiet=True, debug=False)
    assert seen == ["stop"] and code == 130


def test_on_a_resume_rates_and_eta_count_only_the_groups_made_now(caplog):
    clock = [0.0]
    lines = LogLines(every_s=10.0, clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="agentroll"):
        lines.start(315)
        stats = RunStats(problems_skipped_done=200)  # on disk already: read, skipped at once
        lines.advance(stats, ClientCounters())
        for second in range(1, 11):  # then one new group a second
            clock[0] = float(second)
            stats.groups_written = second
            lines.advance(stats, ClientCounters(requests=4 * second))
    said = caplog.records[-1].getMessage()
    assert "groups 210/315 (67%), 1.00 groups/s, 4.0 requests/s, ETA 1m45s" in said, said


def test_without_a_terminal_a_line_comes_at_least_every_10_seconds():
    """The runner's ticker sleeps `interval_s` and is a little late each time (as a loaded machine makes it)."""
    clock = [0.0]
    said: list[float] = []
    lines = LogLines(every_s=10.0, clock=lambda: clock[0])
    lines._say = lambda: (said.append(clock[0]), LogLines._say(lines))  # type: ignore[method-assign]
    lines.start(None)
    for step in range(400):
        clock[0] += lines.interval_s + (0.002 if step % 2 else 0.03)
        lines.advance(RunStats(), ClientCounters())
    gaps = [b - a for a, b in itertools.pairwise(said)]
    assert len(gaps) > 10 and all(9.0 < gap <= 10.0 for gap in gaps), gaps


def test_the_priority_is_sent_only_when_every_endpoint_takes_it(problems, tmp_path):
    takes = SimServer(script=Script.from_jsonl(problems), scheduling_policy="priority")
    refuses = SimServer(script=Script.from_jsonl(problems))  # fcfs: a non-zero priority is a 400
    takes.start()
    refuses.start()
    try:
        code, output = generate(
            str(problems), "-o", str(tmp_path / "out"), "--base-url", f"{takes.url},{refuses.url}", "--tokenizer",
            TOKENIZER, "--reward", "exact", "--num-parallel", "2", "--verbose",
        )  # fmt: skip
    finally:
        takes.stop()
        refuses.stop()
    assert code == 0, output
    assert Manifest.load(tmp_path / "out").servers[-1]["priority"] is False
    assert f"{refuses.url} does not take a request priority" in output


def test_the_last_log_line_has_the_ends_figures_once(caplog, clock):
    lines = LogLines(every_s=10.0)
    with caplog.at_level(logging.INFO, logger="agentroll"):
        lines.start(40)
        lines.advance(RunStats(problems_skipped_done=30), ClientCounters())  # the runner's: the first line
        clock[0] += 0.5  # a resume that found every group done ended before its first tick
        lines.finish(RunStats(problems_skipped_done=40), ClientCounters())
        lines.finish(RunStats(problems_skipped_done=40), ClientCounters())  # said once
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[-1].startswith("progress: groups 40/40 (100%)"), said


def test_rows_refused_under_skip_invalid_are_settled_and_no_group_counted_twice():
    refused = RunStats(groups_written=4, invalid_rows=2)  # two rows refused as read
    assert refused.groups_settled == 6 and refused.rows_refused == 2
    ran = RunStats(groups_written=4, invalid_rows=3, groups_invalid=1)  # one of them turned invalid as it ran
    assert ran.groups_settled == 7 and ran.rows_refused == 2
    raised = RunStats(groups_written=4, groups_invalid=1)  # no --skip-invalid: the invalid group ended the run
    assert raised.groups_settled == 5 and raised.rows_refused == 0
