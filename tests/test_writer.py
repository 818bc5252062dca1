"""Group-atomic writing and recovery, tested deterministically: the crash states are built byte by byte."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agentroll.errors import OutputError
from agentroll.folder import ShardWriter
from agentroll.folder.layout import MANIFEST
from agentroll.folder.shards import scan_groups
from agentroll.inputs import Problem
from agentroll.record.group import Group, annotate
from agentroll.record.schema import Sample

SETTINGS = {"model": "m", "samples_per_prompt": 2}


def sample(problem: Problem, k: int, rollout: str, stage: str, worker: int, size: int) -> Sample:
    return Sample(
        problem_id=problem.id,
        problem_hash=problem.content_hash,
        rollout_id=rollout,
        sample_index=k,
        group_size=2,
        stage=stage,
        worker=worker,
        prompt="p",
        prompt_token_ids=[1, 2],
        response="r",
        response_token_ids=[3, 4],
        response_logprobs=[-0.1, -0.2],
        loss_mask=[1, 1],
        status="completed",
        finish_reason="stop",
        stop_reason=None,
        content="c",
        raw_reward=1.0,
        reward=1.0,
        label="1",
        model="m",
        endpoint="e",
        latency_s=0.1,
        attempts=1,
        rollout_size=size,
    )


def group(pid: str, sizes: tuple[int, int] = (3, 2)) -> Group:
    problem = Problem(id=pid, prompt=f"problem {pid}", label="1", metadata={}, line=1)
    executions = [
        [sample(problem, k, f"{pid}-{k}", "solver", w, size) for w in range(size)] for k, size in enumerate(sizes)
    ]
    annotate(executions, [1.0, 0.0])
    return Group(problem, executions)


def crash(writer: ShardWriter) -> None:
    """What a SIGKILL leaves: no close, no final manifest, the lock released by the kernel."""
    if writer._file is not None:
        writer._file.close()
    assert writer._lock_fd is not None
    os.close(writer._lock_fd)


def open_writer(folder: Path, shard_size: int = 1000) -> tuple[ShardWriter, dict[str, str]]:
    writer = ShardWriter(folder, SETTINGS, shard_size)
    return writer, writer.open()


def lines_of(folder: Path) -> list[dict]:
    return [
        json.loads(line) for shard in sorted(folder.glob("rollouts-*.jsonl")) for line in shard.read_text().splitlines()
    ]


def test_a_group_is_one_block_and_scan_finds_whole_groups_only():
    data = group("a").encode() + group("b").encode()
    kept, records, executions, keys = scan_groups(data)
    assert (kept, records, executions) == (len(data), 10, 4)
    assert [k for k, _ in keys] == ["a", "b"]
    torn = group("a").encode() + group("b").encode()[:-7]
    assert scan_groups(torn)[0] == len(group("a").encode())
    one_execution_of_b = group("b").encode().split(b"\n")[:3]  # b's first execution, whole, and no more
    short = group("a").encode() + b"\n".join(one_execution_of_b) + b"\n"
    assert scan_groups(short)[3] == [("a", group("a").problem.content_hash)]


@pytest.mark.parametrize("cut", ["torn line", "one whole execution of two"])
def test_a_crash_inside_a_group_write_drops_that_whole_group_and_it_is_redone(tmp_path, cut):
    writer, _ = open_writer(tmp_path)
    writer.commit(group("a"))
    writer.commit(group("b"))
    crash(writer)
    partial = next(tmp_path.glob("*.partial"))
    block = group("c").encode()
    tail = block[: len(block) // 2] if cut == "torn line" else b"".join(block.splitlines(True)[:3])
    with open(partial, "ab") as f:
        f.write(tail)

    writer, done = open_writer(tmp_path)
    assert set(done) == {"a", "b"}  # c is not done: a rerun generates it
    writer.commit(group("c"))
    writer.close(complete=True)
    records = lines_of(tmp_path)
    per_problem = {pid: sum(r["problem_id"] == pid for r in records) for pid in "abc"}
    assert per_problem == {"a": 5, "b": 5, "c": 5} and not list(tmp_path.glob("*.partial"))
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert (manifest["records"], manifest["executions"], manifest["groups"]) == (15, 6, 3)


def test_a_finished_shard_missing_from_the_manifest_is_adopted(tmp_path):
    writer, _ = open_writer(tmp_path, shard_size=4)
    writer.commit(group("a"))  # 5 records >= 4: the shard is finished and the manifest written
    manifest_before = (tmp_path / MANIFEST).read_bytes()
    writer.commit(group("b"))
    crash(writer)
    # the run died after renaming shard 1 but before its keys and manifest: rebuild that state by hand
    shutil.rmtree(tmp_path / ".agentroll" / "keys")
    (tmp_path / MANIFEST).write_bytes(manifest_before)
    assert {p.name for p in tmp_path.glob("rollouts-*.jsonl")} == {"rollouts-00000.jsonl", "rollouts-00001.jsonl"}

    writer, done = open_writer(tmp_path)
    writer.close(complete=True)
    assert set(done) == {"a", "b"}
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert [s["file"] for s in manifest["shards"]] == ["rollouts-00000.jsonl", "rollouts-00001.jsonl"]
    assert [s["groups"] for s in manifest["shards"]] == [1, 1] and manifest["records"] == 10


def test_a_damaged_finished_shard_is_refused_by_name_and_redone_once_moved_away(tmp_path):
    writer, _ = open_writer(tmp_path, shard_size=4)
    for pid in "abc":
        writer.commit(group(pid))
    writer.close(complete=True)
    damaged = tmp_path / "rollouts-00001.jsonl"
    damaged.write_bytes(damaged.read_bytes()[:-20])
    with pytest.raises(OutputError, match=r"rollouts-00001\.jsonl is damaged"):
        open_writer(tmp_path)
    damaged.rename(tmp_path / "moved-away.bin")
    writer, done = open_writer(tmp_path)
    assert set(done) == {"a", "c"}  # b's shard is gone, so b is generated again
    writer.commit(group("b"))
    writer.close(complete=True)
    assert sorted({r["problem_id"] for r in lines_of(tmp_path)}) == ["a", "b", "c"]


def test_an_unknown_shard_that_is_not_whole_groups_is_refused(tmp_path):
    writer, _ = open_writer(tmp_path)
    writer.close(complete=False)  # a folder of this run's, with its manifest, and then a shard it does not know
    (tmp_path / "rollouts-00000.jsonl").write_bytes(group("a").encode()[:-30])
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl is damaged after byte 0"):
        open_writer(tmp_path)


def test_a_failed_group_is_never_committed_and_a_filtered_one_is_remembered(tmp_path):
    writer, _ = open_writer(tmp_path)
    failed = Group(group("a").problem, [], "failed", "selector call failed: HTTP 500")
    with pytest.raises(ValueError, match="a failed group is not committed"):
        writer.commit(failed)
    uniform = group("u")
    uniform.status = "filtered"
    writer.commit(uniform)
    writer.close(complete=True)
    _, done = open_writer(tmp_path)
    assert done == {"u": uniform.problem.content_hash} and lines_of(tmp_path) == []


def test_records_carry_their_problem_and_stage_group_baselines():
    g = group("a", sizes=(3, 2))
    for k, samples in enumerate(g.executions):
        for w, s in enumerate(samples):
            s.reward = float(k * 10 + w)  # execution 0: 0 1 2; execution 1: 10 11
    annotate(g.executions, [1.0, 0.0])
    records = g.records()
    rewards = [0.0, 1.0, 2.0, 10.0, 11.0]  # every sample here is a solver: one (problem, stage) group
    mean = sum(rewards) / 5
    std = (sum((r - mean) ** 2 for r in rewards) / 5) ** 0.5
    assert {(r["stage_group_size"], r["stage_group_reward_mean"], r["stage_group_reward_std"]) for r in records} == {
        (5, mean, std)
    }


def test_stage_groups_are_per_stage_not_per_problem():
    g = group("a", sizes=(3, 2))
    for k, samples in enumerate(g.executions):
        samples[-1].stage = "rewriter"  # execution 0: solver solver rewriter; execution 1: solver rewriter
        samples[-1].reward = 5.0 + k
    annotate(g.executions, [1.0, 0.0])
    by_stage = {(r["stage"], r["stage_group_size"], r["stage_group_reward_mean"]) for r in g.records()}
    assert by_stage == {("solver", 3, 1.0), ("rewriter", 2, 5.5)}


def test_damage_inside_a_partial_shard_is_said_with_the_lines_dropped(tmp_path, caplog):
    writer, _ = open_writer(tmp_path)
    for pid in "abc":
        writer.commit(group(pid))
    crash(writer)
    partial = next(tmp_path.glob("*.partial"))
    lines = partial.read_bytes().splitlines(True)
    lines[6] = b"not json\n"  # inside b (a is lines 0-4): b and c, whole on disk, go with it
    partial.write_bytes(b"".join(lines))
    with caplog.at_level("WARNING", logger="agentroll"):
        _, done = open_writer(tmp_path)
    assert set(done) == {"a"}
    (said,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "10 whole line(s)" in said and "line 6 on" in said and partial.name in said


def test_the_line_a_stop_tore_is_dropped_without_a_warning(tmp_path, caplog):
    writer, _ = open_writer(tmp_path)
    writer.commit(group("a"))
    crash(writer)
    partial = next(tmp_path.glob("*.partial"))
    with open(partial, "ab") as f:
        f.write(group("b").encode()[:40])
    with caplog.at_level("WARNING", logger="agentroll"):
        _, done = open_writer(tmp_path)
    assert set(done) == {"a"} and not [r for r in caplog.records if "dropped" in r.getMessage()]


def test_damage_inside_a_zstd_partial_shard_is_said_and_a_torn_last_frame_is_not(tmp_path, caplog):
    folders = {}
    for name in ("damaged", "torn"):
        folder = tmp_path / name
        writer = ShardWriter(folder, SETTINGS, compression="zstd")
        writer.open()
        sizes = []
        for pid in "abc":
            writer.commit(group(pid))
            sizes.append(next(folder.glob("*.partial")).stat().st_size)
        crash(writer)
        folders[name] = (folder, next(folder.glob("*.partial")), sizes)
    folder, partial, sizes = folders["damaged"]
    data = bytearray(partial.read_bytes())
    data[(sizes[0] + sizes[1]) // 2] ^= 0xFF  # inside b's frame: b and c, whole on disk, go with it
    partial.write_bytes(bytes(data))
    folder, partial, sizes = folders["torn"]
    partial.write_bytes(partial.read_bytes()[: sizes[2] - 5])  # c's frame cut short, as a kill leaves it
    with caplog.at_level("WARNING", logger="agentroll"):
        damaged = ShardWriter(folders["damaged"][0], SETTINGS, compression="zstd").open()
        torn = ShardWriter(folders["torn"][0], SETTINGS, compression="zstd").open()
    assert set(damaged) == {"a"} and set(torn) == {"a", "b"}
    (said,) = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    damaged_name = folders["damaged"][1].name
    assert damaged_name in said and f"{folders['damaged'][2][2] - folders['damaged'][2][0]} bytes" in said
    assert f"byte {folders['damaged'][2][0]} on" in said
