"""Input formats: Parquet (row groups through pyarrow), gzip and zstd JSONL, told by their bytes, with the same ids,
metadata and one-line errors as plain JSONL. Every file here is written by the real library (pyarrow, gzip,
zstandard), as a user's dataset would be."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import gzip
import json
import math
import sys
from pathlib import Path

import pytest

from agentroll.errors import InputError, UsageError
from agentroll.inputs import aread_problems, count_rows, read_problems, rows_to_read
from agentroll.inputs.read import AHEAD

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")

CHAT = [  # as HF datasets and verl ship them: chat messages, string labels, nested metadata
    {
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "label": "4",
        "source": "a",
        "extra": {"level": 1, "tags": ["x", "y"]},
    },
    {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}],
        "label": "7",
        "source": "b",
        "extra": {"level": 2, "tags": []},
    },
    {"id": "given", "prompt": [{"role": "user", "content": "hi", "name": "ann"}], "label": "1", "source": "c"},
]
PLAIN = [{"prompt": f"What is {i} + {i}?", "label": 2 * i, "weight": i / 4} for i in range(3)]  # int labels
ROWS = CHAT


def jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def write_parquet(path: Path, rows: list[dict], **kwargs) -> Path:
    """As a dataset library writes them: one column per field of any row, null where a row lacks it."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in names}), path, **kwargs)
    return path


def seen(problems) -> list[tuple]:
    return [(p.id, p.content_hash, p.prompt, p.label, p.metadata, p.line) for p in problems]


async def collect(path: str, **kw) -> list:
    return [p async for p in aread_problems(path, **kw)]


@pytest.mark.parametrize("rows", [CHAT, PLAIN], ids=["chat", "plain"])
def test_a_row_has_the_same_id_prompt_label_and_metadata_in_every_format(tmp_path, rows):
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(jsonl_bytes(rows))
    files = {
        "gzip": tmp_path / "in.jsonl.gz",
        "zstd": tmp_path / "in.jsonl.zst",
        "parquet": write_parquet(tmp_path / "in.parquet", rows, row_group_size=2),
        "gzip named .jsonl": tmp_path / "gz.jsonl",
    }
    files["gzip"].write_bytes(gzip.compress(plain.read_bytes()))
    files["zstd"].write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    files["gzip named .jsonl"].write_bytes(files["gzip"].read_bytes())
    expected = seen(read_problems(str(plain)))
    assert len(expected) == 3 and [e[3] for e in expected] == [r["label"] for r in rows]
    for name, path in files.items():
        assert seen(read_problems(str(path))) == expected, name
        assert seen(asyncio.run(collect(str(path)))) == expected, name
    if rows is CHAT:  # in Parquet every message has a "name" (null but in row 3): absent, as in the JSONL
        assert pq.read_table(files["parquet"]).column("prompt").type.value_type.num_fields == 3
        assert expected[2][0] == "given" and expected[1][4] == {"source": "b", "extra": {"level": 2, "tags": []}}


def test_a_parquet_file_named_jsonl_is_read_as_parquet_not_as_malformed_json(tmp_path):
    path = write_parquet(tmp_path / "data.jsonl", ROWS)
    assert [p.label for p in read_problems(str(path))] == ["4", "7", "1"]


