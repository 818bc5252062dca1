"""Folder tools (`validate`, `stats`, `inspect`) on real folders made by the simulated server, on loopback.

Every expected figure is recomputed here from the raw JSON lines, with code of its own (not the tools'
helpers); every damage is made by hand to bytes on disk and must be reported at its shard and line.
"""

from __future__ import annotations

import io
import itertools
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from rich.console import Console

from agentroll.errors import UsageError
from agentroll.inputs import Problem
from agentroll.record.group import Group
from agentroll.record.schema import OPTIONAL_FIELDS, SCHEMA_VERSION, STAGES, Sample
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.inspect import inspect
from agentroll.tools.report import pass_at_k, stats, stats_of_groups, stats_table
from agentroll.tools.validate import Fault, validate

from . import synthetic
from .conftest import TOKENIZER, run_cli

DIFFICULTY = ("easy", "hard", None)  # row i has DIFFICULTY[i % 3]; None: the field is absent
PROBLEMS = 9


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One folder in several shards, two partitions of the same input, and their merges (in place and --copy).
    Seeded, so the simulated answers (truncations, picks) are the same on every run."""
    base = tmp_path_factory.mktemp("tools")
    problems = base / "problems.jsonl"
    with problems.open("w") as f:
        for i in range(PROBLEMS):
            row: dict[str, Any] = {
                "id": f"p{i:03d}",
                "prompt": f"What is {10 + i} plus {7 + 3 * i}?",
                "label": str(17 + 4 * i),
                "level": i % 2,
            }
            if DIFFICULTY[i % 3] is not None:
                row["difficulty"] = DIFFICULTY[i % 3]
            f.write(json.dumps(row) + "\n")
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        common = [
            "--base-url",
            str(server.url),
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "3",
            "--reward",
            "exact",
            "--seed",
            "7",
        ]
        out = base / "out"
        done = run_cli("generate", str(problems), "-o", str(out), *common, "--shard-size", "12")
        assert done.returncode == 0, done.stderr.decode()
        done = run_cli(
            "generate", str(problems), "-o", str(base / "zst"), *common, "--shard-size", "40", "--compression", "zstd"
        )
        assert done.returncode == 0, done.stderr.decode()
        parts = []
        for i in range(2):
            part = base / f"part{i}"
            done = run_cli("generate", str(problems), "-o", str(part), *common, "--partition", f"{i}/2")
            assert done.returncode == 0, done.stderr.decode()
            parts.append(part)
    finally:
        server.stop()
    for name, extra in (("merged", []), ("copied", ["--copy"])):
        done = run_cli("merge", str(parts[0]), str(parts[1]), "-o", str(base / name), *extra)
        assert done.returncode == 0, done.stderr.decode()
    return {
        "base": base,
        "out": out,
        "parts": parts,
        "merged": base / "merged",
        "copied": base / "copied",
        "zst": base / "zst",
        "problems": problems,
    }


# -- independent helpers --------------------------------------------------------------------------------------


def manifest_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def shard_files(folder: Path) -> list[str]:
    return [s["file"] for s in manifest_of(folder)["shards"]]


def shard_text(path: Path) -> str:
    if path.name.endswith(".zst"):
        with zstandard.ZstdDecompressor().stream_reader(path.read_bytes(), read_across_frames=True) as reader:
            return reader.read().decode()
    return path.read_text()


def raw_records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for name in shard_files(folder) for line in shard_text(folder / name).splitlines()]


def zstd_frames(data: bytes) -> list[bytes]:
    """A compressed shard's frames, decompressed one by one."""
    frames, rest = [], data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frames.append(frame.decompress(rest))
        assert frame.eof
        rest = frame.unused_data
    return frames


def read_lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def damaged_copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


def where(report_faults: list[Fault], shard: str) -> list[tuple[str, int | None]]:
    return [(f.kind, f.line) for f in report_faults if f.shard == shard]


def line_faults(report_faults: list[Fault], shard: str) -> list[tuple[str, int | None]]:
    return [(kind, line) for kind, line in where(report_faults, shard) if line is not None]


def execution_starts(lines: list[bytes]) -> list[int]:
    """1-based line of the first record of each execution (a new rollout_id)."""
    starts, previous = [], None
    for number, line in enumerate(lines, start=1):
        rid = json.loads(line)["rollout_id"]
        if rid != previous:
            starts.append(number)
        previous = rid
    return starts


