"""An LLM judge's cost (docs/rewards.md, "Measured"): the run's rate with `--reward math` and with `--reward judge`
against a judge server of the same capacity as the policy's, and `agentroll rescore --reward judge` of the same
folder (the judge alone).

    python bench/judge.py --problems 32 --latency 0.05 --decode-latency 0.002 --max-running 32 --rounds 2
    python bench/judge.py --same-server      # the policy's server is its own judge: one capacity for both

The policy and the judge are two `agentroll serve-sim` processes of equal capacity (the same --max-running,
--latency and --decode-latency); the simulated judge answers a verdict of a line or two (tens of tokens), so a
judge request costs about the latency plus its prefill, as a short-answer judge does on a real server. Runs
alternate (math, judge), each `agentroll` in its own process; its CPU seconds and the machine's load are recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import TOKENIZER, start_sim, stop, write_problems
from distill import run


def judge_figures(folder: Path) -> dict[str, float]:
    stats = json.loads((folder / "manifest.json").read_text())["last_run"]["stats"]
    return {k: stats[k] for k in ("judge_requests", "judge_retried", "judge_prompt_tokens", "judge_completion_tokens")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--decode-latency", type=float, default=0.002)
    parser.add_argument("--max-running", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--same-server", action="store_true", help="the policy's server judges too")
    o = parser.parse_args()
    flags = ["--decode-latency", str(o.decode_latency), "--max-running", str(o.max_running)]
    work = Path(tempfile.mkdtemp(prefix="agentroll-judge-bench-"))
    problems = write_problems(work / "p.jsonl", o.problems)
    policy, policy_url = start_sim(o.latency, 150, [*flags, "--answers", str(problems)])
    judge, judge_url = (
        (None, policy_url)
        if o.same_server
        else start_sim(o.latency, 150, [*flags, "--answers", str(problems), "--seed", "5"])
    )
    common = ["--base-url", policy_url, "--tokenizer", str(TOKENIZER), "--quiet", "--seed", "1"]
    common += ["--samples-per-prompt", str(o.samples), "--max-context-len", "8000"]
    judging = ["--judge-url", judge_url, "--judge-model", "agentroll-sim", "--judge-prompt", "correctness"]
    results: dict[str, list[tuple[float, float, float]]] = {"math": [], "judge": [], "rescore": []}
    records = 0
    figures: dict[str, float] = {}
    try:
        for r in range(o.rounds):
            for name in ["math", "judge"] if r % 2 == 0 else ["judge", "math"]:
                out = work / f"{name}-{r}"
                reward = ["--reward", "math"] if name == "math" else ["--reward", "judge", *judging]
                results[name].append(run(["generate", str(problems), "-o", str(out), *common, *reward]))
                if name == "judge":
                    figures = judge_figures(out)
            rescored = work / f"rescore-{r}"
            results["rescore"].append(
                run(["rescore", str(work / f"math-{r}"), "-o", str(rescored), "--reward", "judge", *judging, "-q"])
            )
            records = sum(
                1 for shard in rescored.glob("rollouts-*.jsonl") for line in shard.read_bytes().split(b"\n") if line
            )
    finally:
        stop(policy)
        if judge is not None:
            stop(judge)
    print(
        f"{o.problems} problems x {o.samples}, {records} records; policy and judge"
        f"{' (one server)' if o.same_server else ''}: serve-sim --latency {o.latency} --decode-latency "
        f"{o.decode_latency} --max-running {o.max_running}; judge per run: {figures}"
    )
    for name, runs in results.items():
        walls = [w for w, _, _ in runs]
        wall = statistics.median(walls)
        cpu = statistics.median(c for _, c, _ in runs)
        loads = ", ".join(f"{load:.2f}" for _, _, load in runs)
        print(
            f"{name:8s} wall median {wall:.2f}s (runs {', '.join(f'{w:.2f}' for w in walls)}), "
            f"{records / wall:.1f} records/s, CPU {cpu:.2f}s; load before: {loads}",
            file=sys.stdout,
        )


if __name__ == "__main__":
    main()