def test_parquet_values_become_the_values_their_json_would_hold(tmp_path):
    table = pa.table(
        {
            "prompt": ["p"],
            "label": pa.array([7], pa.int32()),
            "price": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
            "count": pa.array([decimal.Decimal("3")], pa.decimal128(5, 0)),
            "day": [datetime.date(2024, 5, 1)],
            "at": pa.array([datetime.datetime(2024, 5, 1, 12, 30)], pa.timestamp("us")),
            "text": pa.array([b"caf\xc3\xa9"], pa.binary()),
            "weights": pa.array([[("a", 1.0), ("b", float("nan"))]], pa.map_(pa.string(), pa.float64())),
            "scores": pa.array([[1.0, None, 2.5]], pa.list_(pa.float64())),
            "nothing": pa.array([None], pa.string()),
            "__index_level_0__": [17],
        }
    )
    pq.write_table(table, tmp_path / "v.parquet")
    (problem,) = read_problems(str(tmp_path / "v.parquet"))
    assert problem.label == 7 and type(problem.label) is int
    assert problem.metadata == {
        "price": 1.5,
        "count": 3,
        "day": "2024-05-01",
        "at": "2024-05-01T12:30:00",
        "text": "café",
        "weights": {"a": 1.0, "b": None},
        "scores": [1.0, None, 2.5],
    }
    assert type(problem.metadata["count"]) is int and not any(
        isinstance(v, float) and math.isnan(v) for v in problem.metadata["weights"].values()
    )


@pytest.mark.parametrize(
    ("column", "values", "field", "reason"),
    [
        ("label", [1, None, 3], "label", "missing"),
        ("blob", [b"ok", b"\xff\xfe", b"ok"], "blob", "binary data (2 bytes, not UTF-8 text)"),
        ("id", ["a", "b", "a"], "id", "duplicate id 'a' (first on line 1)"),
    ],
)
def test_a_bad_parquet_row_names_the_file_the_row_and_the_field(tmp_path, column, values, field, reason):
    data = {"prompt": ["x", "y", "z"], "label": [1, 2, 3], column: values}
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(data), path, row_group_size=1)  # the bad row in a later row group: rows count on
    row = 3 if column == "id" else 2
    with pytest.raises(InputError) as info:
        list(read_problems(str(path)))
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), row, field)
    assert str(err).startswith(f"{path}:{row}: field '{field}': {reason}") and "\n" not in str(err)
    skipped: list = []
    kept = asyncio.run(collect(str(path), on_invalid=skipped.append))
    assert [e.line for e in skipped] == [row] and len(kept) == 2


def test_a_parquet_file_without_the_prompt_column_is_one_error_on_its_first_row(tmp_path):
    path = write_parquet(tmp_path / "q.parquet", [{"question": "x", "label": 1}])
    with pytest.raises(InputError, match=r"q\.parquet:1: field 'prompt': missing"):
        list(read_problems(str(path)))


def test_a_large_parquet_file_is_read_a_row_group_at_a_time(tmp_path, monkeypatch):
    groups, per_group = 40, 100
    rows = [{"prompt": f"What is {i} + 1?", "label": i + 1} for i in range(groups * per_group)]
    path = write_parquet(tmp_path / "big.parquet", rows, row_group_size=per_group)
    assert pq.ParquetFile(path).num_row_groups == groups
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def tracked(self, index, *args, **kwargs):
        read.append(index)
        return original(self, index, *args, **kwargs)

    def whole(*_args, **_kwargs):
        raise AssertionError("the whole file was read at once")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", tracked)
    for name in ("read", "read_row_groups", "iter_batches"):
        monkeypatch.setattr(pq.ParquetFile, name, whole)
    monkeypatch.setattr(pq, "read_table", whole)

    problems = read_problems(str(path))
    first = next(problems)
    assert (first.label, read) == (1, [0])  # the first row needs only the first row group
    assert sum(1 for _ in problems) == groups * per_group - 1 and read == list(range(groups))

    async def first_only() -> int:
        read.clear()
        async for _ in aread_problems(str(path)):
            break
        return len(read)

    assert asyncio.run(first_only()) <= AHEAD + 1  # the reader thread reads a bounded number of groups ahead

    read.clear()
    assert rows_to_read([str(path)]) == groups * per_group and read == []  # the count is the footer's
    assert rows_to_read([str(path)], 10) == 10


