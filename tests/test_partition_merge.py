"""Splitting a job across hosts with --partition, and joining the folders again with `agentroll merge`."""

from __future__ import annotations

import json
from pathlib import Path

from agentroll.inputs import in_partition

from .conftest import TOKENIZER, read_records, run_cli


def test_partition_is_a_stable_exact_split():
    ids = [f"q{i}" for i in range(1000)]
    slices = [[i for i in ids if in_partition(i, k, 3)] for k in range(3)]
    assert sorted(i for s in slices for i in s) == sorted(ids) and all(250 < len(s) < 420 for s in slices)
    assert in_partition("q7", 1, 3) == in_partition("q7", 1, 3)


def shard_records(manifest_dir: Path) -> list[dict]:
    manifest = json.loads((manifest_dir / "manifest.json").read_text())
    lines = [line for s in manifest["shards"] for line in (manifest_dir / s["file"]).read_text().splitlines()]
    return [json.loads(line) for line in lines]


def test_slices_cover_the_input_once_and_merge_joins_them(sim, problems, tmp_path):
    base = ["generate", str(problems), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--num-parallel", "1",
            "--reward", "exact", "--shard-size", "5"]
    for k in range(2):
        proc = run_cli(*base, "-o", str(tmp_path / f"part{k}"), "--partition", f"{k}/2")
        assert proc.returncode == 0, proc.stderr.decode()
    parts = [{r["problem_id"] for r in read_records(tmp_path / f"part{k}")} for k in range(2)]
    assert not parts[0] & parts[1] and parts[0] | parts[1] == {f"p{i:03d}" for i in range(8)}

    linked = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part1"), "-o", str(tmp_path / "all"),
                     "--verify")
    assert linked.returncode == 0, linked.stderr.decode()
    merged = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert merged["complete"] and merged["executions"] == 8 and merged["settings"]["partition"] is None
    assert not list((tmp_path / "all").glob("*.jsonl"))  # nothing copied
    records = shard_records(tmp_path / "all")
    assert len(records) == merged["records"] and {r["problem_id"] for r in records} == parts[0] | parts[1]

    copied = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part1"), "-o", str(tmp_path / "copy"),
                     "--copy")
    assert copied.returncode == 0
    assert len(list((tmp_path / "copy").glob("rollouts-*.jsonl"))) == len(merged["shards"])
    assert shard_records(tmp_path / "copy") == records

    twice = run_cli("merge", str(tmp_path / "part0"), str(tmp_path / "part0"), "-o", str(tmp_path / "bad"))
    assert twice.returncode == 6 and b"is in both" in twice.stderr
    into_merged = run_cli(*base, "-o", str(tmp_path / "all"))
    assert into_merged.returncode == 6 and b"merged view" in into_merged.stderr


def test_merge_refuses_folders_made_with_other_settings(sim, problems, tmp_path):
    base = ["generate", str(problems), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--num-parallel", "1",
            "--reward", "exact"]
    assert run_cli(*base, "-o", str(tmp_path / "a"), "--partition", "0/2").returncode == 0
    assert run_cli(*base, "-o", str(tmp_path / "b"), "--partition", "1/2", "--temperature", "0.3").returncode == 0
    proc = run_cli("merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "m"))
    assert proc.returncode == 6 and b"other settings" in proc.stderr and b"temperature" in proc.stderr
