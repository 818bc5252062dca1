"""docs/inputs.md's error examples are what agentroll prints: each is made here and run, and the block must be
exactly the lines that come out."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

from .conftest import TOKENIZER, run_cli, run_process

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

DOC = Path(__file__).resolve().parent.parent / "docs" / "inputs.md"
ROWS = [{"prompt": f"What is {10 + i} plus {7 + i}?", "label": str(17 + 2 * i)} for i in range(4)]


def documented() -> list[str]:
    errors = DOC.read_text().split("## Errors", 1)[1]
    block = re.search(r"```\n(.*?)```", errors, re.S)
    assert block is not None
    return block.group(1).splitlines()


def said(proc) -> str:
    lines = [line for line in proc.stderr.decode().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr.decode()
    return lines[0]


def test_the_documented_input_errors_are_the_ones_printed(sim, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = b"".join(json.dumps(r).encode() + b"\n" for r in ROWS)
    no_label = [dict(r) for r in ROWS]
    del no_label[2]["label"]
    names = list(dict.fromkeys(k for r in no_label for k in r))
    pq.write_table(pa.table({k: [r.get(k) for r in no_label] for k in names}), "data.parquet", row_group_size=2)
    flags = ["-o", "out", "--base-url", sim.url, "--tokenizer", TOKENIZER, "--system", "single", "--reward", "exact"]

    def generate(path: str) -> str:
        return said(run_cli("generate", path, *flags))

    printed = [generate("data.parquet")]
    Path("data.jsonl.gz").write_bytes(gzip.compress(plain)[:-12])
    printed.append(generate("data.jsonl.gz"))
    Path("data.jsonl.gz").write_bytes(plain)
    printed.append(generate("data.jsonl.gz"))
    printed.append(said(run_process("generate", "-", *flags, stdin=Path("data.parquet").read_bytes())))
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    printed.append(generate("data.parquet"))
    assert printed == documented()
