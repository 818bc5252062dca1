"""Folders and servers the viewer's tests share: real runs on the simulated server (three-stage, tool use),
folders written by hand with the fields other work adds (teacher logprobs, policies), the viewer served on a
free loopback port, and plain HTTP against it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.view import Index, open_folder
from agentroll.tools.view.server import ViewServer

from . import synthetic
from .conftest import TOKENIZER, run_cli, write_problems


def sim_run(root: Path, system: str, *extra: str) -> Path:
    """A real run on the simulated server: 12 problems, K = 2, several shards, some truncated."""
    rows = write_problems(root / "problems.jsonl", 12)
    server = SimServer(script=Script.from_jsonl(rows), seed=5)
    server.start()
    try:
        made = run_cli(
            "generate", str(rows), "-o", str(root / "out"), "--base-url", server.url or "", "--tokenizer", TOKENIZER,
            "--system", system, "--num-parallel", "3", "--samples-per-prompt", "2", "--max-tokens", "200",
            "--shard-size", "30", "--seed", "5", "--quiet", *extra,
        )  # fmt: skip
    finally:
        server.stop()
    assert made.returncode == 0, made.stderr.decode()
    return root / "out"


def with_teacher_and_policies(folder: Path) -> Path:
    """A three-stage folder made by hand, its records given what `--teacher` and `--policy` add: a teacher
    logprob and rank per response token (the student's logprob minus a known gap), the teacher's top 2, and each
    execution's policy ("old" for execution 0, "new" for 1)."""
    synthetic.three_stage(folder)

    def add(records: list[dict[str, Any]]) -> None:
        for r in records:
            n = len(r["response_token_ids"])
            r["teacher_logprobs"] = [
                lp - 0.05 * (i + 1) * (r["worker"] + 1) for i, lp in enumerate(r["response_logprobs"])
            ]
            r["teacher_ranks"] = [1 + i % 3 for i in range(n)]  # what --teacher writes beside its logprobs
            r["teacher_top_ids"] = [[7, 8] for _ in range(n)]
            r["teacher_top_logprobs"] = [[-0.1, -2.5] for _ in range(n)]
            r["top_token_ids"] = [[9, 7] for _ in range(n)]  # --logprobs 2
            r["top_logprobs"] = [[-0.2, -1.9] for _ in range(n)]
            r["policy"] = "old" if r["sample_index"] == 0 else "new"

    return synthetic.edit(folder, add)


def index_of(folder: Path, tokenizer: str | None = TOKENIZER, audit: Path | None = None, follow: bool = True) -> Index:
    return open_folder(folder, tokenizer, audit, follow=follow)


@contextmanager
def served(index: Index) -> Iterator[ViewServer]:
    """The viewer on a free loopback port, its index following the folder, its tokenizer loading."""
    server = ViewServer(index, "127.0.0.1", 0)
    index.start()
    index.decoder.start()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def get(url: str, host: str | None = None) -> tuple[int, Any]:
    """(status, JSON body or text) of a GET, with another Host header when given."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            status, body, kind = answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, body, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    return status, json.loads(body) if "json" in kind else body.decode()
