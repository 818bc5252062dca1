"""A teacher's cost (docs/distill.md, "Measured"): the run's rate with and without `--teacher`, the teacher's own
scoring rate (`agentroll distill` over the same folder), and the bytes a teacher adds per response token.

    python bench/distill.py --problems 64 --latency 0.05 --decode-latency 0.002 --max-running 32 --rounds 3
    python bench/distill.py --decode-latency 0          # every call costs the same: the teacher's worst case
    python bench/distill.py --same-server               # the student's server is its own teacher: one capacity

The student and the teacher are two `agentroll serve-sim` processes of equal capacity (the same --max-running,
--latency and --decode-latency): a generation pays the latency plus the decode latency per token it generates, a
scoring call (one generated token, the rest prefill) the latency and one token, as on a real server where
decoding costs per token and a prefill little. Runs alternate (without, with, distill), each `agentroll
generate` / `distill` in its own process; the CPU seconds of that process and the machine's load are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import TOKENIZER, spawn, start_sim, stop, write_problems


def run(args: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the process, 1-minute load before it) of one `agentroll ...` run."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = spawn([sys.executable, "-m", "agentroll", *args], stderr=subprocess.PIPE)
    _, err = proc.communicate()
    wall = time.monotonic() - started
    if proc.returncode:
        raise SystemExit(f"agentroll {args[0]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), load


def shard_facts(folder: Path) -> tuple[int, int, int]:
    """(records, response tokens, bytes of the shards)."""
    records = tokens = size = 0
    for shard in folder.glob("rollouts-*.jsonl"):
        size += shard.stat().st_size
        for line in shard.read_bytes().split(b"\n"):
            if line:
                records += 1
                tokens += len(json.loads(line)["response_token_ids"])
    return records, tokens, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--decode-latency", type=float, default=0.002)
    parser.add_argument("--max-running", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--same-server", action="store_true", help="the student's server scores as the teacher")
    parser.add_argument("--no-sizes", action="store_true", help="skip the runs with --teacher-logprobs 5 and 20")
    o = parser.parse_args()
    flags = [
        "--decode-latency",
        str(o.decode_latency),
        "--max-running",
        str(o.max_running),
    ]
    work = Path(tempfile.mkdtemp(prefix="agentroll-distill-bench-"))
    problems = write_problems(work / "p.jsonl", o.problems)
    student, student_url = start_sim(o.latency, 150, [*flags, "--answers", str(problems)])
    teacher, teacher_url = (
        (None, student_url)
        if o.same_server
        else start_sim(o.latency, 150, [*flags, "--answers", str(problems), "--model", "teacher", "--seed", "5"])
    )
    common = ["--base-url", student_url, "--tokenizer", str(TOKENIZER), "--quiet", "--seed", "1"]
    common += ["--samples-per-prompt", str(o.samples), "--max-context-len", "8000"]
    results: dict[str, list[tuple[float, float, float]]] = {"without": [], "with": [], "distill": []}
    sizes: dict[str, tuple[int, int, int]] = {}
    try:
        for r in range(o.rounds):
            order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
            for name in order:
                out = work / f"{name}-{r}"
                extra = ["--teacher", teacher_url] if name == "with" else []
                results[name].append(run(["generate", str(problems), "-o", str(out), *common, *extra]))
                sizes[name] = shard_facts(out)
            distilled = work / f"distill-{r}"
            results["distill"].append(
                run(["distill", str(work / f"without-{r}"), "-o", str(distilled), "--teacher", teacher_url, "-q"])
            )
            sizes["distill"] = shard_facts(distilled)
        for k in () if o.no_sizes else (5, 20):
            out = work / f"with-k{k}"
            run(
                [
                    "generate",
                    str(problems),
                    "-o",
                    str(out),
                    *common,
                    "--teacher",
                    teacher_url,
                    "--teacher-logprobs",
                    str(k),
                ]
            )
            sizes[f"k{k}"] = shard_facts(out)
    finally:
        stop(student)
        if teacher is not None:
            stop(teacher)
    records, tokens, plain_bytes = sizes["without"]
    print(
        f"{o.problems} problems x {o.samples}, {records} records, {tokens} response tokens; student and teacher"
        f"{' (one server)' if o.same_server else ''}: serve-sim --latency {o.latency} --decode-latency "
        f"{o.decode_latency} --max-running {o.max_running}"
    )
    for name, runs in results.items():
        walls = [w for w, _, _ in runs]
        cpu = statistics.median(c for _, c, _ in runs)
        loads = ", ".join(f"{load:.2f}" for _, _, load in runs)
        wall = statistics.median(walls)
        print(
            f"{name:8s} wall median {wall:.2f}s (runs {', '.join(f'{w:.2f}' for w in walls)}), "
            f"{records / wall:.1f} records/s, {tokens / wall:.0f} response tokens/s, CPU {cpu:.2f}s; "
            f"load before: {loads}"
        )
    for name in ("with", "distill", *(() if o.no_sizes else ("k5", "k20"))):
        _, _, size = sizes[name]
        print(
            f"bytes per response token added ({name}): {(size - plain_bytes) / tokens:.1f} "
            f"(shards {size} vs {plain_bytes} bytes)"
        )


if __name__ == "__main__":
    main()
