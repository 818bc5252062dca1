"""`agentroll view DIR -o page.html [--sample N]`: the page written once, with its data, as one file.

It opens offline (a mail attachment, a CI artifact) and needs no server: the same page as the served one, its
list filtered and searched in the browser. It holds every group's tokens, so it is for a small folder, or a
sample of a large one: `--sample N` groups drawn at random (`--seed`), listed in folder order. A folder of
more than `MOST_RECORDS` records without `--sample` is refused before anything is written (exit 2).
"""

from __future__ import annotations

import os
import random
from typing import Any

from ...errors import OutputError, UsageError
from ..html import writable, write_html
from .index import Index
from .page import page

MOST_RECORDS = 5000


def write_page(
    index: Index, output: str | os.PathLike[str], sample: int | None = None, seed: int = 0
) -> dict[str, Any]:
    """Read the folder once (`index`, not following), choose its groups, write the page atomically. Returns
    {"output", "bytes", "groups", "records", "of"}."""
    target = writable(output, "the page")
    if sample is not None and sample < 1:
        raise UsageError(f"--sample {sample}: must be 1 or more")
    index.run()
    if index.error is not None:
        raise OutputError(index.error)
    rows = index.rows
    total = len(rows)
    chosen = list(range(total))
    if sample is not None and sample < total:
        chosen = sorted(random.Random(seed).sample(range(total), sample))
    records = sum(rows[n]["records"] for n in chosen)
    if sample is None and records > MOST_RECORDS:
        raise UsageError(
            f"{index.folder} holds {records:,} records: a page of them all would be too heavy to open; pass "
            f"--sample N for N of its {total:,} groups, or serve it (agentroll view {index.folder})"
        )
    index.decoder.load()
    data = {
        "status": index.status(),
        "rows": [rows[n] for n in chosen],
        "groups": {str(n): index.group(n) for n in chosen},
        "sample": {"n": len(chosen), "of": total, "seed": seed} if sample is not None else None,
    }
    html, _ = page(data, f"agentroll view: {index.folder}")
    write_html(target, html, "the page")
    return {"output": str(target), "bytes": len(html.encode()), "groups": len(chosen), "records": records, "of": total}
