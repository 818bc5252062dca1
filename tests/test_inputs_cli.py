"""`agentroll generate` on Parquet and compressed input, as a user runs it (a subprocess, the simulated vLLM)."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from .conftest import TOKENIZER, generations, read_records, run_cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def args(source: str, out, sim) -> list[str]:
    return [
        "generate",
        source,
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
        "--quiet",
    ]


def test_a_parquet_run_and_a_jsonl_run_of_the_same_rows_are_the_same_problems(sim, problems, tmp_path):
    rows = [json.loads(line) for line in problems.read_text().splitlines()]
    for row in rows:
        del row["id"]  # ids from content: the identity rule is what is checked
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=3)

    made = run_cli(*args(str(parquet), tmp_path / "from-parquet", sim))
    assert made.returncode == 0, made.stderr.decode()
    assert run_cli(*args(str(jsonl), tmp_path / "from-jsonl", sim)).returncode == 0

    def problems_of(folder) -> set[tuple]:  # the simulated model answers at random: what it was asked is compared
        return {
            (r["problem_id"], r["problem_hash"], r["label"], json.dumps(r["metadata"]))
            for r in read_records(folder)
            if r["stage"] == "solver"
        }

    a = problems_of(tmp_path / "from-parquet")
    assert a == problems_of(tmp_path / "from-jsonl") and len(a) == len(rows)

    calls = len(generations(sim))  # the JSONL into the Parquet run's folder: every row is already done
    again = run_cli(*args(str(jsonl), tmp_path / "from-parquet", sim))
    assert again.returncode == 0 and len(generations(sim)) == calls


@pytest.mark.parametrize("compress", [gzip.compress, zstandard.ZstdCompressor().compress], ids=["gzip", "zstd"])
def test_compressed_jsonl_on_stdin_is_read(sim, problems, tmp_path, compress):
    proc = run_cli(*args("-", tmp_path / "out", sim), stdin=compress(problems.read_bytes()))
    assert proc.returncode == 0, proc.stderr.decode()
    assert {r["problem_id"] for r in read_records(tmp_path / "out")} == {f"p{i:03d}" for i in range(8)}


def test_parquet_on_stdin_is_one_line_asking_for_the_path(sim, problems, tmp_path):
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([json.loads(x) for x in problems.read_text().splitlines()]), parquet)
    proc = run_cli(*args("-", tmp_path / "out", sim), stdin=parquet.read_bytes())
    message = proc.stderr.decode()
    assert proc.returncode == 3 and message.count("\n") == 1, message
    assert "<stdin>: is Parquet, which is read from its footer: give the file's path, not a pipe" in message
    assert generations(sim) == []
