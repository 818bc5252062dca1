"""Cost of one uncached math check in agentroll, apart from math-verify itself.

    python bench/math_checks.py --checks 20000

The worker runs a trivial check in math-verify's place (`AGENTROLL_MATH_CHECK`), so what is timed is the rest:
the round trip to the worker and back, and the parent's CPU. `sequential`: one check at a time (latency);
`burst`: all at once (throughput). `process_pool_baseline` is the same trivial call through a
ProcessPoolExecutor with `run_in_executor`, as the math reward did before its own workers.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def trivial(label: str, answer: str, timeout_s: int) -> bool:
    return label == answer


async def through_math_reward(checks: int, burst: bool) -> tuple[float, float]:
    from agentroll.rewards import MathReward, RewardRequest

    reward = MathReward(timeout_s=10)
    requests = [RewardRequest(f"\\boxed{{{i}}}", str(i), "p", "solver") for i in range(checks + 1)]
    await reward.score(requests[-1:])  # the worker is up
    wall, cpu = time.perf_counter(), time.process_time()
    if burst:
        await reward.score(requests[:checks])
    else:
        for request in requests[:checks]:
            await reward.score([request])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await reward.aclose()
    return wall, cpu


async def through_process_pool(checks: int, burst: bool) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        await loop.run_in_executor(pool, trivial, "0", "0", 1)
        wall, cpu = time.perf_counter(), time.process_time()
        if burst:
            await asyncio.gather(*(loop.run_in_executor(pool, trivial, str(i), str(i), 1) for i in range(checks)))
        else:
            for i in range(checks):
                await loop.run_in_executor(pool, trivial, str(i), str(i), 1)
        return time.perf_counter() - wall, time.process_time() - cpu


def figures(wall: float, cpu: float, checks: int) -> dict[str, float]:
    return {"wall_ms_per_check": round(1000 * wall / checks, 4),
            "parent_cpu_ms_per_check": round(1000 * cpu / checks, 4)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=20000)
    args = parser.parse_args()
    os.environ["AGENTROLL_MATH_CHECK"] = "math_checks:trivial"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(HERE))
    out = {}
    for name, run in (("math_reward", through_math_reward), ("process_pool_baseline", through_process_pool)):
        for mode in ("sequential", "burst"):
            out[f"{name}_{mode}"] = figures(*asyncio.run(run(args.checks, mode == "burst")), args.checks)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
