"""Work that flows, with the default settings: the commit share over time, the cost of a stop, and the rate under
transient faults (docs/performance.md, "At scale, in short" and "The call journal").

    python bench/flow.py commits --problems 315 --latency 0.5
    python bench/flow.py stop --problems 315 --latency 0.5
    python bench/flow.py faults --problems 800
    python bench/flow.py commits --source /path/to/another/checkout   # the same, with another tree's agentroll
    python bench/flow.py commits --concurrency 64                     # other flags go to agentroll generate

Each run is `agentroll generate` with its defaults (--concurrency auto, the math reward) in its own process,
against `agentroll serve-sim` in another. `--source` runs the generate of another checkout (its own package,
imported from its folder), so two versions are compared side by side on one machine; run them alternating.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, TOKENIZER, metrics, spawn, start_sim, stop, wait_for, write_problems


def generate(source: Path, problems: Path, out: Path, url: str, *extra: str):
    return spawn(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            url,
            "--tokenizer",
            str(TOKENIZER),
            "--quiet",
            *extra,
        ],
        cwd=str(source),
    )


def delivered(url: str) -> float:
    return metrics(url).get("vllm:request_success_total", 0.0)


def records_on_disk(out: Path) -> int:
    """Records in whole groups on disk: a group is appended in one write, so whole lines are whole groups' (plain
    JSONL shards, finished or partial)."""
    total = 0
    for shard in out.glob("rollouts-*.jsonl*"):
        if shard.name.endswith((".jsonl", ".jsonl.partial")):
            with contextlib.suppress(FileNotFoundError):  # renamed under us
                total += shard.read_bytes().count(b"\n")
    return total


def commits(source: Path, count: int, latency: float, capacity: int, extra: list[str]) -> dict:
    sim, url = start_sim(latency, 150, ["--max-running", str(capacity)])
    tmp = Path(tempfile.mkdtemp())
    problems = write_problems(tmp / "p.jsonl", count)
    started = time.monotonic()
    gen = generate(source, problems, tmp / "out", url, *extra)
    samples = []
    while gen.poll() is None:
        samples.append((time.monotonic() - started, delivered(url), records_on_disk(tmp / "out")))
        time.sleep(0.2)
    calls, records = delivered(url), records_on_disk(tmp / "out")
    stop(sim)
    share = {}
    for point in (0.25, 0.5, 0.75):
        seen = [r for _, c, r in samples if c <= point * calls]
        share[f"records_on_disk_at_{int(point * 100)}pct_calls"] = round((seen[-1] if seen else 0) / records, 3)
    return {
        "bench": "commits",
        "source": str(source),
        "flags": extra,
        "problems": count,
        "latency_s": latency,
        "capacity": capacity,
        "wall_s": round(time.monotonic() - started, 1),
        "calls": int(calls),
        "records": records,
        "exit": gen.returncode,
        **share,
    }


def stop_cost(source: Path, count: int, latency: float, capacity: int, extra: list[str]) -> dict:
    """Calls an uninterrupted run makes, against those of a run stopped (SIGTERM) at half its calls and rerun."""
    sim, url = start_sim(latency, 150, ["--max-running", str(capacity)])
    tmp = Path(tempfile.mkdtemp())
    problems = write_problems(tmp / "p.jsonl", count)
    base = delivered(url)
    whole = generate(source, problems, tmp / "whole", url, *extra)
    whole.wait()
    calls = delivered(url) - base
    base = delivered(url)
    first = generate(source, problems, tmp / "stopped", url, *extra)
    assert wait_for(lambda: delivered(url) - base >= calls / 2, 600), "no progress"
    first.send_signal(signal.SIGTERM)
    first.wait()
    at_stop = records_on_disk(tmp / "stopped")
    rerun = generate(source, problems, tmp / "stopped", url, *extra)
    rerun.wait()
    both = delivered(url) - base
    stop(sim)
    return {
        "bench": "stop",
        "source": str(source),
        "flags": extra,
        "problems": count,
        "latency_s": latency,
        "capacity": capacity,
        "calls_uninterrupted": int(calls),
        "calls_stopped_and_rerun": int(both),
        "cost": round(both / calls, 3),
        "records_on_disk_at_stop": at_stop,
        "exit_codes": [whole.returncode, first.returncode, rerun.returncode],
    }


def faults(source: Path, count: int, latency: float, capacity: int, extra: list[str]) -> dict:
    """Wall time of a clean run and of one against a server failing 5 % of requests with 500/503 and dropping 2 % of
    connections, alternating."""
    walls = {}
    for name, flags in (("clean", []), ("faulty", ["--error-rate", "0.05", "--drop-rate", "0.02"])):
        sim, url = start_sim(latency, 150, ["--max-running", str(capacity), *flags])
        tmp = Path(tempfile.mkdtemp())
        problems = write_problems(tmp / "p.jsonl", count)
        started = time.monotonic()
        gen = generate(source, problems, tmp / "out", url, *extra)
        gen.wait()
        walls[name] = (
            round(time.monotonic() - started, 2),
            gen.returncode,
            json.loads((tmp / "out" / "manifest.json").read_text())["groups"],
        )
        stop(sim)
    return {
        "bench": "faults",
        "source": str(source),
        "flags": extra,
        "problems": count,
        "latency_s": latency,
        "capacity": capacity,
        "clean": walls["clean"],
        "faulty": walls["faulty"],
        "rate_ratio": round(walls["clean"][0] / walls["faulty"][0], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("commits", "stop", "faults"))
    parser.add_argument("--problems", type=int, default=315)
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--capacity", type=int, default=256, help="serve-sim --max-running (vLLM's default)")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose agentroll generate runs")
    args, extra = parser.parse_known_args()  # anything else goes to agentroll generate (e.g. --concurrency 64)
    run = {"commits": commits, "stop": stop_cost, "faults": faults}[args.what]
    print(json.dumps(run(args.source.resolve(), args.problems, args.latency, args.capacity, extra)), flush=True)


if __name__ == "__main__":
    main()
