"""Routed experts in a sidecar beside each shard: round trip, one copy of a prompt's routes per shard, crash
recovery, the resume size check, merge, validate, inspect and a live follower. Crash states are built byte by
byte, as in test_writer."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zstandard
from rich.console import Console

from agentroll.errors import OutputError, UsageError
from agentroll.folder import ShardWriter, StdoutWriter, merge, read_groups, read_records
from agentroll.folder.layout import MANIFEST
from agentroll.inputs import Problem
from agentroll.record.group import Group, annotate
from agentroll.record.schema import Sample
from agentroll.tools.inspect import inspect
from agentroll.tools.validate import validate

SETTINGS = {"model": "m", "samples_per_prompt": 2}
LAYERS, TOP_K = 3, 2


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


class Model:
    """Routes as a MoE model returns them: a prompt's rows depend on its tokens only, a response's are new."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.prompts: dict[tuple[int, ...], np.ndarray] = {}

    def routes(self, prompt_ids: list[int], response_len: int) -> bytes:
        prompt = self.prompts.setdefault(tuple(prompt_ids), self.rows(len(prompt_ids)))
        return npy(np.concatenate([prompt, self.rows(response_len - 1)]))

    def rows(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 256, size=(n, LAYERS, TOP_K), dtype=np.uint8)


def sample(
    problem: Problem, k: int, stage: str, worker: int, prompt_ids: list[int], response_len: int, routes: Any
) -> Sample:
    return Sample(
        problem_id=problem.id,
        problem_hash=problem.content_hash,
        rollout_id=f"{problem.id}-{k}",
        sample_index=k,
        group_size=2,
        stage=stage,
        worker=worker,
        prompt="p",
        prompt_token_ids=prompt_ids,
        response="r",
        response_token_ids=list(range(7, 7 + response_len)),
        response_logprobs=[-0.5] * response_len,
        loss_mask=[1] * response_len,
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
        routed_experts=routes,
    )


def group(pid: str, model: Model | None) -> Group:
    """Two executions of two solvers (all four share the solver prompt) and a rewriter (its own prompt per
    execution). One solver response is a single token: its response part has no rows."""
    problem = Problem(id=pid, prompt=f"problem {pid}", label="1", metadata={}, line=1)
    solver_prompt = [ord(c) for c in pid] + list(range(1, 100))
    executions = []
    for k in range(2):
        plan = [("solver", w, solver_prompt, 1 + w + 2 * k) for w in range(2)]
        plan.append(("rewriter", 0, [*solver_prompt, 50 + k], 3))
        executions.append(
            [sample(problem, k, stage, w, ids, n, model.routes(ids, n) if model else None) for stage, w, ids, n in plan]
        )
    for samples in executions:
        for s in samples:
            s.rollout_size = len(samples)
    annotate(executions, [0.0, 0.0])
    return Group(problem, executions)


def expected(groups: list[Group]) -> dict[tuple[str, str, int], np.ndarray]:
    return {
        (s.rollout_id, s.stage, s.worker): np.load(io.BytesIO(s.routed_experts))
        for g in groups
        for e in g.executions
        for s in e
        if s.routed_experts is not None
    }


def assert_same(records: list[dict[str, Any]], groups: list[Group]) -> None:
    want = expected(groups)
    got = {
        (r["rollout_id"], r["stage"], r["worker"]): r["routed_experts"]
        for r in records
        if r["routed_experts"] is not None
    }
    assert got.keys() == want.keys()
    for key, array in want.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape
        assert np.array_equal(got[key], array), key


def write(folder: Path, groups: list[Group], compression: str = "none", shard_size: int = 1000) -> ShardWriter:
    writer = ShardWriter(folder, SETTINGS, shard_size, compression=compression)
    writer.open()
    for g in groups:
        writer.commit(g)
    return writer


