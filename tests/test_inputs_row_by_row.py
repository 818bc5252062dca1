"""A row is handed on as soon as it is read, and a bad row raises when it is reached, in every format: the rows
before it are generated (and on disk) first, and `--limit` stops reading before a bad row further on."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest
import zstandard

from agentroll.errors import InputError
from agentroll.folder import Manifest
from agentroll.inputs import aread_problems, read_problems

from .conftest import TOKENIZER, run_cli

FORMATS = ["jsonl", "gzip", "zstd", "parquet"]


def rows(count: int) -> list[dict]:
    return [{"prompt": f"What is {10 + i} plus {7 + i}?", "label": str(17 + 2 * i)} for i in range(count)]


def write(tmp_path: Path, kind: str, data: list[dict]) -> str:
    """`data` as a file of `kind`, each written by the real library."""
    plain = b"".join(json.dumps(r).encode() + b"\n" for r in data)
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        names = list(dict.fromkeys(k for r in data for k in r))
        path = tmp_path / "in.parquet"
        pq.write_table(pa.table({k: [r.get(k) for r in data] for k in names}), path)
        return str(path)
    path = tmp_path / {"jsonl": "in.jsonl", "gzip": "in.jsonl.gz", "zstd": "in.jsonl.zst"}[kind]
    compress = {"jsonl": bytes, "gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress}[kind]
    path.write_bytes(compress(plain))
    return str(path)


def without_label_on_line_150(count: int = 200) -> list[dict]:
    data = rows(count)
    del data[149]["label"]
    return data


@pytest.mark.parametrize("kind", FORMATS)
def test_every_row_before_a_bad_one_is_handed_on_before_it_raises(tmp_path, kind):
    path = write(tmp_path, kind, without_label_on_line_150())
    got: list = []
    with pytest.raises(InputError) as raised:
        for problem in read_problems(path):
            got.append(problem)
    assert len(got) == 149 and str(raised.value) == f"{path}:150: field 'label': missing"

    async def collect() -> None:
        async for problem in aread_problems(path):
            got.append(problem)

    got.clear()
    with pytest.raises(InputError) as raised:
        asyncio.run(collect())
    assert len(got) == 149 and raised.value.line == 150


def generate(path: str, out: Path, sim, *extra: str):
    return run_cli(
        "generate",
        path,
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--system",
        "single",
        "--reward",
        "exact",
        "--quiet",
        *extra,
    )


@pytest.mark.parametrize("kind", ["jsonl", "gzip", "parquet"])
def test_a_bad_row_stops_the_run_after_the_rows_before_it_are_on_disk(sim, tmp_path, kind):
    path = write(tmp_path, kind, without_label_on_line_150())
    proc = generate(path, tmp_path / "out", sim, "--ordered")
    assert proc.returncode == 3, proc.stderr.decode()
    assert f"{path}:150: field 'label': missing" in proc.stderr.decode()
    assert Manifest.load(tmp_path / "out").groups == 149


@pytest.mark.parametrize("kind", FORMATS)
def test_limit_stops_reading_before_a_bad_row_further_on(sim, tmp_path, kind):
    data = rows(200)
    data[127] = dict(data[0])  # no ids: the same row twice is a duplicate id, on line 128
    path = write(tmp_path, kind, data)
    proc = generate(path, tmp_path / "out", sim, "--limit", "6")
    assert proc.returncode == 0, proc.stderr.decode()
    assert Manifest.load(tmp_path / "out").groups == 6
    again = generate(path, tmp_path / "all", sim)
    assert again.returncode == 3 and ":128: field 'id': duplicate id" in again.stderr.decode()


def test_limit_never_reads_the_row_after_its_last(sim, tmp_path):
    data = rows(8)
    del data[6]["label"]  # line 7: the first row --limit 6 does not take
    path = write(tmp_path, "jsonl", data)
    proc = generate(path, tmp_path / "out", sim, "--limit", "6")
    assert proc.returncode == 0, proc.stderr.decode()
    assert Manifest.load(tmp_path / "out").groups == 6


def test_limit_0_reads_no_row_and_writes_an_empty_complete_folder(sim, tmp_path):
    path = write(tmp_path, "jsonl", [{"prompt": "no label"}])
    proc = generate(path, tmp_path / "out", sim, "--limit", "0")
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.complete and manifest.groups == 0
