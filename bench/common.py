"""Shared helpers for the benchmarks: a simulated server in its own process, problem files, /metrics."""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agentroll.process import children

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "agentroll" / "sim" / "tokenizer"
STARTED: list[subprocess.Popen] = []


def spawn(args: list[str], **kwargs) -> subprocess.Popen:
    """A child that cannot outlive the benchmark (see agentroll.process.children); stopped at exit in any case."""
    proc = children.spawn(args, **kwargs)
    STARTED.append(proc)
    return proc


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    children.stop_group(proc, grace_s)


@atexit.register
def _stop_all() -> None:
    for proc in STARTED:
        stop(proc, grace_s=5.0)


def start_sim(
    latency: float, reasoning_words: int = 150, extra: list[str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`agentroll serve-sim` on a free loopback port, in its own process; returns it and its URL."""
    proc = spawn(
        [
            sys.executable,
            "-m",
            "agentroll",
            "serve-sim",
            "--port",
            "0",
            "--latency",
            str(latency),
            "--reasoning-words",
            str(reasoning_words),
            "--max-model-len",
            "8192",
            *(extra or []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()  # "... listening on http://127.0.0.1:PORT"
    url = re.search(r"http://\S+", line).group(0)
    return proc, url


def metrics(url: str) -> dict[str, float]:
    """Each series summed over its labels (`vllm:request_success_total` has one per finish reason)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = name.split("{")[0]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def write_problems(path: Path, count: int) -> Path:
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"id": f"b{i}", "prompt": f"What is {i} plus {i + 7}?", "label": str(2 * i + 7)}) + "\n")
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(predicate, timeout: float, step: float = 0.2) -> bool:
    """Poll a condition (benchmarks only; tests synchronise on events)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False
