"""Peak memory against input size, and start-up time to the first request.

    python bench/memory_startup.py
    python bench/memory_startup.py --startup-only --source /path/to/another/checkout   # its agentroll instead
    python bench/memory_startup.py --against /path/to/another/checkout --pairs 20 --limit 20  # side by side

Peak RSS of `agentroll generate --limit 3000` on a 10,000-line and on a 1,000,000-line input (the server answers
at once): memory must not grow with the input. Start-up: from launching the command to the first completion
request the server sees (its `agentroll_sim_first_request_unix` gauge), in wall-clock seconds and in the CPU
seconds the command had used by then (its /proc stat, sampled every 5 ms: on a machine others share, the wall
clock measures their load as much as ours). The last row loads the tokenizer with
`AutoTokenizer` (`--chat-render local`): with torch installed, that imports torch. `--startup-only` skips the
1,000,000-line row (the start-up rows alone, for trees compared side by side); `--source` runs the generate of
another checkout (its own package, imported from its folder), against the simulator of this one; `--limit N`
runs N problems instead of 3000 (start-up rows in seconds rather than minutes on a busy machine). `--against`
runs the start-up row only, alternating this checkout and another `--pairs` times (one fresh simulator per run),
and prints each pair (seconds to the first request, CPU by then, CPU of the whole command) and the medians: on a
shared machine only runs side by side compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import TOKENIZER, metrics, spawn, start_sim, stop, write_problems

ROOT = Path(__file__).resolve().parent.parent  # the checkout this benchmark belongs to


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    problems: Path, url: str, out: Path, limit: int, extra: tuple[str, ...] = (), source: Path | None = None
) -> tuple[float, float, float | None, float]:
    """(peak RSS in MB, seconds from launch to the first request the server saw, CPU seconds used by then, CPU
    seconds of the whole command: user + system, from its rusage)."""
    launched = time.time()
    proc = spawn(
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
            "--limit",
            str(limit),
            "--reward",
            "exact",
            "--quiet",
            "--overwrite",
            *extra,
        ],
        cwd=str(source or ROOT),  # `-m agentroll` imports the package of its working folder, not the installed one
    )
    samples: list[tuple[float, float]] = []  # (unix time, CPU seconds), until the process is gone

    def sample() -> None:
        while (used := cpu_seconds(proc.pid)) is not None and proc.returncode is None:
            samples.append((time.time(), used))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: `stop` must not signal that pid again
    sampler.join()
    first = metrics(url)["agentroll_sim_first_request_unix"]
    before = [used for at, used in samples if at <= first]
    return usage.ru_maxrss / 1024, first - launched, before[-1] if before else None, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup-only", action="store_true", help="skip the 1,000,000-line memory row")
    parser.add_argument("--source", type=Path, help="the checkout whose agentroll generate runs")
    parser.add_argument(
        "--limit",
        type=int,
        default=3000,
        help="problems per run (fewer: quicker start-up rows; RSS is then not the row's)",
    )
    parser.add_argument("--against", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--pairs", type=int, default=10, help="with --against: runs of each checkout")
    args = parser.parse_args()
    if args.against:
        return side_by_side(args.against.resolve(), args.pairs, args.limit)
    source = args.source.resolve() if args.source else None
    tmp = Path(tempfile.mkdtemp())
    results: dict[str, object] = {"source": str(source or ROOT)}
    rows = ((10_000, ()), (1_000_000, ()), (10_000, ("--chat-render", "local")))
    for lines, extra in rows[::2] if args.startup_only else rows:
        problems = write_problems(tmp / f"p{lines}.jsonl", lines)
        sim, url = start_sim(0.0, 150)
        try:
            rss, startup, cpu, _ = run(problems, url, tmp / f"out{lines}", args.limit, extra, source)
        finally:
            stop(sim)
        name = f"input_{lines}_lines" + ("_transformers" if extra else "")
        results[name] = {
            "peak_rss_mb": round(rss, 1),
            "startup_s": round(startup, 2),
            "startup_cpu_s": None if cpu is None else round(cpu, 2),
        }
    print(json.dumps(results))


def side_by_side(other: Path, pairs: int, limit: int) -> None:
    """Start-up of this checkout and `other`, alternating; one JSON line per pair, then the medians."""
    tmp = Path(tempfile.mkdtemp())
    problems = write_problems(tmp / "p.jsonl", 10_000)
    trees = {"this": ROOT, "other": other}
    seen: dict[str, list[tuple[float, float | None, float]]] = {name: [] for name in trees}
    for pair in range(pairs):
        for name, tree in trees.items():
            sim, url = start_sim(0.0, 150)
            try:
                _, startup, cpu, total = run(problems, url, tmp / f"out-{name}", limit, (), tree)
            finally:
                stop(sim)
            seen[name].append((startup, cpu, total))
        print(json.dumps({"pair": pair, **{n: [round(v, 2) if v else v for v in seen[n][-1]] for n in trees}}))
    summary = {
        name: {
            "source": str(tree),
            "startup_s_median": round(statistics.median(s for s, _, _ in seen[name]), 3),
            "startup_s_range": [round(min(s for s, _, _ in seen[name]), 2), round(max(s for s, _, _ in seen[name]), 2)],
            "startup_cpu_s_median": round(statistics.median(c for _, c, _ in seen[name] if c is not None), 3),
            "command_cpu_s_median": round(statistics.median(t for _, _, t in seen[name]), 3),
            "command_cpu_s_range": [round(min(t for *_, t in seen[name]), 2), round(max(t for *_, t in seen[name]), 2)],
        }
        for name, tree in trees.items()
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