def test_concatenated_gzip_members_and_zstd_frames_are_all_read(tmp_path):
    rows = [{"prompt": f"q{i}", "label": i} for i in range(6)]
    gz, zst = tmp_path / "a.jsonl.gz", tmp_path / "a.jsonl.zst"
    gz.write_bytes(gzip.compress(jsonl_bytes(rows[:3])) + gzip.compress(jsonl_bytes(rows[3:])))  # `cat a.gz b.gz`
    compressor = zstandard.ZstdCompressor()
    zst.write_bytes(compressor.compress(jsonl_bytes(rows[:2])) + compressor.compress(jsonl_bytes(rows[2:])))
    for path in (gz, zst):
        assert [p.label for p in read_problems(str(path))] == list(range(6))
        assert [p.label for p in asyncio.run(collect(str(path)))] == list(range(6))
        assert count_rows(str(path)) == 6


def test_a_cut_short_or_misnamed_compressed_file_is_one_error(tmp_path):
    rows = [{"prompt": "p" * 200 + str(i), "label": i} for i in range(2000)]
    whole = gzip.compress(jsonl_bytes(rows))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    got: list = []
    with pytest.raises(InputError, match=r"cut\.jsonl\.gz: the gzip data ends early: the file is cut short"):
        got.extend(read_problems(str(cut)))
    assert 0 < len(got) < 2000  # the rows before the cut were read, in order
    assert [p.label for p in got] == list(range(len(got)))
    assert count_rows(str(cut)) is None  # the progress bar does not fail on it: the reader does, after those rows

    plain = tmp_path / "plain.jsonl.zst"
    plain.write_bytes(jsonl_bytes(rows[:1]))
    with pytest.raises(InputError, match=r"plain\.jsonl\.zst: named \.zst but does not start as zstd data does"):
        list(read_problems(str(plain)))
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(jsonl_bytes(rows[:1]))
    with pytest.raises(InputError, match=r"named \.parquet but does not start as a Parquet file \(PAR1\) does"):
        asyncio.run(collect(str(fake)))
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(whole[:10] + b"\x00" * 50 + whole[60:])
    with pytest.raises(InputError, match=r"damaged\.jsonl\.gz: damaged gzip data"):
        list(read_problems(str(damaged)))


def test_without_pyarrow_a_parquet_input_is_one_usage_error_naming_the_install(tmp_path, monkeypatch):
    path = write_parquet(tmp_path / "in.parquet", ROWS)
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    with pytest.raises(UsageError) as info:
        asyncio.run(collect(str(path)))
    assert str(info.value) == f"{path} is a Parquet file; reading it needs pyarrow: pip install 'agentroll[parquet]'"
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert count_rows(str(path)) is None  # the progress bar does not fail first


def test_count_rows_for_the_progress_bar(tmp_path):
    rows = [{"prompt": f"q{i}", "label": i} for i in range(5)]
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(jsonl_bytes(rows) + b"\n\n")  # blank lines are no rows
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert (count_rows(str(plain)), count_rows(str(gz))) == (5, 5)
    assert count_rows(str(gz), most_compressed=10) is None  # past the cap: not worth decompressing twice
    assert count_rows("-") is None and rows_to_read(["-"], 3) == 3


@pytest.mark.parametrize("compress", [gzip.compress, zstandard.ZstdCompressor().compress], ids=["gzip", "zstd"])
def test_a_highly_compressed_file_is_handed_on_in_bounded_pieces(tmp_path, compress):
    from agentroll.inputs.read import items

    line = json.dumps({"prompt": "x" * 2000, "label": 1}).encode() + b"\n"
    plain = line * 12_000  # 24 MB that compress to a few hundred KB
    path = tmp_path / "big.jsonl.x"
    path.write_bytes(compress(plain))
    assert path.stat().st_size * 40 < len(plain)
    sizes = [len(piece) for piece in items(str(path))]
    assert sum(sizes) == len(plain) and max(sizes) < 4 * 2**20  # the reader thread's 8 pieces stay small
