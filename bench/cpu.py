"""CPU per request of `agentroll generate`, for one or more checkouts side by side, alternating.

    python bench/cpu.py /work/base-9c3bb80 .                  # two checkouts, 3 rounds each
    python bench/cpu.py A B --rounds 5 --problems 800 --latency 0.1
    python bench/cpu.py . -- --reward exact                    # after --: more flags for agentroll generate

Each run is one checkout's `agentroll generate` (its own package, imported from its folder) over the same problems
(`--problems`, N = `--samples-per-prompt`, `--concurrency 64` fixed, the default math reward and three-stage
system) against a fresh `agentroll serve-sim` of this checkout (the same double for every checkout) answering
after `--latency`. A round runs every checkout once, the order turning each round, so the machine's other load
falls on all of them alike.

Per run: user and system CPU seconds of the generate process and its children over the whole run (their
rusage, start-up included) and over the steady window (from /proc, between 20 % and 90 % of the run's calls),
each divided by the calls the server delivered; the simulator's CPU per request over the same window; the
steady rate (requests/s, wall clock: compare only within one invocation). One JSON line per run, then one per
checkout with the medians. On a shared machine CPU per request is the steadier measure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, TOKENIZER, metrics, spawn, start_sim, stop, wait_for, write_problems

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants now (the math reward worker is a child of generate)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def cpu(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds of `pid`'s process tree, and its minor page faults, as /proc says now."""
    user = system = 0.0
    faults = 0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        faults += int(fields[7])
        user += int(fields[11]) / TICK
        system += int(fields[12]) / TICK
    return user, system, faults


def delivered(url: str) -> float:
    return metrics(url).get("vllm:request_success_total", 0.0)


def command(source: Path, problems: Path, url: str, out: Path, args: argparse.Namespace, extra: list[str]) -> list[str]:
    return [
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
        "--concurrency",
        str(args.concurrency),
        "--samples-per-prompt",
        str(args.samples_per_prompt),
        "--quiet",
        *extra,
    ]


