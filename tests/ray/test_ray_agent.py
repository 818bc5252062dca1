"""`--system agent` under `--ray`: each partition runs its own recording proxy and its agents on its node, and
the merged folder holds every problem's whole group, token-exact against what the server sampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import agentroll
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .. import agents_support as support
from ..conftest import TOKENIZER, read_records, write_problems
from ..test_agents import TOOL_CALLING, check_exact, executions
from .conftest import Cluster


def test_an_agent_job_on_ray_writes_every_group_token_exact(ray_cluster: Cluster, tmp_path: Path):
    problems = write_problems(tmp_path / "problems.jsonl", 4)
    agent = tmp_path / "agent.py"
    agent.write_text(support.SDK_PROGRAM)
    server = SimServer(script=Script.from_jsonl(problems, TOOL_CALLING))
    server.start()
    out = tmp_path / "out"
    try:
        command = ["generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER]
        command += ["--system", "agent", "--system-option", f"command={sys.executable} {agent}"]
        command += ["--samples-per-prompt", "2", "--seed", "2", "--max-tokens", "256"]
        command += ["--ray", ray_cluster.address, "--partitions", "2"]
        done = subprocess.run(
            [sys.executable, "-m", "agentroll", *command], env=ray_cluster.env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
        records = [r for k in range(2) for r in read_records(out / f"part-{k}")]  # the merged folder's shards
        assert [dict(r) for r in agentroll.read_records(out)] == records
        assert check_exact(records, server) == 8  # 4 problems x 2 executions, each a tool turn continued
    finally:
        server.stop()
    assert sorted({r["problem_id"] for r in records}) == [f"p{i:03d}" for i in range(4)]
    assert all(len(calls) == 2 for calls in executions(records))
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["report"]["calls_per_execution"] == 2.0 and stats["continued"] == 8