def crash(writer: ShardWriter) -> None:
    """What a SIGKILL leaves: no close, no final manifest, the lock released by the kernel."""
    for f in (writer._file, writer._routes_file):
        if f is not None:
            f.close()
    assert writer._lock_fd is not None
    os.close(writer._lock_fd)


def partial_records(folder: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in next(folder.glob("*.jsonl.partial")).read_bytes().splitlines()]


def reference_end(records: list[dict[str, Any]]) -> int:
    """The largest sidecar byte the records reference, computed here from the documented reference shape."""
    spans = [span for r in records if r["routed_experts"] for span in r["routed_experts"].values() if span]
    return max(offset + size for offset, size in spans)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_routes_round_trip_and_a_prompt_is_stored_once_per_shard(tmp_path, compression):
    model = Model()
    groups = [group("a", model), group("b", None), group("c", model)]
    write(tmp_path, groups, compression).close(complete=True)

    shard = "rollouts-00000.jsonl" + (".zst" if compression == "zstd" else "")
    assert sorted(p.name for p in tmp_path.glob("rollouts-*")) == sorted([shard, "rollouts-00000.routes"])
    sidecar = (tmp_path / "rollouts-00000.routes").read_bytes()
    entry = json.loads((tmp_path / MANIFEST).read_text())["shards"][0]
    assert entry["routes"] == {
        "file": "rollouts-00000.routes",
        "bytes": len(sidecar),
        "sha256": hashlib.sha256(sidecar).hexdigest(),
    }

    records = list(read_records(tmp_path, routes=True))
    assert_same(records, groups)
    assert all(r["routed_experts"] is None for r in records if r["problem_id"] == "b")
    # the group objects the writer was given still hold their .npy bytes
    assert all(isinstance(s.routed_experts, bytes) for s in groups[0].executions[0])

    refs = [r["routed_experts"] for r in read_records(tmp_path) if r["routed_experts"] is not None]
    prompts = {tuple(ref["prompt"]) for ref in refs}
    assert len(refs) == 12 and len(prompts) == 6  # per problem: one solver prompt, two rewriter prompts
    blobs = prompts | {tuple(ref["response"]) for ref in refs}
    assert sum(size for _, size in blobs) == len(sidecar)  # the sidecar is exactly these blobs, nothing twice
    naive = sum(len(npy(a)) for a in expected(groups).values())
    assert len(sidecar) < naive
    for offset, size in blobs:  # each span is a whole .npy file, as documented
        assert np.load(io.BytesIO(sidecar[offset : offset + size])).shape[1:] == (LAYERS, TOP_K)

    [first] = [g for g in read_groups(tmp_path, routes=True) if g.problem_id == "a"]
    solver = first.executions[1][1]
    assert solver.routed_experts.shape == (
        len(solver.prompt_token_ids) + len(solver.response_token_ids) - 1,
        LAYERS,
        TOP_K,
    )
    assert validate(tmp_path).ok


def test_routes_whose_rows_do_not_fit_the_tokens_are_stored_whole(tmp_path):
    g = group("a", Model())
    odd = g.executions[0][2]
    odd.routed_experts = npy(np.arange(2 * LAYERS * TOP_K, dtype=np.uint16).reshape(2, LAYERS, TOP_K))
    write(tmp_path, [g]).close(complete=True)
    record = next(r for r in read_records(tmp_path) if r["rollout_id"] == "a-0" and r["stage"] == "rewriter")
    assert set(record["routed_experts"]) == {"rows"}
    assert_same(list(read_records(tmp_path, routes=True)), [g])
    report = validate(tmp_path)
    assert report.ok and any("stored whole" in w for w in report.warnings)


def test_routes_that_are_not_an_integer_array_are_refused_before_anything_is_written(tmp_path):
    writer = write(tmp_path, [group("a", Model())])
    for bad, says in (
        (b"not npy", "not a .npy array"),
        (npy(np.zeros((9, 3, 2), np.float32)), "integer array"),
        ({"rows": [0, 10]}, "another folder's routes sidecar"),
    ):
        g = group("b", Model())
        g.executions[1][0].routed_experts = bad
        with pytest.raises(ValueError, match=says):
            writer.commit(g)
    writer.close(complete=True)
    assert [r["problem_id"] for r in read_records(tmp_path)] == ["a"] * 6
    assert validate(tmp_path).ok


