"""Parquet input (HF datasets, verl): read a row group at a time with pyarrow, never the whole file.

pyarrow is an extra (`pip install 'agentroll[parquet]'`): a 40 MB wheel most JSONL users never need. Without it
a Parquet input is one line naming the install (exit 2: the file is fine, the installation lacks a part).

A row becomes the values its JSON line would hold, so that it gets the same id and metadata as the same row in
JSONL: structs become dicts and maps dicts with string keys, a null field of a struct (and a null column) is an
absent field (Parquet gives every struct of a column the same fields, filling the missing ones with null),
NaN becomes null, a decimal a number, a date or time its ISO text, a binary value its UTF-8 text. A value with
no JSON form (binary that is not UTF-8) is a bad row naming its column. pandas' stored index
(`__index_level_0__`, from `DataFrame.to_parquet` of a frame with a non-default index) is not a field.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Iterator
from typing import Any

from ..errors import InputError, UsageError, first_line

BATCH_ROWS = 256  # rows handed on at a time: the reader thread reads a few batches ahead, no more
INSTALL = "pip install 'agentroll[parquet]'"
PANDAS_INDEX = re.compile(r"__index_level_\d+__")


def _pq(source: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"{source} is a Parquet file; reading it needs pyarrow: {INSTALL}") from None
    return pq


def _open(path: str, source: str) -> Any:
    pq = _pq(source)
    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow.ArrowInvalid and kin, OSError
        raise InputError(source, 0, None, f"not a readable Parquet file ({first_line(exc)})") from None


def row_batches(path: str, source: str) -> Iterator[list[dict[str, Any]]]:
    """The file's rows in order, as Python dicts (pyarrow's values: `to_json` makes them JSON's), `BATCH_ROWS`
    at a time; one row group in memory at a time."""
    parquet = _open(path, source)
    try:
        done = 0
        for index in range(parquet.num_row_groups):
            try:
                table = parquet.read_row_group(index)
            except Exception as exc:
                raise InputError(source, done + 1, None, f"cannot read row group {index} ({first_line(exc)})") from None
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                rows = batch.to_pylist(maps_as_pydicts="lossy")
                done += len(rows)
                yield rows
            del table
    finally:
        parquet.close()


def row_count(path: str) -> int | None:
    """Rows in the file, from its footer; None when pyarrow is missing or the file unreadable (the reader says
    why)."""
    try:
        parquet = _open(path, path)
    except (InputError, UsageError):
        return None
    try:
        return int(parquet.metadata.num_rows)
    finally:
        parquet.close()


def to_json(row: Any, source: str, line: int) -> Any:
    """A row as its JSON line would hold it (see the module's docstring)."""
    if not isinstance(row, dict):
        return row
    out = {}
    for column, value in row.items():
        if value is not None and not PANDAS_INDEX.fullmatch(str(column)):
            out[str(column)] = _plain(value, source, line, str(column))
    return out


def _plain(value: Any, source: str, line: int, column: str) -> Any:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v, source, line, column) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v, source, line, column) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InputError(
                source,
                line,
                column,
                f"binary data ({len(value)} bytes, not UTF-8 text) has no JSON form: leave the column out",
            ) from None
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        exponent = value.as_tuple().exponent
        return int(value) if isinstance(exponent, int) and exponent >= 0 else float(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise InputError(source, line, column, f"a {type(value).__name__} value has no JSON form")