def boxed(text: str) -> str | None:
    """The last \\boxed{...} with balanced braces (the simulator always writes `\\boxed{`)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin + 1 : i].strip()
    return None


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def expected_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's figures from plain records, written out from the definitions in docs/rewards.md."""
    executions: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        executions.setdefault(r["rollout_id"], []).append(r)
    by_stage = {s: [r for r in records if r["stage"] == s] for s in ("solver", "rewriter", "selector")}
    majority = best = system = 0
    for samples in executions.values():
        solvers = [r for r in samples if r["stage"] == "solver"]
        answers = [
            (" ".join(a.split()), r["raw_reward"])
            for r in solvers
            if r["content"] and (a := boxed(r["content"])) is not None
        ]
        if answers:
            counts = Counter(a for a, _ in answers)
            top = max(counts.values())
            winner = next(a for a, _ in answers if counts[a] == top)  # ties: the answer seen first
            majority += next(reward for a, reward in answers if a == winner) == 1.0
        best += any(r["raw_reward"] == 1.0 for r in solvers)
        system += samples[0]["final_reward"] == 1.0
    outcomes: dict[str, list[bool]] = {}  # pass@k is over the executions' outcomes (agentroll.record.group)
    for samples in executions.values():
        outcomes.setdefault(samples[0]["problem_id"], []).append(samples[0]["final_reward"] == 1.0)
    n = max(len(o) for o in outcomes.values())
    assert all(len(o) == n for o in outcomes.values())  # every problem has its K executions
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "problems": len({r["problem_id"] for r in records}),
        "executions": len(executions),
        "records": len(records),
        "samples": {s: len(rs) for s, rs in by_stage.items()},
        "mean_raw": {s: mean([r["raw_reward"] for r in rs]) for s, rs in by_stage.items()},
        "truncated": {s: sum(r["status"] == "truncated" for r in rs) for s, rs in by_stage.items()},
        "prompt_tokens": {s: sum(len(r["prompt_token_ids"]) for r in rs) for s, rs in by_stage.items()},
        "response_tokens": {s: sum(len(r["response_token_ids"]) for r in rs) for s, rs in by_stage.items()},
        "solver_accuracy": mean([r["raw_reward"] for r in by_stage["solver"]]),
        "majority_vote_accuracy": majority / len(executions),
        "best_of_n_accuracy": best / len(executions),
        "rewriter_accuracy": mean([r["raw_reward"] for r in by_stage["rewriter"]]),
        "selector_pick_accuracy": mean([r["raw_reward"] for r in by_stage["selector"]]),
        "system_accuracy": system / len(executions),
        "truncation_rate": sum(r["status"] == "truncated" for r in records) / len(records),
        "pass_at_k": [mean([brute_pass_at_k(o, k) for o in outcomes.values()]) for k in range(1, n + 1)],
    }


def assert_figures(section: dict[str, Any], records: list[dict[str, Any]]) -> None:
    want = expected_figures(records)
    assert (section["problems"], section["executions"], section["records"]) == (
        want["problems"],
        want["executions"],
        want["records"],
    )
    for stage, figures in section["stages"].items():
        assert figures["samples"] == want["samples"][stage]
        assert figures["truncated"] == want["truncated"][stage]
        assert figures["prompt_tokens"] == want["prompt_tokens"][stage]
        assert figures["response_tokens"] == want["response_tokens"][stage]
        assert figures["mean_raw_reward"] == pytest.approx(want["mean_raw"][stage])
        assert section["report"][f"{stage}_tokens"] == want["prompt_tokens"][stage] + want["response_tokens"][stage]
    for key in (
        "solver_accuracy",
        "majority_vote_accuracy",
        "best_of_n_accuracy",
        "rewriter_accuracy",
        "selector_pick_accuracy",
        "system_accuracy",
    ):
        assert section["report"][key] == pytest.approx(want[key]), key
    assert section["truncation_rate"] == pytest.approx(want["truncation_rate"])
    assert [e["k"] for e in section["pass_at_k"]] == list(range(1, len(want["pass_at_k"]) + 1))
    assert [e["value"] for e in section["pass_at_k"]] == pytest.approx(want["pass_at_k"])
    assert all(e["problems"] == want["problems"] for e in section["pass_at_k"])
    tokens = section["tokens"]
    assert tokens["prompt"] == sum(want["prompt_tokens"].values())
    assert tokens["response"] == sum(want["response_tokens"].values())


# -- validate -------------------------------------------------------------------------------------------------


def test_validate_passes_on_a_good_folder_and_on_merged_ones(folders):
    out = folders["out"]
    report = validate(out)
    assert report.ok and report.faults == [] and report.warnings == [], report.lines()
    manifest = manifest_of(out)
    assert len(manifest["shards"]) >= 3  # the damage tests need several shards
    assert (report.shards, report.records, report.executions, report.groups) == (
        len(manifest["shards"]),
        manifest["records"],
        manifest["executions"],
        manifest["groups"],
    )
    assert report.groups == PROBLEMS and report.records == len(raw_records(out))
    assert report.lines() == [
        f"{out}: ok ({report.shards} shards, {report.records} records, "
        f"{report.executions} executions, {report.groups} groups)"
    ]
    for name in ("merged", "copied"):
        merged = validate(folders[name])
        assert merged.ok and merged.merged, merged.lines()
        parts = [manifest_of(p) for p in folders["parts"]]
        assert merged.records == sum(p["records"] for p in parts)
        assert merged.groups == PROBLEMS


def test_a_folder_written_before_a_field_was_added_to_schema_6_is_still_valid(folders, tmp_path):
    """`policy` (head to head), `branched_from`, `rerendered`, `agent_answer`, `agent_reward` (the agent system)
    and a teacher's fields came after schema 6's folders were written, with no new version: a record without them
    reads as null and is no fault."""
    out = damaged_copy(folders["out"], tmp_path)

    def before(records: list[dict[str, Any]]) -> None:
        for record in records:
            for name in OPTIONAL_FIELDS:
                assert record.pop(name) is None

    synthetic.edit(out, before)
    manifest = manifest_of(out)
    report = validate(out)
    assert report.ok, report.lines()
    assert report.records == manifest["records"]


def test_compressed_shards_are_validated_frame_by_frame(folders, tmp_path):
    zst = folders["zst"]
    names = shard_files(zst)
    assert all(name.endswith(".jsonl.zst") for name in names)
    report = validate(zst)
    assert report.ok, report.lines()
    records = raw_records(zst)
    assert (report.records, report.groups) == (len(records), PROBLEMS)
    assert_figures(stats(zst)["all"], records)  # stats reads them too (through agentroll.read_groups)

    damaged = damaged_copy(zst, tmp_path)
    data = bytearray((damaged / names[0]).read_bytes())
    frames = zstd_frames(bytes(data))
    assert len(frames) == 1 and len({json.loads(line)["problem_id"] for line in frames[0].splitlines()}) >= 2
    data[100] ^= 0xFF  # inside the frame: a finished shard is one frame (its groups' frames joined)
    (damaged / names[0]).write_bytes(bytes(data))
    found = validate(damaged)
    assert line_faults(found.faults, names[0])[0] == ("zstd", 1)
    assert ("sha256", None) in where(found.faults, names[0])

    # a group split across two frames: a reader would stop there, so validate says so at the group
    split = damaged_copy(zst, tmp_path / "split")
    (plain,) = zstd_frames((split / names[0]).read_bytes())
    lines = plain.splitlines(True)
    compress = zstandard.ZstdCompressor(write_checksum=True).compress
    (split / names[0]).write_bytes(compress(lines[0]) + compress(b"".join(lines[1:])))
    assert line_faults(validate(split).faults, names[0]) == [("zstd", 1)]


