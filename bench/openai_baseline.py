"""What users write today: a plain `openai.AsyncOpenAI` loop with a semaphore, side by side with agentroll.

    python bench/openai_baseline.py --concurrency 64 --latency 0.1

Both run against the same simulated server (its own process), one after the other in this one run; each is
measured over the same window by the server's `vllm:request_success_total`. The baseline sends one completion
per problem text (no agent stages, no token ids, no records): it is the ceiling of a naive loop, not the same
work. Needs `pip install openai`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

from common import metrics, start_sim, stop
from saturation import measure


def baseline(url: str, concurrency: int, window: float) -> dict:
    from openai import AsyncOpenAI

    stop = threading.Event()

    async def loop() -> None:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        slots = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with slots:
                await client.completions.create(
                    model="agentroll-sim", prompt=f"What is {i} plus 7?", max_tokens=600, logprobs=0
                )

        pending: set[asyncio.Task] = set()
        i = 0
        while not stop.is_set():
            while len(pending) < 2 * concurrency:
                i += 1
                task = asyncio.create_task(one(i))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(0.01)
        for task in pending:
            task.cancel()
        await client.close()

    thread = threading.Thread(target=lambda: asyncio.run(loop()))
    thread.start()
    time.sleep(5)  # warm-up
    m0, t0 = metrics(url), time.monotonic()
    time.sleep(window)
    m1, t1 = metrics(url), time.monotonic()
    stop.set()
    thread.join()
    rate = (m1["vllm:request_success_total"] - m0["vllm:request_success_total"]) / (t1 - t0)
    return {"requests_per_s": round(rate, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--window", type=float, default=15.0)
    args = parser.parse_args()
    ours = measure(args.concurrency, args.latency, args.window, 4, 150)
    sim, url = start_sim(args.latency, 150)
    try:
        theirs = baseline(url, args.concurrency, args.window)
    finally:
        stop(sim)
    print(
        json.dumps(
            {
                "concurrency": args.concurrency,
                "latency_s": args.latency,
                "agentroll_requests_per_s": ours["requests_per_s"],
                "openai_loop_requests_per_s": theirs["requests_per_s"],
                "ratio": round(ours["requests_per_s"] / theirs["requests_per_s"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
