"""Cost of one uncached math check in agentroll, apart from math-verify itself.

    python bench/math_checks.py --checks 20000
    python bench/math_checks.py --real --checks 2000    # real math-verify: a repeated label, parent + worker CPU

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
    return {
        "wall_ms_per_check": round(1000 * wall / checks, 4),
        "parent_cpu_ms_per_check": round(1000 * cpu / checks, 4),
    }


def children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def repeated_label(checks: int, kind: str) -> dict[str, float]:
    """Real math-verify, one label (as a problem's K x N samples share one) and `checks` distinct answers:
    `integer` and `fraction` answers (\\frac{2v}{2}) take the exact-rational fast path; `sqrt` ones
    (\\sqrt{v^2}) need sympy in the worker, the label parsed once there. CPU of the parent and of the worker
    (reaped at close, so counted in RUSAGE_CHILDREN; its start-up, about 0.5 s, is taken out) per check."""
    from agentroll.rewards import MathReward, RewardRequest

    reward = MathReward(timeout_s=10)
    started = children_cpu()
    await reward.score([RewardRequest("\\boxed{\\sqrt{4}}", "2", "p", "solver")])  # the worker is up
    await reward.aclose()  # its start-up cost is counted here, apart
    start_up = children_cpu() - started
    reward = MathReward(timeout_s=10)
    await reward.score([RewardRequest("\\boxed{\\sqrt{4}}", "2", "p", "solver")])
    values = range(2, checks + 2)
    forms = {"integer": "{v}", "fraction": "\\frac{{{w}}}{{2}}", "sqrt": "\\sqrt{{{s}}}"}
    content = ["\\boxed{" + forms[kind].format(v=v, w=2 * v, s=v * v) + "}" for v in values]
    requests = [RewardRequest(c, "42", "p", "solver") for c in content]
    children, cpu, wall = children_cpu(), time.process_time(), time.perf_counter()
    await reward.score(requests)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await reward.aclose()
    worker = max(0.0, children_cpu() - children - start_up)
    return {
        "wall_ms_per_check": round(1000 * wall / checks, 4),
        "parent_cpu_ms_per_check": round(1000 * cpu / checks, 4),
        "worker_cpu_ms_per_check": round(1000 * worker / checks, 4),
        "total_cpu_ms_per_check": round(1000 * (cpu + worker) / checks, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checks", type=int, default=20000)
    parser.add_argument("--real", action="store_true", help="real math-verify checks of a repeated label")
    args = parser.parse_args()
    if args.real:
        kinds = ("integer", "fraction", "sqrt")
        print(json.dumps({kind: asyncio.run(repeated_label(args.checks, kind)) for kind in kinds}))
        return
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
