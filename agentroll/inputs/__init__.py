"""Prompt input: one validated `Problem` per row, streamed, never the whole file in memory.

Formats (docs/inputs.md): JSONL, plain or gzip or zstd compressed, from a file or stdin; Parquet from a file
(`pip install 'agentroll[parquet]'`). The first bytes decide the format, not the name. A row's identity is its
content (`content_hash` of prompt and label), the same in every format.

    rows     `Problem`, `InputKeys`, `problem_from_row`, `content_hash`, partitions
    formats  sniffing, decompression, line splitting, row counts for the progress bar
    parquet  row groups through pyarrow, values made JSON's
    read     `read_problems`, `aread_problems` (a reader thread, so the event loop never blocks)
"""

from .formats import count_rows, rows_to_read
from .read import aread_problems, check, read_problems
from .rows import (
    InputKeys,
    Problem,
    content_hash,
    in_partition,
    parse_partition,
    parse_row,
    problem_from_row,
    source_name,
)

__all__ = [
    "InputKeys",
    "Problem",
    "aread_problems",
    "check",
    "content_hash",
    "count_rows",
    "in_partition",
    "parse_partition",
    "parse_row",
    "problem_from_row",
    "read_problems",
    "rows_to_read",
    "source_name",
]
