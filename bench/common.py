"""Shared helpers for the benchmarks: a simulated server in its own process, problem files, /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "agentroll" / "sim" / "tokenizer"


def start_sim(latency: float, reasoning_words: int = 150,
              extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`agentroll serve-sim` on a free loopback port, in its own process; returns it and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentroll", "serve-sim", "--port", "0", "--latency", str(latency),
         "--reasoning-words", str(reasoning_words), "--max-model-len", "8192", *(extra or [])],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # "... listening on http://127.0.0.1:PORT"
    url = re.search(r"http://\S+", line).group(0)
    return proc, url


def metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
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