def test_a_crash_keeps_whole_groups_and_cuts_the_sidecar_to_what_they_reference(tmp_path):
    model = Model()
    groups = [group(pid, model) for pid in "abc"]
    writer = write(tmp_path, groups)
    crash(writer)
    # the run died while writing c: its routes are on disk, its records torn in the middle
    records = partial_records(tmp_path)
    partial = next(tmp_path.glob("*.jsonl.partial"))
    data = partial.read_bytes()
    c_start = len(b"".join(line + b"\n" for line in data.splitlines()[:12]))
    partial.write_bytes(data[: c_start + (len(data) - c_start) // 2])
    side = tmp_path / "rollouts-00000.routes.partial"
    before = side.read_bytes()
    kept_end = reference_end(records[:12])
    assert kept_end < len(before)  # c's blobs are there, unreferenced

    writer = ShardWriter(tmp_path, SETTINGS)
    done = writer.open()
    assert set(done) == {"a", "b"}
    assert (tmp_path / "rollouts-00000.routes").read_bytes() == before[:kept_end]
    assert not list(tmp_path.glob("*.partial"))
    writer.commit(groups[2])  # redone, into a new shard with a sidecar of its own
    writer.close(complete=True)
    assert (tmp_path / "rollouts-00001.routes").exists()
    assert_same(list(read_records(tmp_path, routes=True)), groups)
    assert validate(tmp_path).ok


def test_a_group_whose_routes_did_not_reach_the_disk_is_dropped(tmp_path):
    model = Model()
    groups = [group(pid, model) for pid in "ab"]
    crash(write(tmp_path, groups))
    side = tmp_path / "rollouts-00000.routes.partial"
    records = partial_records(tmp_path)
    side.write_bytes(side.read_bytes()[:-10])  # b's last blob torn (its records reached the disk, it did not)
    writer = ShardWriter(tmp_path, SETTINGS)
    assert set(writer.open()) == {"a"}
    writer.close(complete=True)
    assert (tmp_path / "rollouts-00000.routes").stat().st_size == reference_end(records[:6])
    assert_same(list(read_records(tmp_path, routes=True)), groups[:1])


def test_a_crash_between_renaming_the_sidecar_and_its_shard_is_recovered(tmp_path):
    groups = [group(pid, Model()) for pid in "ab"]
    crash(write(tmp_path, groups))
    # _finish_file renames the sidecar first: the run died before the shard followed it
    os.replace(tmp_path / "rollouts-00000.routes.partial", tmp_path / "rollouts-00000.routes")
    writer = ShardWriter(tmp_path, SETTINGS)
    assert set(writer.open()) == {"a", "b"}
    writer.close(complete=True)
    assert_same(list(read_records(tmp_path, routes=True)), groups)


def test_a_failed_write_cuts_the_sidecar_back_and_the_next_group_lands_right(tmp_path):
    model = Model()
    groups = [group(pid, model) for pid in "ab"]
    writer = write(tmp_path, groups[:1])

    class Full:  # the disk fills up as b's records are written, after its routes
        def __init__(self, f: Any) -> None:
            self.f, self.failed = f, False

        def write(self, data: Any) -> int:
            if not self.failed:
                self.failed = True
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    writer._file = Full(writer._file)
    with pytest.raises(OutputError, match="No space left"):
        writer.commit(groups[1])
    writer.commit(groups[1])
    writer.close(complete=True)
    refs = list(read_records(tmp_path))
    assert (tmp_path / "rollouts-00000.routes").stat().st_size == reference_end(refs)
    assert_same(list(read_records(tmp_path, routes=True)), groups)
    assert validate(tmp_path).ok


def test_a_finished_sidecar_of_another_size_than_the_manifest_says_is_refused(tmp_path):
    write(tmp_path, [group(pid, Model()) for pid in "ab"], shard_size=6).close(complete=True)
    side = tmp_path / "rollouts-00001.routes"
    side.write_bytes(side.read_bytes() + b"\0")
    with pytest.raises(OutputError, match=r"rollouts-00001\.routes \(routes of rollouts-00001\.jsonl\) is damaged"):
        ShardWriter(tmp_path, SETTINGS).open()
    side.unlink()
    with pytest.raises(OutputError, match="missing where the manifest says"):
        ShardWriter(tmp_path, SETTINGS).open()


def test_a_finished_shard_adopted_after_a_crash_keeps_its_sidecar(tmp_path):
    groups = [group(pid, Model()) for pid in "ab"]
    writer = write(tmp_path, groups[:1], shard_size=6)
    manifest_before = (tmp_path / MANIFEST).read_bytes()
    writer.commit(groups[1])  # finishes shard 1
    crash(writer)
    (tmp_path / MANIFEST).write_bytes(manifest_before)  # died before the manifest listed shard 1
    writer = ShardWriter(tmp_path, SETTINGS, 6)
    assert set(writer.open()) == {"a", "b"}
    writer.close(complete=True)
    side = (tmp_path / "rollouts-00001.routes").read_bytes()
    entry = json.loads((tmp_path / MANIFEST).read_text())["shards"][1]
    assert entry["routes"] == {
        "file": "rollouts-00001.routes",
        "bytes": len(side),
        "sha256": hashlib.sha256(side).hexdigest(),
    }
    assert_same(list(read_records(tmp_path, routes=True)), groups)


def test_overwrite_removes_sidecars_and_a_shard_without_routes_has_none(tmp_path):
    write(tmp_path, [group("a", Model())]).close(complete=True)
    assert (tmp_path / "rollouts-00000.routes").exists()
    writer = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    writer.open()
    assert not list(tmp_path.glob("*.routes*"))
    writer.commit(group("b", None))
    writer.close(complete=True)
    assert not list(tmp_path.glob("*.routes*"))
    assert "routes" not in json.loads((tmp_path / MANIFEST).read_text())["shards"][0]


@pytest.mark.parametrize("copy", [False, True])
def test_merge_carries_sidecars(tmp_path, copy):
    model = Model()
    parts = {"p0": [group("a", model), group("b", model)], "p1": [group("c", model)]}
    for name, groups in parts.items():
        write(tmp_path / name, groups, "zstd" if name == "p1" else "none", shard_size=6).close(complete=True)
    merged = merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all", copy=copy, verify=True)
    assert [s.routes is not None for s in merged.shards] == [True, True, True]
    if copy:
        assert sorted(p.name for p in (tmp_path / "all").glob("*.routes")) == [
            f"rollouts-0000{i}.routes" for i in range(3)
        ]
    assert_same(list(read_records(tmp_path / "all", routes=True)), parts["p0"] + parts["p1"])
    assert validate(tmp_path / "all").ok


def rewrite_line(path: Path, number: int, change: Any) -> None:
    lines = path.read_bytes().splitlines()
    record = orjson.loads(lines[number - 1])
    change(record)
    lines[number - 1] = orjson.dumps(record)
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def test_validate_reports_a_bad_reference_a_damaged_blob_and_rows_that_do_not_match(tmp_path):
    write(tmp_path, [group(pid, Model()) for pid in "ab"]).close(complete=True)
    assert validate(tmp_path).ok
    shard, side = tmp_path / "rollouts-00000.jsonl", tmp_path / "rollouts-00000.routes"

    def past_the_end(r: dict[str, Any]) -> None:
        r["routed_experts"]["response"][0] += side.stat().st_size

    def one_more_token(r: dict[str, Any]) -> None:
        r["response_token_ids"].append(9)
        r["response_logprobs"].append(-1.0)
        r["loss_mask"].append(1)

    rewrite_line(shard, 2, past_the_end)
    rewrite_line(shard, 8, one_more_token)
    report = validate(tmp_path)
    routes_faults = [(f.line, f.message) for f in report.faults if f.kind == "routes"]
    assert [line for line, _ in routes_faults] == [2, 8]
    assert "ends past the sidecar" in routes_faults[0][1] and "rows once joined" in routes_faults[1][1]

    good = tmp_path / "good"
    write(good, [group("a", Model())]).close(complete=True)
    offset, _ = next(read_records(good))["routed_experts"]["prompt"]
    side = good / "rollouts-00000.routes"
    data = bytearray(side.read_bytes())
    data[offset : offset + 6] = b"NOTNPY"
    side.write_bytes(bytes(data))
    report = validate(good)
    kinds = {(f.kind, f.line) for f in report.faults}
    # every solver record shares that prompt blob: each says so; the sidecar's sha256 no longer matches
    assert {line for kind, line in kinds if kind == "routes"} == {1, 2, 4, 5} and ("sha256", None) in kinds


def test_inspect_shows_the_shape_of_routes(tmp_path):
    g = group("a", Model())
    write(tmp_path, [g]).close(complete=True)
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(inspect(tmp_path))
    text = console.export_text()
    solver = g.executions[0][1]
    rows = len(solver.prompt_token_ids) + len(solver.response_token_ids) - 1
    assert f"routes {rows}×{LAYERS}×{TOP_K} uint8" in text


def test_a_follower_reads_routes_from_the_partial_shard_and_after_it_is_finished(tmp_path):
    model = Model()
    groups = [group(pid, model) for pid in "abc"]
    writer = write(tmp_path, groups[:2])
    follower = read_groups(tmp_path, follow=True, routes=True, poll_s=0.01, timeout_s=10)
    live = [next(follower), next(follower)]  # from rollouts-00000.jsonl.partial and its .routes.partial
    assert list(tmp_path.glob("*.partial"))
    writer.commit(groups[2])
    writer.close(complete=True)
    rest = list(follower)  # the finished shard: a and b are not given again
    got = live + rest
    assert [g.problem_id for g in got] == ["a", "b", "c"]
    assert_same(
        [
            {"rollout_id": s.rollout_id, "stage": s.stage, "worker": s.worker, "routed_experts": s.routed_experts}
            for g in got
            for e in g.executions
            for s in e
        ],
        groups,
    )


def test_a_follower_finds_a_sidecar_renamed_ahead_of_its_shard(tmp_path):
    groups = [group("a", Model())]
    writer = write(tmp_path, groups)
    crash(writer)
    os.replace(tmp_path / "rollouts-00000.routes.partial", tmp_path / "rollouts-00000.routes")
    follower = read_groups(tmp_path, follow=True, routes=True, poll_s=0.01, timeout_s=10)
    first = next(follower)
    follower.close()
    assert first.executions[0][0].routed_experts.shape[1:] == (LAYERS, TOP_K)


def test_routes_never_go_to_stdout(capsysbinary):
    with pytest.raises(UsageError, match="stdout"):
        StdoutWriter().commit(group("a", Model()))
    StdoutWriter().commit(group("b", None))
    assert capsysbinary.readouterr().out.count(b"\n") == 6  # b only


def test_a_zstd_shard_keeps_an_uncompressed_sidecar(tmp_path):
    write(tmp_path, [group("a", Model())], "zstd").close(complete=True)
    side = (tmp_path / "rollouts-00000.routes").read_bytes()
    assert side.startswith(b"\x93NUMPY")  # a .npy file's magic, not zstd's
    with zstandard.ZstdDecompressor().stream_reader((tmp_path / "rollouts-00000.jsonl.zst").read_bytes()) as r:
        assert b'"routed_experts":{"prompt":[' in r.read()
