"""Reading a folder back: records and whole groups in manifest order, and following a live run that is killed
and restarted while the reader waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import zstandard

import agentroll
from agentroll.folder import ShardWriter
from agentroll.folder.shards import shard_groups
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, run_cli, write_problems


def generate_args(problems: Path, out: Path, url: str, *extra: str) -> list[str]:
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
        "--shard-size",
        "15",
        *extra,
    ]


def test_records_and_groups_come_back_in_manifest_order_whole(sim, problems, tmp_path):
    out = tmp_path / "out"
    assert run_cli(*generate_args(problems, out, sim.url)).returncode == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1
    lines = [json.loads(line) for s in manifest["shards"] for line in (out / s["file"]).read_text().splitlines()]
    assert list(agentroll.read_records(out)) == lines
    groups = list(agentroll.read_groups(out))
    assert [r for g in groups for r in g.records()] == lines
    assert [g.problem_id for g in groups] == list(dict.fromkeys(r["problem_id"] for r in lines))
    for group in groups:
        assert len(group.executions) == 2 and group.ok
        assert [e[0].sample_index for e in group.executions] == [0, 1]
        assert {s.rollout_id for s in group.executions[0]} != {s.rollout_id for s in group.executions[1]}
        assert group.problem.content_hash == group.executions[0][0].problem_hash


def test_a_merged_folder_reads_as_its_parts(sim, problems, tmp_path):
    for k in range(2):
        assert run_cli(*generate_args(problems, tmp_path / f"p{k}", sim.url, "--partition", f"{k}/2")).returncode == 0
    assert run_cli("merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "-o", str(tmp_path / "all")).returncode == 0
    merged = [g.problem_id for g in agentroll.read_groups(tmp_path / "all")]
    parts = [g.problem_id for k in range(2) for g in agentroll.read_groups(tmp_path / f"p{k}")]
    assert merged == parts and sorted(merged) == [f"p{i:03d}" for i in range(8)]


def test_following_a_live_run_that_is_killed_and_restarted_yields_each_group_once(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 30)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.02))
    server.start()
    out = tmp_path / "out"
    args = generate_args(problems, out, server.url, "--concurrency", "4")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    seen: list[agentroll.Group] = []
    errors: list[BaseException] = []
    first_group = threading.Event()

    def follow() -> None:
        try:
            for group in agentroll.read_groups(out, follow=True, poll_s=0.05, timeout_s=300):
                seen.append(group)
                first_group.set()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    run = None
    try:
        run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stderr=subprocess.DEVNULL, env=env)
        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert first_group.wait(120), "no group was followed"
        assert server.wait_for_completions(server.completions + 40, timeout=120)
        run.send_signal(signal.SIGKILL)  # mid-run, mid-group: the partial shard has a torn tail or none
        run.wait()
        assert reader.is_alive()  # the manifest does not say complete: the reader waits
        before = len(seen)
        assert 0 < before < 30
        rerun = run_cli(*args)
        assert rerun.returncode == 0, rerun.stderr.decode()
        reader.join(120)
        assert not reader.is_alive() and not errors, errors
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
        server.stop()
    counts = Counter(g.problem_id for g in seen)
    assert sorted(counts) == [f"p{i:03d}" for i in range(30)] and set(counts.values()) == {1}
    assert all(len(g.executions) == 2 and all(len(e) == e[0].rollout_size for e in g.executions) for g in seen)
    on_disk = {g.problem_id: [r["rollout_id"] for r in g.records()] for g in agentroll.read_groups(out)}
    assert {g.problem_id: [r["rollout_id"] for r in g.records()] for g in seen} == on_disk  # what was committed


def test_ordered_commits_groups_in_input_order(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 24)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.01), seed=2)
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(*generate_args(problems, out, server.url, "--ordered", "--concurrency", "16"))
        assert proc.returncode == 0, proc.stderr.decode()
        loose = run_cli(*generate_args(problems, tmp_path / "loose", server.url, "--concurrency", "16"))
        assert loose.returncode == 0
    finally:
        server.stop()
    assert [g.problem_id for g in agentroll.read_groups(out)] == [f"p{i:03d}" for i in range(24)]
    # without it, groups land as they finish (this check keeps the one above from passing by accident)
    assert sorted(g.problem_id for g in agentroll.read_groups(tmp_path / "loose")) == [f"p{i:03d}" for i in range(24)]


def test_a_named_consumer_holds_the_run_back_and_takes_every_group_once(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 20)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.01))
    server.start()
    out = tmp_path / "out"
    args = generate_args(problems, out, server.url, "--concurrency", "4", "--consumer", "trainer", "--max-ahead", "3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stderr=subprocess.PIPE, env=env)
    try:
        assert run.stderr is not None
        for line in run.stderr:  # the run says when it stops taking prompts for the consumer
            if b"waiting for consumer trainer" in line:
                break
        else:
            raise AssertionError("the run never waited for its consumer")
        assert run.poll() is None
        committed = sum(
            1
            for shard in out.glob("rollouts-*")  # finished shards and the partial one
            for _ in shard_groups(shard.read_bytes(), compressed=False)
        )
        ahead = 2 + 4 * 1  # the runner's groups in flight at --concurrency 4 with N=2, K=2
        assert 3 < committed <= 3 + ahead < 20  # held back, far from done
        taken = [
            g.problem_id
            for g in agentroll.read_groups(out, follow=True, poll_s=0.05, timeout_s=120, consumer="trainer")
        ]
        run.wait(120)
        assert run.returncode == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stderr.close()
        server.stop()
    assert sorted(taken) == [f"p{i:03d}" for i in range(20)]
    assert json.loads((out / ".agentroll" / "consumers" / "trainer").read_text())["groups"] == 20
    assert list(agentroll.read_groups(out, consumer="trainer")) == []  # nothing left for it

    first: list[str] = []
    for group in agentroll.read_groups(out, consumer="other"):
        first.append(group.problem_id)
        if len(first) == 5:
            break  # dies holding its 5th group: that one is not counted as consumed
    assert json.loads((out / ".agentroll" / "consumers" / "other").read_text())["groups"] == 4
    rest = [g.problem_id for g in agentroll.read_groups(out, consumer="other")]
    assert rest == [g.problem_id for g in agentroll.read_groups(out)][4:]  # resumes at the 5th: at least once


def test_zstd_shards_hold_the_same_groups_and_load_with_datasets(sim, problems, tmp_path):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    assert run_cli(*generate_args(problems, plain, sim.url, "--seed", "4")).returncode == 0
    proc = run_cli(*generate_args(problems, packed, sim.url, "--seed", "4", "--compression", "zstd"))
    assert proc.returncode == 0, proc.stderr.decode()
    files = sorted(p.name for p in packed.glob("rollouts-*"))
    assert files and all(name.endswith(".jsonl.zst") for name in files)
    for name in files:  # finished: the groups' frames joined into one
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress((packed / name).read_bytes())
        assert frame.eof and frame.unused_data == b""
    records = list(agentroll.read_records(packed))
    assert len(records) == json.loads((packed / "manifest.json").read_text())["records"]
    groups = list(agentroll.read_groups(packed))
    assert sorted(g.problem_id for g in groups) == sorted(g.problem_id for g in agentroll.read_groups(plain))
    assert all(len(g.executions) == 2 for g in groups)
    assert (
        sum(p.stat().st_size for p in packed.glob("rollouts-*"))
        < sum(p.stat().st_size for p in plain.glob("rollouts-*")) / 2
    )
    assert run_cli("merge", str(packed), "-o", str(tmp_path / "m"), "--copy", "--verify").returncode == 0
    assert [r["rollout_id"] for r in agentroll.read_records(tmp_path / "m")] == [r["rollout_id"] for r in records]
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(
        "json", data_files=[str(packed / f) for f in files], split="train", cache_dir=str(tmp_path / "hf")
    )
    assert len(loaded) == len(records) and loaded[0]["response_token_ids"] == records[0]["response_token_ids"]


def test_a_torn_zstd_frame_is_cut_at_recovery_and_its_group_redone(tmp_path):
    from .test_writer import crash, group

    writer = ShardWriter(tmp_path, {"model": "m"}, compression="zstd")
    writer.open()
    writer.commit(group("a"))
    writer.commit(group("b"))
    crash(writer)
    partial = next(tmp_path.glob("*.jsonl.zst.partial"))
    frame = zstandard.ZstdCompressor().compress(group("c").encode())
    with open(partial, "ab") as f:
        f.write(frame[: len(frame) // 2])
    writer = ShardWriter(tmp_path, {"model": "m"}, compression="zstd")
    assert set(writer.open()) == {"a", "b"}
    writer.commit(group("c"))
    writer.close(complete=True)
    assert [g.problem_id for g in agentroll.read_groups(tmp_path)] == ["a", "b", "c"]
    assert not list(tmp_path.glob("*.partial"))


def test_follow_into_head_prints_five_groups_of_a_live_run_and_exits_quietly(tmp_path):
    """`agentroll follow DIR | head -n 5` through a real pipe: five groups, a line each, of a run held back by
    the follower's consumer (so it is live throughout); the follower ends as SIGPIPE would (141) with nothing on
    stderr, its position counts the groups the reader read (none left unread in the pipe), and a second follower
    of that name takes the rest to the end: every group once."""
    problems = write_problems(tmp_path / "p.jsonl", 20)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.01))
    server.start()
    out = tmp_path / "out"
    args = generate_args(problems, out, server.url, "--concurrency", "4", "--consumer", "trainer", "--max-ahead", "3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stderr=subprocess.PIPE, env=env)
    script = (
        '"$PY" -m agentroll follow "$OUT" --consumer trainer 2>"$ERR" | head -n 5; echo "${PIPESTATUS[0]}" >"$CODE"'
    )
    paths = {"PY": sys.executable, "OUT": str(out), "ERR": str(tmp_path / "err"), "CODE": str(tmp_path / "code")}
    try:
        assert run.stderr is not None
        for line in run.stderr:
            if b"waiting for consumer trainer" in line:
                break
        else:
            raise AssertionError("the run never waited for its consumer")
        piped = subprocess.run(["bash", "-c", script], capture_output=True, timeout=120, env={**env, **paths})
        assert run.poll() is None  # still held back by the consumer: the follower read a live run
        lines = piped.stdout.splitlines()
        taken = json.loads((out / ".agentroll" / "consumers" / "trainer").read_text())["groups"]
        rest = [
            g.problem_id
            for g in agentroll.read_groups(out, follow=True, poll_s=0.05, timeout_s=120, consumer="trainer")
        ]
        run.wait(120)
        assert run.returncode == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stderr.close()
        server.stop()
    assert len(lines) == 5
    groups = [json.loads(line) for line in lines]
    for group in groups:
        assert group["records"] and {r["problem_id"] for r in group["records"]} == {group["problem_id"]}
    head = [g["problem_id"] for g in groups]
    assert len(set(head)) == 5
    assert (tmp_path / "code").read_text().strip() == "141" and (tmp_path / "err").read_text() == ""
    assert taken == 5 and sorted(head + rest) == [
        f"p{i:03d}" for i in range(20)
    ]  # each group once: none lost in the pipe
    assert json.loads((out / ".agentroll" / "consumers" / "trainer").read_text())["groups"] == 20
    whole = run_cli("follow", str(out))  # a complete folder: every group, then exit 0
    assert whole.returncode == 0 and [json.loads(x)["problem_id"] for x in whole.stdout.splitlines()][:5] == head
