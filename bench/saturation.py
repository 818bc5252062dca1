"""Server saturation and client CPU: delivered requests/s counted at the simulated server, over the ideal.

    python bench/saturation.py --concurrency 64 --latency 0.1
    python bench/saturation.py --concurrency 0 --latency 0      # client CPU per request at zero latency
    python bench/saturation.py --auto --capacity 160 --latency 0.1  # --concurrency auto, capacity not told

The server runs in its own process (`agentroll serve-sim`), agentroll generate in another. After a warm-up,
the server's `vllm:request_success_total` is read twice `--window` seconds apart; the client's CPU time over
the same window comes from /proc.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import TOKENIZER, cpu_seconds, metrics, spawn, start_sim, stop, wait_for, write_problems


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(
    concurrency: int,
    latency: float,
    window: float,
    num_parallel: int,
    words: int,
    reward: str = "math",
    extra: list[str] | None = None,
    capacity: int | None = None,
    auto: bool = False,
    profile: str | None = None,
) -> dict:
    # without --capacity the server runs whatever it is sent (serve-sim's default --max-running is vLLM's 256)
    sim, url = start_sim(latency, words, ["--max-running", str(capacity or max(256, concurrency))])
    tmp = Path(tempfile.mkdtemp())
    problems = write_problems(tmp / "p.jsonl", 200_000)
    gen = spawn(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(tmp / "out"),
            "--base-url",
            url,
            "--tokenizer",
            str(TOKENIZER),
            "--num-parallel",
            str(num_parallel),
            "--concurrency",
            "auto" if auto else str(concurrency),
            "--reward",
            reward,
            "--max-tokens",
            "2048",
            "--quiet",
            *(extra or []),
        ]
    )
    try:
        warm = max(2 * concurrency, 200)
        assert wait_for(lambda: metrics(url)["vllm:request_success_total"] >= warm, 600), "no warm-up"
        m0, c0, s0, t0 = metrics(url), cpu_seconds(gen.pid), cpu_seconds(sim.pid), time.monotonic()
        spy = None
        if profile:  # sampled stacks of the client over the window (py-spy: pip install py-spy)
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(gen.pid),
                    "--duration",
                    str(int(window)),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    profile,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        running, waiting, rss = [], [], []
        while time.monotonic() - t0 < window:  # sample the server's in-flight and waiting gauges, the client's RSS
            time.sleep(0.5)
            sample = metrics(url)
            running.append(sample["vllm:num_requests_running"])
            waiting.append(sample["vllm:num_requests_waiting"])
            rss.append(resident_mb(gen.pid))
        m1, c1, s1, t1 = metrics(url), cpu_seconds(gen.pid), cpu_seconds(sim.pid), time.monotonic()
        if spy is not None:
            spy.wait(timeout=window + 60)
    finally:
        stop(gen)
        stop(sim)
    done = m1["vllm:request_success_total"] - m0["vllm:request_success_total"]
    rate = done / (t1 - t0)
    busy = capacity if auto else min(concurrency, capacity or concurrency)
    ideal = busy / latency if latency else None
    return {
        "concurrency": concurrency,
        "latency_s": latency,
        "window_s": round(t1 - t0, 1),
        "requests": int(done),
        "requests_per_s": round(rate, 1),
        "ideal_per_s": ideal,
        "ratio": round(rate / ideal, 3) if ideal else None,
        "client_cpu_ms_per_request": round(1000 * (c1 - c0) / done, 3) if done else None,
        "client_cpu_share": round((c1 - c0) / (t1 - t0), 3),
        "server_cpu_share": round((s1 - s0) / (t1 - t0), 3),
        "server_in_flight_mean": round(sum(running) / len(running), 1),
        "server_waiting_mean": round(sum(waiting) / len(waiting), 1),
        "client_rss_mb": round(sum(rss) / len(rss), 1),  # the generate process over the window (memory per call
        # in flight: the difference between two concurrencies over the difference in calls in flight)
        "capacity": capacity,
        "auto": auto,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--num-parallel", type=int, default=4)
    parser.add_argument("--reasoning-words", type=int, default=150, help="~2 tokens a word: a few hundred tokens")
    parser.add_argument("--reward", default="math", help="agentroll's default (math), as users run it; or exact")
    parser.add_argument("--ordered", action="store_true", help="generate --ordered (groups in input order)")
    parser.add_argument("--capacity", type=int, help="the server decodes at most this many at once (--max-running)")
    parser.add_argument("--auto", action="store_true", help="generate --concurrency auto (ideal: the capacity)")
    parser.add_argument("--profile", metavar="FILE", help="py-spy's collapsed stacks of the client over the window")
    args = parser.parse_args()
    if args.auto and not args.capacity:
        parser.error("--auto needs --capacity")
    result = measure(
        args.concurrency,
        args.latency,
        args.window,
        args.num_parallel,
        args.reasoning_words,
        args.reward,
        ["--ordered"] if args.ordered else [],
        args.capacity,
        args.auto,
        args.profile,
    )
    print(json.dumps({"reward": args.reward, "ordered": args.ordered, **result}))


if __name__ == "__main__":
    main()
