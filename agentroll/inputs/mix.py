"""Several inputs in one run, by weight (`--mix math.parquet=0.7 --mix code.jsonl=0.3`).

The rows are interleaved deterministically: a smooth weighted round robin, so every prefix of the mixed stream
holds each source in about its share, and the same inputs and weights give the same order on every run (a rerun
walks it again and skips what is done: resumable by the ids, as one input is). A source that runs out leaves the
others to share what is left. Each row's metadata names its source (`source`: the file's name, or `NAME=` given
in the spec); a row's own `source` field is kept as `row_source`. One id in two sources is a bad row, as it is
twice in one file.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, UsageError
from .read import DEFAULT_KEYS, aread_problems, check
from .rows import InputKeys, Problem


@dataclass(frozen=True, slots=True)
class Source:
    name: str
    path: str
    weight: float


def parse_mix(specs: list[str]) -> list[Source]:
    """`[NAME:]PATH=WEIGHT` each (the weight a positive number; they need not add up to 1)."""
    out: list[Source] = []
    for spec in specs:
        where, eq, raw = spec.rpartition("=")
        try:
            weight = float(raw)
        except ValueError:
            weight = math.nan
        if not eq or not where or not (math.isfinite(weight) and weight > 0):
            raise UsageError(f"--mix {spec!r}: expected PATH=WEIGHT (or NAME:PATH=WEIGHT), with a weight above 0")
        name, colon, path = where.partition(":")
        if not colon or "/" in name or not path:
            name, path = Path(where).name, where
        if where == "-" or path == "-":
            raise UsageError(f"--mix {spec!r}: a mixed input is a file, not stdin")
        if any(s.name == name for s in out):
            raise UsageError(f"--mix {spec!r}: two inputs named {name!r}; name one NAME:PATH=WEIGHT")
        out.append(Source(name, path, weight))
    return out


def check_mix(sources: list[Source]) -> None:
    for source in sources:
        check(source.path)


async def amix(
    sources: list[Source], keys: InputKeys = DEFAULT_KEYS, on_invalid: Callable[[InputError], None] | None = None
) -> AsyncIterator[Problem]:
    """The sources' problems interleaved by weight (see the module's docstring)."""
    streams = {s.name: aread_problems(s.path, keys, on_invalid).__aiter__() for s in sources}
    weights = {s.name: s.weight for s in sources}
    credit = dict.fromkeys(weights, 0.0)
    first: dict[str, tuple[str, int]] = {}  # id -> (source, line) of its first row
    try:
        while weights:
            total = sum(weights.values())
            for name, weight in weights.items():
                credit[name] += weight
            name = max(weights, key=lambda n: (credit[n], -list(weights).index(n)))
            credit[name] -= total
            try:
                problem = await anext(streams[name])
            except StopAsyncIteration:
                del weights[name], credit[name]
                continue
            seen = first.get(problem.id)
            if seen is not None:
                error = InputError(
                    problem.source,
                    problem.line,
                    keys.id,
                    f"duplicate id {problem.id!r} (first in {seen[0]}, line {seen[1]})",
                )
                if on_invalid is None:
                    raise error
                on_invalid(error)
                continue
            first[problem.id] = (problem.source, problem.line)
            metadata = dict(problem.metadata)
            if "source" in metadata:
                metadata["row_source"] = metadata.pop("source")
            metadata["source"] = name
            problem.metadata = metadata
            yield problem
    finally:
        for stream in streams.values():
            await stream.aclose()  # type: ignore[attr-defined]
