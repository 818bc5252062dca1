"""httpx versus aiohttp as the completion transport: client CPU per request at a fixed concurrency.

python bench/transport.py --concurrency 64 --latency 0.1 --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import resource
import time

import orjson
from common import start_sim, stop

BODY = orjson.dumps(
    {
        "model": "agentroll-sim",
        "prompt": list(range(5, 300)),
        "max_tokens": 600,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
)


async def with_httpx(url: str, concurrency: int, total: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with slots:
                response = await client.post(
                    f"{url}/v1/completions", content=BODY, headers={"content-type": "application/json"}
                )
                orjson.loads(response.content)

        await asyncio.gather(*(one() for _ in range(total)))


async def with_aiohttp(url: str, concurrency: int, total: int) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        slots = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with (
                slots,
                session.post(
                    f"{url}/v1/completions", data=BODY, headers={"content-type": "application/json"}
                ) as response,
            ):
                orjson.loads(await response.read())

        await asyncio.gather(*(one() for _ in range(total)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    sim, url = start_sim(args.latency, 150)
    try:
        for name, run in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
            if importlib.util.find_spec(name) is None:
                print(json.dumps({"transport": name, "skipped": "not installed"}))
                continue
            before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            asyncio.run(run(url, args.concurrency, args.requests))
            after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
            cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            print(
                json.dumps(
                    {
                        "transport": name,
                        "concurrency": args.concurrency,
                        "latency_s": args.latency,
                        "requests_per_s": round(args.requests / wall, 1),
                        "ideal_per_s": args.concurrency / args.latency if args.latency else None,
                        "cpu_ms_per_request": round(1000 * cpu / args.requests, 3),
                    }
                )
            )
    finally:
        stop(sim)


if __name__ == "__main__":
    main()
