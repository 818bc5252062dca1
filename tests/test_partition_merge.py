"""Splitting a job across hosts with --partition, and joining the folders again with `agentroll merge`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from agentroll.inputs import in_partition

from .conftest import TOKENIZER, read_records, run_cli


def test_partition_is_a_stable_exact_split():
    ids = [f"q{i}" for i in range(1000)]
    slices = [[i for i in ids if in_partition(i, k, 3)] for k in range(3)]
    assert sorted(i for s in slices for i in s) == sorted(ids) and all(250 < len(s) < 420 for s in slices)
    # the documented rule, recomputed here: blake2b (8 bytes, big-endian) of the id, modulo N; the same in
    # another interpreter with another hash seed (Python's own hash() would not be)
    expected = [int.from_bytes(hashlib.blake2b(i.encode(), digest_size=8).digest(), "big") % 3 for i in ids[:50]]
    assert [next(k for k in range(3) if in_partition(i, k, 3)) for i in ids[:50]] == expected
    script = (
        "from agentroll.inputs import in_partition; print([[in_partition(f'q{i}', k, 3) for k in range(3)]"
        ".index(True) for i in range(50)])"
    )
    other = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(other.stdout) == expected


def shard_records(manifest_dir: Path) -> list[dict]:
    manifest = json.loads((manifest_dir / "manifest.json").read_text())
    lines = [line for s in manifest["shards"] for line in (manifest_dir / s["file"]).read_text().splitlines()]
    return [json.loads(line) for line in lines]


def test_slices_cover_the_input_once_and_merge_joins_them(sim, problems, tmp_path):
    base = [
        "generate",
        str(problems),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--shard-size",
        "5",
    ]
    for k in range(2):
        proc = run_cli(*base, "-o", str(tmp_path / f"part{k}"), "--partition", f"{k}/2")
        assert proc.returncode == 0, proc.stderr.decode()
    parts = [{r["problem_id"] for r in read_records(tmp_path / f"part{k}")} for k in range(2)]
    assert not parts[0] & parts[1] and parts[0] | parts[1] == {f"p{i:03d}" for i in range(8)}

    linked = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part1"), "-o", str(tmp_path / "all"), "--verify")
    assert linked.returncode == 0, linked.stderr.decode()
    merged = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert merged["complete"] and merged["executions"] == 8 and merged["settings"]["partition"] is None
    assert not list((tmp_path / "all").glob("*.jsonl"))  # nothing copied
    records = shard_records(tmp_path / "all")
    assert len(records) == merged["records"] and {r["problem_id"] for r in records} == parts[0] | parts[1]

    copied = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part1"), "-o", str(tmp_path / "copy"), "--copy")
    assert copied.returncode == 0
    assert len(list((tmp_path / "copy").glob("rollouts-*.jsonl"))) == len(merged["shards"])
    assert shard_records(tmp_path / "copy") == records

    twice = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part0"), "-o", str(tmp_path / "bad"))
    assert twice.returncode == 6 and b"is in both" in twice.stderr
    into_merged = run_cli(*base, "-o", str(tmp_path / "all"))
    assert into_merged.returncode == 6 and b"merged view" in into_merged.stderr


def test_merge_refuses_folders_made_with_other_settings(sim, problems, tmp_path):
    base = [
        "generate",
        str(problems),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
    ]
    assert run_cli(*base, "-o", str(tmp_path / "a"), "--partition", "0/2").returncode == 0
    assert run_cli(*base, "-o", str(tmp_path / "b"), "--partition", "1/2", "--temperature", "0.3").returncode == 0
    proc = run_cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "m"))
    assert proc.returncode == 6 and b"other settings" in proc.stderr and b"temperature" in proc.stderr


def test_merge_refuses_to_write_into_one_of_its_inputs_or_to_merge_a_merged_folder(sim, problems, tmp_path):
    base = [
        "generate",
        str(problems),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
    ]
    for k in range(2):
        assert run_cli(*base, "-o", str(tmp_path / f"part{k}"), "--partition", f"{k}/2").returncode == 0
    part0 = tmp_path / "part0"
    before = {p.name: p.read_bytes() for p in part0.iterdir() if p.is_file()}
    for extra in ([], ["--copy"]):
        proc = run_cli("merge", str(part0), str(tmp_path / "part1"), "-o", str(part0), *extra)
        assert proc.returncode == 6 and b"is one of the folders to merge" in proc.stderr
        assert len(proc.stderr.decode().strip().splitlines()) == 1 and b"Traceback" not in proc.stderr
    assert {p.name: p.read_bytes() for p in part0.iterdir() if p.is_file()} == before  # the input is intact

    assert run_cli("merge", str(part0), str(tmp_path / "part1"), "-o", str(tmp_path / "all")).returncode == 0
    nested = run_cli("merge", str(tmp_path / "all"), "-o", str(tmp_path / "again"))
    assert nested.returncode == 6 and b"is itself a merged folder: merge the folders it was made from" in nested.stderr
    assert len(nested.stderr.decode().strip().splitlines()) == 1


def test_merge_reads_folders_copied_without_their_keys_and_with_a_torn_filtered_line(sim, problems, tmp_path):
    base = [
        "generate",
        str(problems),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--shard-size",
        "5",
    ]
    for k in range(2):
        assert run_cli(*base, "-o", str(tmp_path / f"part{k}"), "--partition", f"{k}/2").returncode == 0
    shutil.rmtree(tmp_path / "part0" / ".agentroll")  # copied by a tool that skips dot-folders
    with open(tmp_path / "part1" / ".agentroll" / "filtered.jsonl", "ab") as f:
        f.write(b'{"problem_id": "p9')  # a crash mid-line
    proc = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part1"), "-o", str(tmp_path / "all"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert {r["problem_id"] for r in shard_records(tmp_path / "all")} == {f"p{i:03d}" for i in range(8)}
    twice = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part0"), "-o", str(tmp_path / "bad"))
    assert twice.returncode == 6 and b"is in both" in twice.stderr  # found from the shards themselves


def test_a_row_that_cannot_be_read_is_counted_by_one_slice_and_no_slice_fails_for_it(sim, problems, tmp_path):
    """Under --skip-invalid a row that is not even JSON has no id to place it in a slice: slice 0 counts it, the
    others pass it over, and a slice whose own rows are all bad is no error while the input has good rows (the
    run over the whole input would exit 0 too). An input of bad rows only is exit 3, as without --partition."""
    base = [
        "generate",
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--skip-invalid",
    ]
    rows = problems.read_text().splitlines()
    mine = [row for row in rows if in_partition(json.loads(row)["id"], 1, 2)]  # every good row in slice 1
    data = tmp_path / "mixed.jsonl"
    data.write_text("\n".join([mine[0], "{not json", *mine[1:]]) + "\n")
    stats = []
    for k in range(2):
        for _ in range(2):  # and the same again: a rerun of a slice ends as the first run did
            proc = run_cli(*base, str(data), "-o", str(tmp_path / f"part{k}"), "--partition", f"{k}/2")
            assert proc.returncode == 0, proc.stderr.decode()
        stats.append(json.loads((tmp_path / f"part{k}" / "manifest.json").read_text())["last_run"]["stats"])
    assert [s["invalid_rows"] for s in stats] == [1, 0] and [s["problems"] for s in stats] == [1, len(mine)]
    assert b"malformed JSON" not in proc.stderr  # slice 1 passed the row over without a word

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n[1, 2]\n")
    codes = [
        run_cli(*base, str(bad), "-o", str(tmp_path / f"bad{k}"), "--partition", f"{k}/2").returncode for k in range(2)
    ]
    assert codes == [3, 0]
