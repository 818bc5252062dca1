"""Curation under `generate --ray` end to end: a job mixing two inputs by weight, stopped at the job's
`--target-groups N` (not N per partition), on a local Ray cluster the job starts itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import pytest

from ..conftest import TOKENIZER, read_records, write_problems
from .conftest import ray_env


def test_a_mixed_job_stops_at_the_jobs_target_over_its_partitions(sim, problems, tmp_path):
    pytest.importorskip("ray", reason="the Ray tier needs ray: pip install '.[test]' (or 'agentroll[ray]')")
    more = write_problems(tmp_path / "more.jsonl", 8)
    more.write_text(more.read_text().replace('"p0', '"q0'))  # other ids, the same problems the simulator knows
    temp = tempfile.mkdtemp(prefix="ar-ray-")  # the local cluster's files (short: Ray's socket paths)
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                "--mix",
                f"{problems}=0.5",
                "--mix",
                f"more:{more}=0.5",
                "-o",
                str(out),
                "--base-url",
                sim.url,
                "--tokenizer",
                TOKENIZER,
                "--system",
                "single",
                "--reward",
                "exact",
                "--target-groups",
                "3",
                "--ray",
                "local",
                "--partitions",
                "2",
            ],
            env={**ray_env(), "RAY_TMPDIR": temp},
            capture_output=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    merged = json.loads((out / "manifest.json").read_text())
    assert merged["complete"] and merged["groups"] == 3  # 2 + 1, not 3 per partition
    parts = [json.loads((out / f"part-{i}" / "manifest.json").read_text())["groups"] for i in range(2)]
    assert parts == [2, 1]
    assert {r["metadata"]["source"] for r in read_records(out)} <= {"problems.jsonl", "more"}
