"""The call journal: a stop loses only the calls in flight; a rerun replays the rest, token for token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import agentroll
from agentroll.folder import Layout
from agentroll.folder.journal import Journal
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, generations, write_problems

ANSWER = {"token_ids": [5, 6, 7], "logprobs": [-0.1, -0.2, -0.3], "finish_reason": "stop"}


def test_kept_calls_come_back_and_settled_ones_go(tmp_path):
    journal = Journal(tmp_path, {"api": "completions"})
    assert journal.open() == 0
    journal.put("a/0/solver/0", "d1", ("a", "h"), ANSWER)
    journal.put("b/0/solver/0", "d2", ("b", "h"), {**ANSWER, "token_ids": [9]})
    journal.settle("a", "h")
    journal.close()
    again = Journal(tmp_path, {"api": "completions"})
    assert again.open() == 1
    assert again.get("a/0/solver/0", "d1") is None
    assert again.get("b/0/solver/0", "d2") == {**ANSWER, "token_ids": [9]}
    assert again.get("b/0/solver/0", "another request") is None  # the digest of what was sent must match
    assert again.replayed == 1


def test_a_torn_tail_is_cut_and_what_came_before_is_kept(tmp_path):
    journal = Journal(tmp_path)
    journal.open()
    journal.put("k1", "d", ("a", "h"), ANSWER)
    journal.put("k2", "d", ("a", "h"), ANSWER)
    journal.close()
    segment = next(tmp_path.glob("calls-*.jsonl"))
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-25])  # a kill in the middle of the second line
    again = Journal(tmp_path)
    assert again.open() == 1 and again.get("k1", "d") == ANSWER and again.get("k2", "d") is None
    assert segment.read_bytes() == whole[: whole.index(b"\n") + 1]
    again.put("k3", "d", ("a", "h"), ANSWER)  # appended after the cut, not after the torn bytes
    again.close()
    third = Journal(tmp_path)
    assert third.open() == 2 and third.get("k3", "d") == ANSWER


def test_entries_of_groups_already_stored_are_dropped_on_open(tmp_path):
    journal = Journal(tmp_path)
    journal.open()
    for pid in ("a", "b"):
        journal.put(f"{pid}-k", "d", (pid, "h"), ANSWER)
    journal.close()
    again = Journal(tmp_path)
    assert again.open(done={"a": "h"}) == 1 and again.get("a-k", "d") is None and again.get("b-k", "d") == ANSWER
    again.close()
    changed = Journal(tmp_path)
    assert changed.open(done={"b": "another row under that id"}) == 2  # not the same row: b is still to run
    changed.close()


def test_a_journal_of_another_server_set_up_is_discarded(tmp_path):
    journal = Journal(tmp_path, {"vllm_version": "0.31"})
    journal.open()
    journal.put("k", "d", ("a", "h"), ANSWER)
    journal.close()
    upgraded = Journal(tmp_path, {"vllm_version": "0.32"})
    assert upgraded.open() == 0 and upgraded.get("k", "d") is None
    assert not list(tmp_path.glob("calls-*.jsonl"))


def test_dead_segments_are_deleted_and_mostly_dead_ones_compacted(tmp_path):
    journal = Journal(tmp_path, segment_bytes=400)
    journal.open()
    for i in range(40):
        journal.put(f"k{i}", "d", (f"p{i}", "h"), ANSWER)
        if i % 10:
            journal.settle(f"p{i}", "h")  # one call in ten stays, for a group still in flight
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("calls-*.jsonl"))
    assert journal.live == 4 and on_disk < 12 * 160  # about the live entries, not the 40 written
    journal.close()
    again = Journal(tmp_path)
    assert again.open() == 4
    assert all(again.get(f"k{i}", "d") == ANSWER for i in range(0, 40, 10))


def test_failed_groups_keep_their_calls_until_the_bound_sheds_the_oldest(tmp_path):
    journal = Journal(tmp_path, segment_bytes=1 << 20, max_bytes=2000)
    journal.open()
    for i in range(30):
        journal.put(f"k{i}", "d", (f"p{i}", "h"), ANSWER)
        journal.settle(f"p{i}", "h", failed=True)
    assert 0 < journal.live < 30
    assert journal.get("k29", "d") == ANSWER and journal.get("k0", "d") is None
    journal.close()


def args(problems: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentroll",
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
        "--seed",
        "3",
        *extra,
    ]


def journal_lines(out: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in Layout(out).journal.glob("calls-*.jsonl"))


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_stop_loses_only_the_calls_in_flight(tmp_path, how):
    problems = write_problems(tmp_path / "p.jsonl", 6)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.15), max_running=3)
    server.start()
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    try:
        run = subprocess.Popen(args(problems, out, server.url, "--concurrency", "3"), env=env, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while journal_lines(out) < 6 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # another process's progress: its files are what there is to watch
        assert run.poll() is None, "the run ended before the journal held calls"
        run.send_signal(how)
        run.communicate(timeout=60)
        first = generations(server)
        kept = {(tuple(e["request"]["prompt"]), e["request"]["seed"]): e["response"] for e in first}
        server.log.clear()
        rerun = subprocess.run(
            args(problems, out, server.url, "--concurrency", "3"), env=env, capture_output=True, timeout=120
        )
        assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
        second = generations(server)
    finally:
        server.stop()
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["calls_replayed"] > 0
    asked_again = [e for e in second if (tuple(e["request"]["prompt"]), e["request"]["seed"]) in kept]
    # in flight when it stopped: at most --concurrency calls are asked a second time
    assert len(asked_again) <= 3, len(asked_again)
    groups = list(agentroll.read_groups(out))
    assert Counter(g.problem_id for g in groups) == Counter(f"p{i:03d}" for i in range(6))
    records = [s for g in groups for e in g.executions for s in e]
    assert len(first) + len(second) == len(records) + len(asked_again)  # nothing asked twice but those
    asked_now = {(tuple(e["request"]["prompt"]), e["request"]["seed"]) for e in second}
    for sample in records:  # a call not asked again is the first run's answer, token for token
        call = (tuple(sample.prompt_token_ids), sample.sampling["seed"])
        if call not in asked_now:
            choice = kept[call]["choices"][0]
            assert sample.response_token_ids == choice["token_ids"]
            assert sample.response_logprobs == choice["logprobs"]["token_logprobs"]
    assert validate(out).ok
    assert journal_lines(out) == 0  # every group committed: nothing kept


def test_overwrite_discards_the_journal(tmp_path):
    from agentroll.folder import ShardWriter

    journal = Journal(Layout(tmp_path).journal)
    journal.open()
    journal.put("k", "d", ("a", "h"), ANSWER)
    journal.close()
    writer = ShardWriter(tmp_path, {"model": "m"}, overwrite=True)
    writer.open()
    writer.close(complete=True)
    again = Journal(Layout(tmp_path).journal)
    assert again.open() == 0
    again.close()


SERVER = {
    "api": "completions",
    "priority": True,
    "vllm_version": "0.32.0",
    "root": "/models/a",
    "revision": None,
    "logprobs_mode": "raw_logprobs",
    "tokenizer_sha256": "t1",
    "chat_template_sha256": "c1",
    "rendered_prompts_sha256": "r1",
}


def test_the_journal_is_kept_across_changes_that_cannot_change_a_record():
    from agentroll.engine.handshake import journal_fingerprint

    kept = journal_fingerprint("m", SERVER, routes=False)
    for harmless in ({"priority": False}, {"root": "/mnt/elsewhere/a"}, {"vllm_version": "0.32.1"}):
        assert journal_fingerprint("m", {**SERVER, **harmless}, routes=False) == kept, harmless
    for telling in (
        {"api": "generate"},
        {"logprobs_mode": "processed_logprobs"},
        {"tokenizer_sha256": "t2"},
        {"chat_template_sha256": "c2"},
        {"revision": "0" * 40},
    ):
        assert journal_fingerprint("m", {**SERVER, **telling}, routes=False) != kept, telling
    assert journal_fingerprint("other", SERVER, routes=False) != kept
    assert journal_fingerprint("m", SERVER, routes=True) != kept


def test_a_generator_with_a_journal_replays_the_calls_an_earlier_one_left(tmp_path):
    """The Python API: stop after a few groups; a new Generator on the same journal (here with the server's
    priority turned off, which changes no record) replays the finished calls of the groups left unfinished."""
    import asyncio

    import orjson

    problems = write_problems(tmp_path / "p.jsonl", 8)
    rows = [orjson.loads(line) for line in problems.read_bytes().splitlines()]
    server = SimServer(
        script=Script.from_jsonl(problems), faults=Faults(latency_s=0.05), max_running=4, scheduling_policy="priority"
    )
    server.start()
    options = {"base_url": server.url, "tokenizer": TOKENIZER, "reward": "exact", "seed": 3, "concurrency": 4}

    async def first() -> list[str]:
        async with agentroll.Generator(journal=tmp_path / "journal", **options) as gen:
            assert gen.server["priority"] is True
            handed: list[str] = []
            async for group in gen.stream(rows):
                handed.append(group.problem_id)
                gen.settle(group)  # stored by the caller
                assert gen.journal is not None
                if gen.journal.live:
                    break  # the groups still running are cancelled: their finished calls stay journaled
            assert len(handed) < len(rows)
            return handed

    async def second(rest: list[dict]) -> tuple[int, int, int]:
        async with agentroll.Generator(journal=tmp_path / "journal", server_priority="off", **options) as gen:
            kept = gen.open_journal()
            groups = [g async for g in gen.stream(rest)]
            assert all(g.status == "complete" for g in groups) and len(groups) == len(rest)
            return kept, gen.stats.calls_replayed, len(generations(server))

    try:
        handed = asyncio.run(first())
        asked_first = len(generations(server))
        server.log.clear()
        kept, replayed, asked_second = asyncio.run(second([r for r in rows if r["id"] not in handed]))
    finally:
        server.stop()
    assert kept > 0 and replayed == kept
    assert asked_first + asked_second < 8 * 3 * 4 + 3  # the replayed calls were not asked again (one per record)


def test_a_finished_call_costs_one_append_and_a_group_one_tombstone(tmp_path, monkeypatch):
    """The journal's price on the hot path, counted: one line per finished call, holding its answer but not its
    prompt (the request's, which the digest covers), and one tombstone per stored group; nothing else."""
    import asyncio

    import orjson

    lines: list[bytes] = []
    write = Journal._write

    def counted(self: Journal, line: bytes) -> int:
        lines.append(line)
        return write(self, line)

    monkeypatch.setattr(Journal, "_write", counted)
    problems = write_problems(tmp_path / "p.jsonl", 5)
    rows = [orjson.loads(line) for line in problems.read_bytes().splitlines()]
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.01), max_running=4)
    server.start()
    options = {"base_url": server.url, "tokenizer": TOKENIZER, "reward": "exact", "seed": 3, "concurrency": 4}

    async def run() -> int:
        async with agentroll.Generator(journal=tmp_path / "journal", **options) as gen:
            groups = 0
            async for group in gen.stream(rows):
                gen.settle(group)
                groups += 1
            return groups

    try:
        groups = asyncio.run(run())
        calls = generations(server)
    finally:
        server.stop()
    entries = [orjson.loads(line) for line in lines]
    answers = [e for e in entries if "c" in e]
    assert len(answers) == len(calls) > 0 and len(entries) == len(calls) + groups
    assert all("prompt_token_ids" not in e["c"] and e["c"]["token_ids"] for e in answers)
    assert sorted(len(e["c"]["token_ids"]) for e in answers) == sorted(
        len(c["response"]["choices"][0]["token_ids"]) for c in calls
    )
