"""Which format an input is, and its bytes as JSONL: plain, gzip or zstd, told by the first bytes.

The bytes decide, not the name: a Parquet file named `.jsonl` is read as Parquet, a gzip file named `.jsonl` as
gzip. A name that promises compression the bytes do not have (`x.jsonl.gz` holding plain text) is refused, since
it is more likely damaged than mislabelled. Stdin and pipes are sniffed the same way from their first bytes;
Parquet, which is read from its footer, needs a regular file.

Reading uses raw `os.read` on a file descriptor: the reader thread of `aread_problems` must hold no lock that
interpreter shutdown needs (stdin's buffer has one). A compressed stream is decoded a member (gzip) or frame
(zstd) at a time, so a file cut short is reported instead of silently ending early.
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError

CHUNK = 1 << 16
PIECE = 1 << 20  # plain bytes decoded at a time, about (see Decoder.feed)
PARQUET_MAGIC = b"PAR1"
MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", PARQUET_MAGIC: "parquet"}
SUFFIXES = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".parquet": "parquet", ".pq": "parquet"}


def sniff(head: bytes) -> str:
    """`parquet`, `gzip`, `zstd`, or `jsonl` for anything else, from a stream's first (up to 4) bytes."""
    return next((kind for magic, kind in MAGIC.items() if head.startswith(magic)), "jsonl")


def named(path: str) -> str | None:
    """The format a file's last suffix promises, if any."""
    return SUFFIXES.get(Path(path).suffix.lower())


def is_regular(path: str) -> bool:
    try:
        return path != "-" and stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def file_format(path: str) -> str:
    """The format of a regular file, from its first bytes (`jsonl` for stdin and pipes: sniffed as they are read).
    Raises `InputError` when the name promises a format the bytes do not have."""
    if not is_regular(path):
        return "jsonl"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise InputError(path, 0, None, f"cannot read: {exc.strerror or exc}") from exc
    kind = sniff(head)
    _check_name(path, kind, empty=not head)
    return kind


def _check_name(path: str, kind: str, empty: bool) -> None:
    promised = named(path)
    if promised is not None and promised != kind and kind == "jsonl" and not empty:
        what = "a Parquet file (PAR1)" if promised == "parquet" else f"{promised} data"
        raise InputError(
            path, 0, None, f"named {Path(path).suffix} but does not start as {what} does: damaged, or misnamed"
        )


class Decoder:
    """Decompresses a gzip or zstd stream fed in pieces, member after member (frame after frame)."""

    def __init__(self, kind: str, source: str) -> None:
        self.kind, self.source = kind, source
        self.obj: Any = None
        self.consumed = 0
        self.size = 64  # compressed bytes of the next slice

    def _new(self) -> Any:
        if self.kind == "gzip":
            return zlib.decompressobj(wbits=31)
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj()

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The plain bytes of `data`, in pieces of about `PIECE` bytes: neither zlib's nor zstd's decompressobj
        bounds what one call returns, so the compressed bytes go in by slices that start small and at most double
        while the plain bytes they give stay under `PIECE`. The reader thread reads a few pieces ahead, so memory
        stays small even for a file that compresses ten-thousandfold."""
        pos = 0
        while pos < len(data):
            piece = data[pos : pos + self.size]
            out = self._decode(piece)
            pos += len(piece)
            self.consumed += len(piece)
            fits = PIECE * len(piece) // len(out) if out else CHUNK  # the slice that would give PIECE bytes
            self.size = max(64, min(CHUNK, 2 * self.size, fits))
            yield out

    def _decode(self, data: bytes) -> bytes:
        out = []
        while data:
            if self.obj is None:
                if not data.strip(b"\0"):  # zero padding after the last member, as tape tools write
                    break
                self.obj = self._new()
            try:
                out.append(self.obj.decompress(data))
            except Exception as exc:  # zlib.error, zstandard.ZstdError
                raise InputError(
                    self.source, 0, None, f"damaged {self.kind} data after {self.consumed} bytes ({exc})"
                ) from None
            if self.obj.eof:
                data, self.obj = self.obj.unused_data, None
            else:
                data = b""
        return b"".join(out)

    def finish(self) -> None:
        if self.obj is not None:
            raise InputError(self.source, 0, None, f"the {self.kind} data ends early: the file is cut short")


def byte_chunks(path: str, source: str) -> Iterator[bytes]:
    """A file's (or stdin's, `-`) bytes as plain JSONL, a chunk at a time, decompressed when they are gzip or zstd."""
    try:
        fd = 0 if path == "-" else os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InputError(source, 0, None, f"cannot read: {exc.strerror or exc}") from exc
    try:
        head = b""
        while len(head) < 4:  # a pipe may hand the first bytes over in pieces
            piece = _read(fd, source)
            if not piece:
                break
            head += piece
        kind = sniff(head)
        if kind == "parquet":
            raise InputError(
                source, 0, None, "is Parquet, which is read from its footer: give the file's path, not a pipe"
            )
        if path != "-":
            _check_name(path, kind, empty=not head)
        decoder = Decoder(kind, source) if kind != "jsonl" else None
        data = head
        while data:
            if decoder is None:
                yield data
            else:
                yield from decoder.feed(data)
            data = _read(fd, source)
        if decoder is not None:
            decoder.finish()
    finally:
        if fd != 0:
            os.close(fd)


def _read(fd: int, source: str) -> bytes:
    try:
        return os.read(fd, CHUNK)
    except OSError as exc:
        raise InputError(source, 0, None, f"cannot read: {exc.strerror or exc}") from exc


class Lines:
    """Splits a byte stream fed in chunks into lines, without copying a long line once per chunk."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\n" not in chunk:
            if chunk:
                self.parts.append(chunk)
            return []
        first, *lines, rest = chunk.split(b"\n")
        if self.parts:
            first = b"".join([*self.parts, first])
        self.parts = [rest] if rest else []
        return [first, *lines]

    def end(self) -> list[bytes]:
        tail = b"".join(self.parts)
        self.parts = []
        return [tail] if tail else []


def count_rows(path: str, most_bytes: int = 256 * 2**20, most_compressed: int = 32 * 2**20) -> int | None:
    """Rows in a regular file, for a progress bar; None where counting would cost much: stdin or a pipe, a big
    file. Parquet's count is in its footer; a compressed file is decompressed (up to `most_compressed` bytes)."""
    if not is_regular(path):
        return None
    kind = file_format(path)
    size = os.path.getsize(path)
    if kind == "parquet":
        from .parquet import row_count

        return row_count(path)
    if size > (most_bytes if kind == "jsonl" else most_compressed):
        return None
    lines, rows = Lines(), 0
    try:
        for chunk in byte_chunks(path, path):
            rows += sum(1 for line in lines.feed(chunk) if line.strip())
    except InputError:
        return None  # damaged: the reader says so, after the rows before the damage
    return rows + sum(1 for line in lines.end() if line.strip())


def rows_to_read(paths: list[str], limit: int | None = None) -> int | None:
    """Rows the inputs hold, at most `limit`, for a progress bar: None when a count would cost much (one input's
    `limit` then, all there is to go on). A file that cannot be read is a bad input (exit 3)."""
    counts = []
    for path in paths:
        try:
            counts.append(count_rows(path))
        except OSError as exc:
            raise InputError(path, 0, None, f"cannot read: {exc.strerror or exc}") from exc
    known = [c for c in counts if c is not None]
    if len(known) < len(counts):
        return limit if len(paths) == 1 else None
    return min(sum(known), limit) if limit is not None else sum(known)
