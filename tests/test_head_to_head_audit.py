"""`agentroll audit --policy NAME` on a head-to-head folder: each policy's records are audited against its own
model and server facts; by default the first policy's, the others' left out (never failed for being another
model's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from . import synthetic
from .test_audit_cli import SHAPED, audit, folder, names, tiny  # noqa: F401 (`tiny` is a fixture)

pytest.importorskip("torch")


def as_head_to_head(path: Path) -> None:
    """The folder's first execution of each problem as policy `new`'s, the second as `old`'s: two servers of the
    tiny model, as a head-to-head run records them."""

    def change(records: list[dict]) -> None:
        for r in records:
            r["policy"] = "new" if r["sample_index"] == 0 else "old"

    synthetic.edit(path, change)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["settings"]["policies"] = [{"name": n, "model": "tiny", "tokenizer": None} for n in ("new", "old")]
    facts = {"api": "generate", "logprobs_mode": "raw_logprobs"}
    manifest["servers"] = [{**facts, "policies": {"new": facts, "old": facts}, "prompt_ids": "alike"}]
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_each_policy_is_audited_on_its_own(tiny, tmp_path):  # noqa: F811
    path = folder(tmp_path / "out", tiny, "raw_logprobs", SHAPED, problems=2)
    as_head_to_head(path)
    shifted = []

    def change(records: list[dict]) -> None:
        for r in records:
            if r["policy"] == "old" and r["stage"] == "solver" and r["worker"] == 0:
                r["response_logprobs"][0] += 0.5
                shifted.append((r["problem_id"], r["rollout_id"], r["stage"], r["turn"]))

    synthetic.edit(path, change)
    code, first = audit(path, tiny)
    assert code == 0, first  # the first policy's records, the other's left out and said so
    assert first["overall"]["records"] > 0
    assert any("another policy (old)" in reasons for reasons in first["skipped_records"].values()), first
    code, old = audit(path, tiny, "--policy", "old")
    assert code == 10 and names(old) == set(shifted)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    code, _ = audit(copy, tiny, "--policy", "new")
    assert code == 0
