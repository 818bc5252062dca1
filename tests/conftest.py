"""Shared fixtures: a simulated vLLM server on a free loopback port, a prompt file, and a CLI runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentroll.process.resources import sim_tokenizer_dir
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

TOKENIZER = str(sim_tokenizer_dir())
NO_BWRAP = (
    "bubblewrap (bwrap) is not installed, so model code has no local sandbox here: apt-get install bubblewrap "
    "(CI installs it, and there these tests run or fail, never skip)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that run model code in the local sandbox skip where bubblewrap is missing, saying so; with CI=true
    they run (and fail): CI installs it (.ci/run), so a skip there would hide a sandbox never tried."""
    if shutil.which("bwrap") or os.environ.get("CI"):
        return
    for item in items:
        if item.get_closest_marker("bwrap") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_BWRAP))


def write_problems(path: Path, count: int) -> Path:
    """`count` arithmetic problems with integer labels (so the simulated model can write equal fractions)."""
    with path.open("w") as f:
        for i in range(count):
            a, b = 10 + i, 7 + 3 * i
            f.write(
                json.dumps(
                    {"id": f"p{i:03d}", "prompt": f"What is {a} plus {b}?", "label": str(a + b), "topic": "addition"}
                )
                + "\n"
            )
    return path


@pytest.fixture
def problems(tmp_path: Path) -> Path:
    return write_problems(tmp_path / "problems.jsonl", 8)


@pytest.fixture
def sim(problems: Path) -> Iterator[SimServer]:
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    yield server
    server.stop()


def user_env() -> dict[str, str]:
    """The environment a user's shell gives a command: no AGENTROLL_/OPENAI_ variables, the hub offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    env["HF_HUB_OFFLINE"] = "1"  # a test never reaches for the hub
    return env


def run_process(
    *args: str, stdin: bytes | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`agentroll ...` in a real subprocess, as a user runs it: where the process is the point (fds, signals).
    `env`: variables set besides the user's."""
    return subprocess.run(
        [sys.executable, "-m", "agentroll", *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env={**user_env(), **(env or {})},
    )


def cli_at_exit(report: str, *args: str) -> tuple[int, str]:
    """`agentroll ...` as its own process (`agentroll.cli.main`, as the installed command starts), and the exit
    code with what `report` (a Python expression giving a tuple, evaluated as the process ends) printed."""
    probe = (
        f"import atexit, gc, sys\natexit.register(lambda: print(*({report}), file=sys.stderr))\n"
        "sys.argv = ['agentroll', *sys.argv[1:]]\nfrom agentroll.cli import main\nmain()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120, env=user_env()
    )
    return done.returncode, done.stderr.strip().splitlines()[-1]


def run_cli(*args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """`agentroll ...` in this process (typer's CliRunner), with the environment a user's shell would give it
    (no AGENTROLL_/OPENAI_ variables, the hub offline); the result as a subprocess's. Input on stdin goes through a
    real process: the reader reads file descriptor 0 itself."""
    if stdin is not None:
        return run_process(*args, stdin=stdin, timeout=timeout)
    import traceback

    from typer.testing import CliRunner

    from agentroll.cli import app

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("AGENTROLL_", "OPENAI_"))}
    env["HF_HUB_OFFLINE"] = "1"
    result = CliRunner().invoke(app, list(args), env=env)
    stderr = result.stderr_bytes or b""
    code = result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception)).encode()  # a crash, as Python prints it
        code = 1
    return subprocess.CompletedProcess(["agentroll", *args], code, result.stdout_bytes, stderr)


def generations(server: SimServer) -> list[dict]:
    """The exchanges a run's executions made: without agentroll's start-up probes, which ask for one token."""

    def asked(request: dict) -> object:
        return request.get("max_tokens", (request.get("sampling_params") or {}).get("max_tokens"))

    return [e for e in server.log if asked(e["request"]) != 1]


def read_records(folder: Path) -> list[dict]:
    records = []
    for shard in sorted(folder.glob("rollouts-*.jsonl")):
        # split on "\n" only: str.splitlines() also breaks at U+2028, U+0085... which a model's text may hold
        records += [json.loads(line) for line in shard.read_bytes().split(b"\n") if line]
    return records


def settings(
    *,
    concurrency: int | None = 64,
    max_retries: int = 5,
    timeout_s: float = 3600.0,
    backoff_base_s: float = 0.5,
    affinity_slack: int = 8,
    probe_interval_s: float = 5.0,
    down_timeout_s: float = 300.0,
):
    """A client's settings for a test (`concurrency` None: auto)."""
    from agentroll.client import ClientSettings, Concurrency, Health, Retries, Timeouts

    return ClientSettings(
        timeouts=Timeouts(request_s=timeout_s),
        concurrency=Concurrency(fixed=concurrency),
        retries=Retries(max_retries=max_retries, backoff_base_s=backoff_base_s),
        health=Health(probe_interval_s=probe_interval_s, down_timeout_s=down_timeout_s),
        affinity_slack=affinity_slack,
    )