def test_a_flipped_byte_is_a_sha256_fault_of_its_shard(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    name = shard_files(out)[1]
    lines = read_lines(out / name)
    at = lines[2].index(b'"prompt":"') + len(b'"prompt":"') + 3
    assert chr(lines[2][at]).isalpha()
    lines[2] = lines[2][:at] + bytes([lines[2][at] ^ 0x20]) + lines[2][at + 1 :]  # a letter's case: still JSON
    write_lines(out / name, lines)
    report = validate(out)
    assert [(f.kind, f.shard, f.line) for f in report.faults] == [("sha256", name, None)]
    assert report.first is not None and report.first.shard == name
    assert report.lines()[1] == f"first fault: {name}: sha256: " + report.first.message


def test_a_removed_record_is_reported_at_its_execution(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)

    def candidate(records: list[dict]) -> int | None:
        # a wrong solver that is not its execution's first record: its absence changes no reward figure
        return next(
            (
                i
                for i, r in enumerate(records)
                if i > 0
                and r["stage"] == "solver"
                and r["raw_reward"] == 0
                and records[i - 1]["rollout_id"] == r["rollout_id"]
            ),
            None,
        )

    # which shard holds one depends on the order groups finished in: look in each
    found = [
        (name, lines, gone)
        for name in shard_files(out)
        for lines in [read_lines(out / name)]
        for gone in [candidate([json.loads(line) for line in lines])]
        if gone is not None
    ]
    assert found, "the fixture run wrote no wrong solver after another record of its execution"
    name, lines, gone = found[0]
    records = [json.loads(line) for line in lines]
    start = max(s for s in execution_starts(lines) if s <= gone + 1)
    size = records[gone]["rollout_size"]
    write_lines(out / name, lines[:gone] + lines[gone + 1 :])
    report = validate(out)
    assert line_faults(report.faults, name) == [("execution", start)]
    fault = next(f for f in report.faults if f.line == start)
    assert f"has {size - 1} consecutive records, its rollout_size says {size}" in fault.message
    assert {kind for kind, _ in where(report.faults, name)} == {"execution", "bytes", "sha256", "count"}
    assert {f.shard for f in report.faults} == {name}
    assert report.first == fault


def test_a_shortened_logprob_list_is_a_lengths_fault_at_its_line(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    name = shard_files(out)[0]
    lines = read_lines(out / name)
    record = orjson.loads(lines[3])
    n = len(record["response_token_ids"])
    record["response_logprobs"] = record["response_logprobs"][:-1]
    lines[3] = orjson.dumps(record)
    write_lines(out / name, lines)
    report = validate(out)
    assert line_faults(report.faults, name) == [("lengths", 4)]
    assert report.first is not None and (report.first.kind, report.first.line) == ("lengths", 4)
    assert f"response_logprobs has {n - 1} entries where response_token_ids has {n}" in report.first.message
    assert report.lines()[1].startswith(f"first fault: {name}:4: lengths: ")
    assert {kind for kind, _ in where(report.faults, name)} == {"lengths", "bytes", "sha256"}


@pytest.mark.parametrize(
    ("change", "kind", "says"),
    [
        (lambda r: r.update(worker="0"), "schema", "field 'worker' is a string, expected an integer"),
        (lambda r: r.update(metadata=[]), "schema", "field 'metadata' is an array, expected an object"),
        (lambda r: r.update(content=5), "schema", "field 'content' is an integer, expected a string or null"),
        (lambda r: r.update(raw_reward=True), "schema", "field 'raw_reward' is a boolean, expected a number"),
        (
            lambda r: r["prompt_token_ids"].__setitem__(2, 1.5),
            "schema",
            "field 'prompt_token_ids' is an array whose item 2 is a number, expected an array of integers",
        ),
        (lambda r: r.update(surprise=1), "schema", "unknown field surprise"),
        (lambda r: r.pop("endpoint"), "schema", "missing field endpoint"),
        (lambda r: r.update(status="aborted"), "value", "status 'aborted'"),
        (lambda r: r.update(schema_version=1), "value", f"schema_version 1, expected {SCHEMA_VERSION}"),
        (lambda r: r["loss_mask"].__setitem__(0, 2), "value", "loss_mask item 0 is 2, not 0 or 1"),
        (lambda r: r.update(group_reward_mean=r["group_reward_mean"] + 0.5), "group", "group_reward_mean"),
    ],
)
def test_a_bad_field_is_reported_at_its_line(folders, tmp_path, change, kind, says):
    out = damaged_copy(folders["out"], tmp_path)
    name = shard_files(out)[2]
    lines = read_lines(out / name)
    record = orjson.loads(lines[4])
    change(record)
    lines[4] = orjson.dumps(record)
    write_lines(out / name, lines)
    report = validate(out)
    assert line_faults(report.faults, name) == [(kind, 5)]
    assert report.first is not None and says in report.first.message
    assert {f.shard for f in report.faults} == {name}


def test_a_record_moved_to_another_shard_is_reported_in_both(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    first, second = shard_files(out)[:2]
    a, b = read_lines(out / first), read_lines(out / second)
    moved = json.loads(a[-1])
    start = execution_starts(a)[-1]
    group_start = next(i for i, line in enumerate(a, start=1) if json.loads(line)["problem_id"] == moved["problem_id"])
    write_lines(out / first, a[:-1])
    write_lines(out / second, [*b, a[-1]])
    report = validate(out)
    assert ("execution", start) in line_faults(report.faults, first)
    assert all(line >= group_start for _, line in line_faults(report.faults, first))
    orphan = len(b) + 1
    assert {kind for kind, _ in line_faults(report.faults, second)} == {"execution", "group", "duplicate"}
    assert {line for _, line in line_faults(report.faults, second)} == {orphan}
    duplicate = next(f for f in report.faults if f.kind == "duplicate")
    assert f"{first}:{group_start}" in duplicate.message
    assert report.first is not None and report.first.shard == first and report.first.line == start


def test_a_problem_written_twice_is_a_duplicate(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    first, _, third = shard_files(out)[:3]
    a, c = read_lines(out / first), read_lines(out / third)
    pid = json.loads(a[0])["problem_id"]
    group = [line for line in a if json.loads(line)["problem_id"] == pid]
    write_lines(out / third, [*c, *group])
    report = validate(out)
    assert line_faults(report.faults, third) == [("duplicate", len(c) + 1)]
    assert f"problem {pid!r} is also at {first}:1" in report.faults[0].message


def test_manifest_counts_missing_shards_torn_lines_and_keys(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    names = shard_files(out)
    manifest = manifest_of(out)
    manifest["records"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / names[1]).unlink()
    last = read_lines(out / names[-1])
    with open(out / names[-1], "ab") as f:
        f.write(last[0][:40])  # a torn line, as a crash mid-write leaves it
    keys = out / ".agentroll" / "keys" / (names[0].removesuffix(".jsonl") + ".keys")
    keys.write_bytes(orjson.dumps(orjson.loads(keys.read_bytes())[:-1]))
    report = validate(out)
    assert ("count", None, None) in [(f.kind, f.shard, f.line) for f in report.faults]
    assert where(report.faults, names[1]) == [("missing", None)]
    torn = line_faults(report.faults, names[-1])
    assert ("json", len(last) + 1) in torn and {line for _, line in torn} == {len(last) + 1}
    assert ("keys", None) in where(report.faults, names[0])
    assert report.faults_total == len(report.faults) and not report.ok


def test_a_damaged_shard_of_a_merged_folder_is_named_by_its_manifest_path(folders, tmp_path):
    for name in ("part0", "part1", "merged"):
        shutil.copytree(folders["base"] / name, tmp_path / name)
    merged = tmp_path / "merged"
    name = shard_files(merged)[0]
    assert name.startswith("../part")
    lines = read_lines(merged / name)
    record = orjson.loads(lines[0])
    record["loss_mask"] = [*record["loss_mask"], 1]
    lines[0] = orjson.dumps(record)
    write_lines(merged / name, lines)
    report = validate(merged)
    assert report.merged
    assert line_faults(report.faults, name) == [("lengths", 1)]
    assert {f.shard for f in report.faults} == {name}


def test_the_fault_list_is_capped_with_a_count_of_the_rest(folders, tmp_path):
    out = damaged_copy(folders["out"], tmp_path)
    for name in shard_files(out):
        lines = read_lines(out / name)
        write_lines(out / name, [line.replace(b'"worker":', b'"wrkr":') for line in lines])
    report = validate(out)
    records = len(raw_records(folders["out"]))
    assert report.faults_total >= 2 * records  # a missing and an unknown field per record
    text = report.lines(limit=5)
    assert len(text) == 2 + 5 + 1
    assert text[-1] == f"  ... and {report.faults_total - 6} more"


def test_no_manifest_is_one_fault(tmp_path):
    report = validate(tmp_path)
    assert [(f.kind, f.shard, f.line) for f in report.faults] == [("manifest", None, None)]
    assert report.lines()[1].startswith("first fault: manifest.json: manifest: no manifest.json")


# -- stats ----------------------------------------------------------------------------------------------------


def test_pass_at_k_is_the_fraction_of_k_subsets_with_a_correct_sample():
    for n in range(1, 8):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12), (n, c, k)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001) and 0 < pass_at_k(2000, 3, 700) < 1
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_stats_equal_a_recomputation_from_the_records(folders):
    out = folders["out"]
    data = stats(out)
    records = raw_records(out)
    assert data["by"] is None and data["split"] == {}
    assert_figures(data["all"], records)
    # pass@K (all the executions) is the mean of the records' own group_pass_at_k
    firsts = {r["problem_id"]: r["group_pass_at_k"] for r in records}
    assert data["all"]["pass_at_k"][-1]["value"] == pytest.approx(sum(firsts.values()) / len(firsts))
    assert data["all"]["pass_at_k"][-1]["k"] == 3  # K executions
    # one run, nothing filtered: the run's own report says the same
    assert data["all"]["report"] == pytest.approx(manifest_of(out)["last_run"]["stats"]["report"])
    # a merged folder holds the same problems (another run): its stats are its records' figures
    assert_figures(stats(folders["merged"])["all"], raw_records(folders["merged"]))


def test_stats_by_a_metadata_field(folders):
    out = folders["out"]
    records = raw_records(out)
    data = stats(out, by="difficulty")
    assert list(data["split"]) == ["easy", "hard", "(none)"]
    for key, section in data["split"].items():
        want = None if key == "(none)" else key
        part = [r for r in records if r["metadata"].get("difficulty") == want]
        assert {r["problem_id"] for r in part} == {f"p{i:03d}" for i in range(PROBLEMS) if DIFFICULTY[i % 3] == want}
        assert_figures(section, part)
    assert sum(s["records"] for s in data["split"].values()) == data["all"]["records"]
    assert list(stats(out, by="level")["split"]) == ["0", "1"]  # numbers as JSON text
    assert list(stats(out, by="nowhere")["split"]) == ["(none)"]

    text = render(stats_table(data))
    assert "difficulty=easy" in text and "difficulty=(none)" in text and "pass@3 (executions)" in text
    row = next(line for line in text.splitlines() if "system accuracy" in line)
    assert f"{data['split']['hard']['report']['system_accuracy']:.3f}" in row


def sample(pid: str, rid: str, raw: float, worker: int) -> Sample:
    return Sample(
        problem_id=pid,
        problem_hash="h",
        rollout_id=rid,
        sample_index=0,
        group_size=1,
        stage="solver",
        worker=worker,
        prompt="q",
        prompt_token_ids=[1],
        response="r",
        response_token_ids=[2],
        response_logprobs=[-0.5],
        loss_mask=[1],
        status="completed",
        finish_reason="stop",
        stop_reason=None,
        content=None,
        raw_reward=raw,
        reward=raw,
        label="1",
        model="m",
        endpoint="e",
        latency_s=0.0,
        attempts=1,
        rollout_size=1,
    )


def test_pass_at_k_averages_over_the_problems_that_have_k_samples():
    def solved(pid: str, k: int, outcome: float) -> list[Sample]:
        one = sample(pid, f"{pid}{k}", outcome, 0)
        one.final_reward = outcome
        return [one]

    a = Group(Problem("a", "q", "1", {}, 0), [solved("a", k, r) for k, r in enumerate((1.0, 0, 0, 0))])
    b = Group(Problem("b", "q", "1", {}, 0), [solved("b", k, 0.0) for k in range(2)])
    passes = stats_of_groups([a, b])["all"]["pass_at_k"]
    # a: n=4, c=1: 1/4, 1 - C(3,2)/C(4,2) = 1/2, 1 - C(3,3)/C(4,3) = 3/4, 1; b: n=2, c=0: 0, 0
    assert [(e["k"], e["problems"]) for e in passes] == [(1, 2), (2, 2), (3, 1), (4, 1)]
    assert [e["value"] for e in passes] == pytest.approx([0.125, 0.25, 0.75, 1.0])


# -- inspect --------------------------------------------------------------------------------------------------


def render(renderable: Any) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def blocks(text: str) -> list[str]:
    """The tree's text cut at each execution node."""
    return re.split(r"\n(?=\S+ execution \d+ · rollout )", text)[1:]


def check_execution(block: str, samples: list[dict[str, Any]]) -> None:
    """Every sample of the execution is a node with its status, rewards, answer and reward_info."""
    head = samples[0]
    assert block.split("\n", 1)[0].endswith(
        f"execution {head['sample_index']} · rollout {head['rollout_id']} · final reward {head['final_reward']:g}"
        f" · {len(samples)} records"
    )
    lines = block.splitlines()
    for s in samples:
        name = f"{s['stage']} {s['worker']}" if s["stage"] != "selector" else "selector · "
        node = [line for line in lines if re.search(rf"─ {re.escape(name)}\b", line)]
        assert len(node) == 1, (name, node)
        assert f"{s['status']}" in node[0] and f"raw {s['raw_reward']:g} / reward {s['reward']:g}" in node[0]
        assert ("truncated (cut at max tokens)" in node[0]) == (s["status"] == "truncated")
        assert f"{len(s['response_token_ids'])} tokens" in node[0]
        if s["stage"] == "rewriter":
            listed = f"listed as {s['listed_as']}" if s["listed_as"] is not None else "not listed"
            assert listed in node[0]
        if s["content"] is not None and boxed(s["content"]) is not None:
            assert f"answer: {boxed(s['content'])}" in block
        if s["reward_info"]:
            assert f"reward_info: {s['reward_info']}" in block
    selector = next((s for s in samples if s["stage"] == "selector"), None)
    rewrites = {s["listed_as"]: s for s in samples if s["stage"] == "rewriter" and s["listed_as"] is not None}
    picked = [line for line in lines if "◀ picked by the selector" in line]
    if selector is not None and selector["judgment"] in rewrites:
        chosen = rewrites[selector["judgment"]]
        assert len(picked) == 1 and f"rewriter {chosen['worker']} · listed as {selector['judgment']}" in picked[0]
        assert (
            f"selector · judgment {selector['judgment']} → rewrite {selector['judgment']} (rewriter {chosen['worker']})"
        ) in block
    else:
        assert picked == []
    if selector is None:
        assert "selector: none (" in block


def test_inspect_draws_the_first_execution_by_default(folders):
    out = folders["out"]
    records = raw_records(out)
    first = [r for r in records if r["rollout_id"] == records[0]["rollout_id"]]
    text = render(inspect(out))
    assert text.startswith(f"problem {records[0]['problem_id']} · label {records[0]['label']} · group of 3 executions")
    assert len(blocks(text)) == 1
    check_execution(blocks(text)[0], first)
    pid = records[0]["problem_id"]
    others = {r["rollout_id"] for r in records if r["problem_id"] == pid} - {first[0]["rollout_id"]}
    assert others and not any(rid in text for rid in others)


def test_inspect_a_problem_draws_all_its_executions(folders):
    out = folders["out"]
    records = raw_records(out)

    # a problem with a pick, a truncation and an execution that stopped early, if the seeded run has one
    def score(pid: str) -> tuple[bool, bool]:
        rs = [r for r in records if r["problem_id"] == pid]
        return (any(r["status"] == "truncated" for r in rs), any(r["judgment"] is not None for r in rs))

    pid = max(sorted({r["problem_id"] for r in records}), key=score)
    assert score(pid) == (True, True)
    text = render(inspect(out, problem_id=pid))
    assert text.startswith(f"problem {pid} · ")
    executions: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["problem_id"] == pid:
            executions.setdefault(r["rollout_id"], []).append(r)
    found = blocks(text)
    assert len(found) == len(executions) == 3
    for block, samples in zip(found, executions.values(), strict=True):
        check_execution(block, samples)
    with pytest.raises(UsageError, match="'nope' is not in"):
        inspect(out, problem_id="nope")


def test_inspect_explains_a_stage_that_did_not_run(folders):
    records = raw_records(folders["out"])
    short = next((r for r in records if r["rollout_size"] == 2), None)  # N=2 solvers only: no solver answered
    assert short is not None  # seeded: the run has one (else pick another --seed in the fixture)
    text = render(inspect(folders["out"], problem_id=short["problem_id"]))
    block = next(b for b in blocks(text) if short["rollout_id"] in b.split("\n", 1)[0])
    assert "rewriters: none (no solver gave an answer)" in block
    assert "selector: none (no rewriter gave an answer)" in block


# -- other systems: synthetic folders (tests/synthetic.py) ------------------------------------------------------


def _set(index: int, **values: Any) -> Any:
    return lambda records: records[index].update(values)


def _item(index: int, name: str, at: int, value: Any) -> Any:
    return lambda records: records[index][name].__setitem__(at, value)


def test_folders_of_other_systems_validate(tmp_path):
    for name, make in (
        ("cr", synthetic.critique_revise),
        ("debate", synthetic.debate),
        ("legacy", synthetic.three_stage),
    ):
        folder = make(tmp_path / name)
        report = validate(folder)
        assert report.ok, report.lines()
        assert report.records == len(synthetic.records_of(folder))
    frozen = synthetic.critique_revise(tmp_path / "frozen", frozen_critic=True)
    assert validate(frozen).ok
    # the checks ran: every later turn of the folder is a real continuation, history and all
    records = synthetic.records_of(tmp_path / "cr")
    later = [r for r in records if r["continues"] is not None]
    assert len(later) == 5 and {r["turn"] for r in later} == {1, 2}
    # a function system that declares no stages: any non-empty stage name
    blank = dict(synthetic.CRITIQUE_REVISE, name="mine.py:system", stages=[])
    assert validate(synthetic.critique_revise(tmp_path / "blank", system=blank)).ok
    nameless = synthetic.edit(tmp_path / "blank", lambda rs: rs[3].update(stage=""))
    assert [(f.kind, f.line, f.message) for f in validate(nameless).faults] == [("value", 4, "stage '' is empty")]


# the critique-revise folder, flat: shard 0 is a0 solver, critic, reviser (lines 1-3), a1 solver (line 4); shard 1
# is b0 solver, critic (lines 1-2), b1 solver, critic, reviser (lines 3-5). a0's reviser prompt: 5 prompt tokens,
# 6 solver tokens (the third outside the solver's loss mask), 3 injected, 4 critic tokens, 2 injected.
@pytest.mark.parametrize(
    ("change", "faults", "says"),
    [
        (
            _item(2, "prompt_token_ids", 7, 999),
            [("conversation", 0, 3)],
            "prompt_token_ids do not start with the prompt and response of the record it continues (line 2): "
            "they differ at token 7",
        ),
        (
            _item(2, "history_mask", 7, 1),
            [("conversation", 0, 3)],
            "history_mask item 7 is 1 where the record it continues (line 2) says 0: over its prompt",
        ),
        (
            _item(1, "history_mask", 7, 1),
            [("conversation", 0, 2), ("conversation", 0, 3)],
            "history_mask item 7 is 1 where the record it continues (line 1) says 0: over its response",
        ),
        (_item(2, "history_mask", 19, 1), [("conversation", 0, 3)], "over the tokens after it (0)"),
        (
            lambda rs: (rs[2]["history_mask"].__setitem__(5, 0), rs[2]["history_logprobs"].__setitem__(5, 0.0)),
            [("conversation", 0, 3)],
            "history_mask item 5 is 0 where the record it continues (line 2) says 1",
        ),
        (
            _item(2, "history_logprobs", 5, -9.0),
            [("conversation", 0, 3)],
            "history_logprobs item 5 is -9.0 where the record it continues (line 2) sampled -0.25",
        ),
        (
            _item(2, "history_logprobs", 0, -0.5),
            [("conversation", 0, 3), ("value", 0, 3)],
            "history_logprobs item 0 is -0.5 where history_mask is 0",
        ),
        (
            lambda rs: rs[2].update(history_mask=rs[2]["history_mask"][:-1]),
            [("lengths", 0, 3)],
            "history_mask has 19 entries where prompt_token_ids has 20",
        ),
        (
            _item(2, "history_mask", 2, 2),
            [("conversation", 0, 3), ("value", 0, 3)],
            "history_mask item 2 is 2, not 0 or 1",
        ),
        (
            _set(2, history_mask=None, history_logprobs=None),
            [("value", 0, 3)],
            "turn 2, continues 1 without a history_mask",
        ),
        (_set(2, history_logprobs=None), [("value", 0, 3)], "not both null or both arrays"),
        (_set(0, turn=1), [("value", 0, 1), ("conversation", 0, 2)], "turn 1, continues None without a history_mask"),
        (
            _set(2, continues=2),
            [("conversation", 0, 3)],
            "continues 2 is not an earlier record of its execution (this is its record 2",
        ),
        (
            _set(2, continues=0),
            [("conversation", 0, 3)],
            "turn 2 continues the record it continues (line 1), which is turn 0",
        ),
        (
            _set(3, turn=1, continues=0),
            [("value", 0, 4), ("conversation", 0, 4)],
            "turn 1, continues 0 without a history_mask",
        ),
        (_set(3, stage="judge"), [("value", 0, 4)], "stage 'judge' is not one of solver, critic, reviser"),
        (
            _set(8, stage="solver"),
            [("execution", 1, 5)],
            "a solver record after a critic in execution b-r1 (the critique-revise system's stage order is "
            "solver, critic, reviser)",
        ),
        (
            _set(2, raw_reward=0.5),
            [("execution", 0, 1)],
            "final_reward 1.0 is not the raw_reward of the execution's reviser (0.5, record 2)",
        ),
        (lambda rs: [r.update(group_pass_at_k=0.0) for r in rs[4:]], [("group", 1, 1)], "group_pass_at_k 0.0"),
    ],
)
def test_a_broken_conversation_is_reported_at_its_line(tmp_path, change, faults, says):
    folder = synthetic.edit(synthetic.critique_revise(tmp_path / "cr"), change)
    report = validate(folder)
    names = shard_files(folder)
    assert sorted({(f.kind, names.index(f.shard), f.line) for f in report.faults}) == sorted(faults), report.lines()
    assert report.first is not None and says in report.first.message, report.first


def test_a_frozen_turn_may_be_left_out_of_the_history(tmp_path):
    """The tokens of a frozen turn (a judge of another model) are the model's or not, as the system decides:
    history_mask may say 1 (its loss mask) or 0 there, with its logprobs or 0.0 to match."""
    folder = synthetic.critique_revise(tmp_path / "frozen", frozen_critic=True)

    def unmark(records: list[dict[str, Any]]) -> None:
        reviser = records[2]
        for i in range(14, 18):  # the critic's response, inside the reviser's prompt
            reviser["history_mask"][i], reviser["history_logprobs"][i] = 0, 0.0

    assert validate(synthetic.edit(folder, unmark)).ok
    trained = synthetic.edit(synthetic.critique_revise(tmp_path / "trained"), unmark)  # a trainable critic: no
    assert [(f.kind, f.line) for f in validate(trained).faults] == [("conversation", 3)]


def test_the_three_stage_checks_hold_only_for_three_stage(tmp_path):
    legacy = synthetic.three_stage(tmp_path / "legacy")  # no system in the manifest: three-stage
    assert "system" not in manifest_of(legacy)["settings"]
    bad = synthetic.edit(legacy, lambda rs: rs[8].update(raw_reward=0.5))  # the rewrite the selector picked
    assert [(f.kind, f.line) for f in validate(bad).faults] == [("execution", 10)]
    assert validate(bad).faults[0].message == (
        "selector raw_reward 1.0 is not the raw_reward of the rewrite listed as 2: 0.5"
    )
    odd = synthetic.edit(synthetic.three_stage(tmp_path / "odd"), lambda rs: rs[0].update(stage="critic"))
    assert validate(odd).faults[0].message == "stage 'critic' is not one of solver, rewriter, selector"
    # a user system's judge may end an execution that scores something else than its own raw reward: only
    # the final reward's agreement within the execution is checked
    debate = synthetic.debate(tmp_path / "debate")
    for r in synthetic.records_of(debate):
        assert r["stage"] in ("proposer", "judge")
    ends_elsewhere = synthetic.edit(debate, lambda rs: rs[2].update(raw_reward=0.25))
    assert validate(ends_elsewhere).ok
    split = synthetic.edit(synthetic.debate(tmp_path / "split"), lambda rs: rs[1].update(final_reward=0.5))
    assert [(f.kind, f.line) for f in validate(split).faults] == [("execution", 2)]
    # a system without a "solver" stage: group_pass_at_k is over the executions' outcomes all the same
    free = synthetic.edit(synthetic.debate(tmp_path / "free"), lambda rs: [r.update(group_pass_at_k=None) for r in rs])
    assert [f.kind for f in validate(free).faults] == ["group"] * 2
    assert "group_pass_at_k None does not describe" in validate(free).faults[0].message


def test_a_single_system_execution_is_one_record(tmp_path):
    executions = [
        synthetic.execution([synthetic.call("s", f"s-{k}", k, 2, "solver", [1], [5, 2], raw=float(k))], final=float(k))
        for k in range(2)
    ]
    folder = synthetic.write(tmp_path / "single", [[synthetic.group(executions)]], synthetic.SINGLE)
    assert validate(folder).ok
    wrong = synthetic.edit(folder, lambda rs: [r.update(final_reward=0.0) for r in rs])
    assert ("execution", 2) in [(f.kind, f.line) for f in validate(wrong).faults]


@pytest.mark.parametrize(
    ("system", "says"),
    [
        ({"name": "x", "stages": "solver"}, "settings.system.stages is not a list of non-empty strings"),
        ({"name": "", "stages": ["a"]}, "settings.system.name is not a non-empty string"),
        ({"name": "x", "stages": ["a", "a"]}, "names a stage twice"),
        ({"name": "three-stage", "stages": ["solver"]}, "the three-stage system's are"),
        ([], "settings.system is not an object"),
    ],
)
def test_a_bad_system_in_the_manifest_is_a_manifest_fault(tmp_path, system, says):
    folder = synthetic.debate(tmp_path / "d")
    manifest = manifest_of(folder)
    manifest["settings"]["system"] = system
    (folder / "manifest.json").write_text(json.dumps(manifest))
    report = validate(folder)
    assert report.faults[0].kind == "manifest" and says in report.faults[0].message
    manifest["settings"]["system"] = synthetic.DEBATE
    manifest["settings"]["stage_settings"] = {"critic": {"model": "m"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert [f.message for f in validate(folder).faults] == [
        "settings.stage_settings names 'critic', not a stage of the system"
    ]


def wide(renderable: Any) -> str:
    console = Console(record=True, width=400, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_stats_of_another_system_follow_its_stages(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    data = stats(folder)
    assert data["system"]["name"] == "critique-revise" and data["system"]["stages"] == ["solver", "critic", "reviser"]
    labels = ["solver", "critic", "reviser", "system"]  # one solver per execution: no vote, no best of N
    assert list(data["system"]["labels"].values()) == labels
    section = data["all"]
    assert list(section["stages"]) == ["solver", "critic", "reviser"]
    # a0: solver 1, critic 0, reviser 1 (final 1); a1: solver 0; b0: solver 1, critic 1 (final 1);
    # b1: solver 0, critic 1, reviser 0
    assert {s: (v["samples"], v["mean_raw_reward"], v["trainable"]) for s, v in section["stages"].items()} == {
        "solver": (4, 0.5, True),
        "critic": (3, pytest.approx(2 / 3), False),
        "reviser": (2, 0.5, True),
    }
    assert (section["problems"], section["executions"], section["records"]) == (2, 4, 9)
    report = section["report"]
    assert report["system_accuracy"] == 0.5 and report["solver_accuracy"] == 0.5
    assert "rewriter_accuracy" not in report and "selector_pick_accuracy" not in report
    assert [(e["k"], e["value"]) for e in section["pass_at_k"]] == [(1, 0.5), (2, 1.0)]  # each problem: n 2, c 1
    assert section["tokens"]["prompt"] == sum(len(r["prompt_token_ids"]) for r in synthetic.records_of(folder))
    text = wide(stats_table(data))
    assert "(critique-revise system)" in text
    assert "critic samples (not trainable)" in text and "solver samples (not trainable)" not in text
    assert "reviser mean raw reward" in text and "rewriter" not in text and "selector" not in text
    assert "pass@2 (executions)" in text


def test_stats_of_a_system_without_solvers_and_without_a_manifest(tmp_path):
    from agentroll.folder import read_groups

    folder = synthetic.debate(tmp_path / "debate")
    data = stats(folder)
    assert list(data["all"]["stages"]) == ["proposer", "judge"]
    finals: dict[str, dict[str, bool]] = {}  # pass@k over the executions' outcomes, whatever the stages are named
    for r in synthetic.records_of(folder):
        finals.setdefault(r["problem_id"], {})[r["rollout_id"]] = r["final_reward"] == 1.0
    k = len(next(iter(finals.values())))
    last = sum(any(f.values()) for f in finals.values()) / len(finals)
    assert [e["k"] for e in data["all"]["pass_at_k"]] == list(range(1, k + 1))
    assert data["all"]["pass_at_k"][-1]["value"] == pytest.approx(last)
    assert data["all"]["stages"]["judge"]["trainable"] is False
    text = wide(stats_table(data))
    assert "judge samples (not trainable)" in text and f"pass@{k} (executions)" in text and "solver" not in text
    # groups in hand, no manifest: the stages as first seen (not three-stage), or as the system says
    inferred = stats_of_groups(read_groups(folder))
    assert (inferred["system"]["name"], inferred["system"]["stages"]) == ("?", ["proposer", "judge"])
    assert inferred["all"] == data["all"]
    told = stats_of_groups(read_groups(folder), system=synthetic.DEBATE)
    assert told["system"]["name"] == "debate.py:Debate" and told["all"] == data["all"]

    # a stage seen in one --by column only (here one the system does not declare): every column shows it
    def jury(records: list[dict[str, Any]]) -> None:
        for r in records:
            r["metadata"] = {"difficulty": "easy" if r["problem_id"] == "p" else "hard"}
            if r["problem_id"] == "q" and r["stage"] == "judge":
                r["stage"] = "jury"

    odd = synthetic.edit(synthetic.debate(tmp_path / "odd"), jury)
    split = stats(odd, by="difficulty")
    assert list(split["all"]["stages"]) == ["proposer", "judge", "jury"]
    assert {k: list(v["stages"]) for k, v in split["split"].items()} == {
        "easy": ["proposer", "judge", "jury"],
        "hard": ["proposer", "judge", "jury"],
    }
    assert split["split"]["easy"]["stages"]["jury"]["samples"] == 0
    assert split["split"]["hard"]["stages"]["jury"]["samples"] == 2
    assert "jury samples (not trainable)" in wide(stats_table(split))
    guessed = stats_of_groups(read_groups(odd), by="difficulty")
    assert guessed["system"]["stages"] == ["proposer", "judge", "jury"]
    assert list(guessed["split"]["easy"]["stages"]) == ["proposer", "judge", "jury"]
    # a folder made before systems: three-stage
    legacy = stats(synthetic.three_stage(tmp_path / "legacy"))
    assert legacy["system"]["name"] == "three-stage" and list(legacy["all"]["stages"]) == list(STAGES)
    assert legacy["all"]["report"]["selector_pick_accuracy"] == 0.5


def test_inspect_draws_another_system_stage_by_stage_with_its_turns(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    text = wide(inspect(folder, problem_id="a"))
    first, second = blocks(text)
    assert "solver (1)" in first and "critic (1)" in first and "reviser (1)" in first
    critic = next(line for line in first.splitlines() if "critic 0 · record 1" in line)
    assert "turn 1, continues record 0" in critic and "frozen (trainable: false)" in critic
    reviser = next(line for line in first.splitlines() if "reviser 0 · record 2" in line)
    assert "turn 2, continues record 1" in reviser and "frozen" not in reviser
    assert "solver 0 · record 0 · completed" in first and "turn 0" not in first
    assert "critic: none (no call made)" in second and "reviser: none (no call made)" in second
    assert "rewriters" not in text and "selector" not in text