def run(source: Path, problems: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    sim, url = start_sim(args.latency, 150, ["--max-running", "256"])
    out = Path(tempfile.mkdtemp()) / "out"
    try:
        base = delivered(url)
        sim0 = cpu(sim.pid)[:2]
        started = time.monotonic()
        gen = spawn(command(source, problems, url, out, args, extra), cwd=str(source))
        samples = []  # (seconds, calls, generate user, sys and faults, simulator user + sys)
        while True:
            point = (time.monotonic() - started, delivered(url) - base, *cpu(gen.pid), sum(cpu(sim.pid)[:2]))
            pid, status, usage = os.wait4(gen.pid, os.WNOHANG)  # reaped here, for its rusage (its children's too)
            if pid:
                gen.returncode = os.waitstatus_to_exitcode(status)
                break
            samples.append(point)
            time.sleep(0.25)
        wall = time.monotonic() - started
        calls = delivered(url) - base
        sim1 = cpu(sim.pid)[:2]
    finally:
        stop(sim)
    whole = (usage.ru_utime, usage.ru_stime)
    steady = [s for s in samples if 0.2 * calls <= s[1] <= 0.9 * calls]
    first, last = steady[0], steady[-1]
    up = next(s for s in samples if s[1] > 0)  # the first sample with a call delivered: start-up is over
    n = last[1] - first[1]
    return {
        "source": str(source),
        "exit": gen.returncode,
        "calls": int(calls),
        "wall_s": round(wall, 2),
        "user_ms_per_request": round(1000 * whole[0] / calls, 3),
        "sys_ms_per_request": round(1000 * whole[1] / calls, 3),
        "cpu_ms_per_request": round(1000 * (whole[0] + whole[1]) / calls, 3),
        "steady_requests_per_s": round(n / (last[0] - first[0]), 1),
        "steady_user_ms_per_request": round(1000 * (last[2] - first[2]) / n, 3),
        "steady_sys_ms_per_request": round(1000 * (last[3] - first[3]) / n, 3),
        "steady_faults_per_request": round((last[4] - first[4]) / n, 2),
        "faults_per_request": round(usage.ru_minflt / calls, 2),
        "sim_cpu_ms_per_request": round(1000 * (last[5] - first[5]) / n, 3),
        "sim_cpu_ms_per_request_whole": round(1000 * (sum(sim1) - sum(sim0)) / calls, 3),
        "startup_cpu_s": round(up[2] + up[3], 2),
        "load_average": round(os.getloadavg()[0], 2),
    }


def instructions(source: Path, problems: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    """The generate process's instructions per request (user space: the kernel's work is not counted) under
    `valgrind --tool=callgrind`: over `--callgrind` calls of its steady state (instrumented from `--warm` calls on
    by callgrind_control, then killed), or with `--callgrind 0` over the whole run, start-up included. Counted,
    not timed: the machine's other load does not move it. The dump stays for callgrind_annotate."""
    sim, url = start_sim(args.latency, 150, ["--max-running", "256"])
    folder = Path(tempfile.mkdtemp())
    dump = folder / "callgrind.out"
    whole = args.callgrind == 0
    valgrind = [
        "valgrind",
        "--tool=callgrind",
        f"--instr-atstart={'yes' if whole else 'no'}",
        f"--callgrind-out-file={dump}",
    ]
    base = delivered(url)
    gen = spawn([*valgrind, *command(source, problems, url, folder / "out", args, extra)], cwd=str(source))

    def control(*flags: str) -> None:
        subprocess.run(["callgrind_control", *flags, str(gen.pid)], check=True, capture_output=True)

    try:
        if whole:
            gen.wait()
            calls, dumped = delivered(url) - base, dump
        else:
            assert wait_for(lambda: delivered(url) - base >= args.warm, 1800), "no warm-up"
            control("-i", "on")
            first = delivered(url)
            assert wait_for(lambda: delivered(url) - first >= args.callgrind or gen.poll() is not None, 3600)
            control("-i", "off")
            calls = delivered(url) - first
            control("-d")
            dumped = Path(f"{dump}.1")
        assert wait_for(lambda: dumped.exists() and b"totals:" in dumped.read_bytes(), 600), "no dump"
    finally:
        stop(gen, grace_s=0)
        stop(sim)
    totals = next(line for line in dumped.read_text().splitlines() if line.startswith("totals:"))
    return {
        "source": str(source),
        "calls": int(calls),
        "instructions_per_request": int(int(totals.split()[1]) / calls),
        "whole_run": whole,
        "dump": str(dumped),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", type=Path, default=[ROOT], help="folders holding agentroll/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--problems", type=int, default=800)
    parser.add_argument("--samples-per-prompt", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument(
        "--callgrind", type=int, metavar="CALLS", help="count instructions over CALLS calls instead (0: the whole run)"
    )
    parser.add_argument("--warm", type=int, default=400, help="with --callgrind: calls before counting starts")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    checkouts = [c.resolve() for c in args.checkouts]
    problems = write_problems(Path(tempfile.mkdtemp()) / "p.jsonl", args.problems)
    results: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for round_ in range(args.rounds):
        turn = round_ % len(checkouts)
        for source in checkouts[turn:] + checkouts[:turn]:
            result = (run if args.callgrind is None else instructions)(source, problems, args, extra)
            results[source].append(result)
            print(json.dumps({"round": round_ + 1, **result}), flush=True)
    for source, rows in results.items():
        summary = {"source": str(source), "runs": len(rows)}
        for key in rows[0]:
            if key.endswith(("_per_request", "_per_s", "_whole")) and isinstance(rows[0][key], (int, float)):
                summary[f"median_{key}"] = round(statistics.median(r[key] for r in rows), 3)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
