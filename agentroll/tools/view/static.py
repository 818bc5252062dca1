"""`agentroll view DIR -o page.html [--sample N]`: the page written once, with its data, as one file.

It opens offline (a mail attachment, a CI artifact) and needs no server: the same page as the served one, its
list filtered and searched in the browser. It holds every group's tokens, so it is for a small folder, or a
sample of a large one: `--sample N` groups drawn at random (`--seed`), listed in folder order. A folder of
more than `MOST_RECORDS` records without `--sample` is refused before anything is written (exit 2): above that,
served mode (which reads a group when it is opened) is the answer.

The list's rows are inlined as JSON; each group's data (its records' tokens, the bulk of the page) is inlined
gzip-compressed, in base64, one group apiece, and decompressed by the browser (`DecompressionStream`) only when
the group is opened or searched: the page is a fraction of the folder's size, and opening it parses the list
alone.
"""

from __future__ import annotations

import base64
import gzip
import os
import random
from typing import Any

import orjson

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
        "groups": {str(n): packed(index.group(n)) for n in chosen},
        "sample": {"n": len(chosen), "of": total, "seed": seed} if sample is not None else None,
    }
    html, _ = page(data, f"agentroll view: {index.folder}")
    write_html(target, html, "the page")
    return {"output": str(target), "bytes": len(html.encode()), "groups": len(chosen), "records": records, "of": total}


def packed(group: dict[str, Any]) -> str:
    """A group as the page holds it: each token's decoded piece given once per id (`pieces`; a token whose piece
    differs there, a character cut across tokens say, listed apart in `tx`), the JSON gzip-compressed (no
    timestamp: the same folder, the same page), in base64 (the text a script element can hold). view.js's
    `inlineGroup` undoes it."""
    pieces: dict[int, str] = {}
    shrunk = _by_id(group, pieces)
    raw = orjson.dumps({"pieces": pieces, "group": shrunk}, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode()


def _by_id(node: Any, pieces: dict[int, str]) -> Any:
    """`node` with every token list ({"id": [...], "t": [...]}) giving its pieces by `pieces`, filled as met."""
    if isinstance(node, list):
        return [_by_id(x, pieces) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _by_id(v, pieces) for k, v in node.items() if k != "t"}
    ids, texts = node.get("id"), node.get("t")
    if (
        isinstance(ids, list)
        and isinstance(texts, list)
        and len(ids) == len(texts)
        and all(type(x) is int for x in ids)
        and all(type(x) is str for x in texts)
    ):
        apart = []
        for i, (token, text) in enumerate(zip(ids, texts, strict=True)):
            if pieces.setdefault(token, text) != text:
                apart.append([i, text])
        out["tx"] = apart
    elif "t" in node:
        out["t"] = _by_id(node["t"], pieces)
    return out
