"""The most any client gets from the simulated server on this machine: no pipeline, no aiohttp.

    python bench/ceiling.py --concurrency 64 --latency 0.1 --rounds 100
    python bench/ceiling.py --concurrency 2048 --latency 4 --rounds 10

`--concurrency` keep-alive connections each send `--rounds` completion requests back to back, written as
prebuilt HTTP/1.1 bytes and read on an asyncio protocol (content-length bodies only), each answer parsed with
orjson. The ratio is the ideal time (rounds x latency) over the wall time; what is missing is the simulator's
own time, loopback and the event loops, which agentroll's client cannot beat. Also the CPU this minimal client
spends per request: what a purpose-built transport would cost agentroll instead of aiohttp's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from urllib.parse import urlsplit

import orjson
from common import cpu_seconds, start_sim, stop

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


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[bytes] | None = None
        self.length = -1
        self.head = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.length < 0:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            at = head.index(b"content-length:") + len(b"content-length:")
            self.length, self.head = int(head[at:].split(b"\r\n", 1)[0]), end + 4
        if len(self.buffer) >= self.head + self.length:
            body = bytes(self.buffer[self.head : self.head + self.length])
            del self.buffer[: self.head + self.length]
            self.length = -1
            waiter, self.waiter = self.waiter, None
            assert waiter is not None
            waiter.set_result(body)

    async def request(self, data: bytes) -> bytes:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter


async def run(url: str, concurrency: int, rounds: int) -> None:
    parts = urlsplit(url)
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY
    loop = asyncio.get_running_loop()

    async def connection() -> None:
        _, conn = await loop.create_connection(Connection, parts.hostname, parts.port)
        try:
            for _ in range(rounds):
                orjson.loads(await conn.request(request))
        finally:
            assert conn.transport is not None
            conn.transport.close()

    await asyncio.gather(*(connection() for _ in range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    sim, url = start_sim(args.latency, 150, ["--max-running", str(max(256, args.concurrency))])
    try:
        before, server, start = resource.getrusage(resource.RUSAGE_SELF), cpu_seconds(sim.pid), time.monotonic()
        asyncio.run(run(url, args.concurrency, args.rounds))
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
        server = cpu_seconds(sim.pid) - server
    finally:
        stop(sim)
    total = args.concurrency * args.rounds
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(
        json.dumps(
            {
                "concurrency": args.concurrency,
                "latency_s": args.latency,
                "requests": total,
                "requests_per_s": round(total / wall, 1),
                "ratio": round(args.rounds * args.latency / wall, 3) if args.latency else None,
                "client_cpu_ms_per_request": round(1000 * cpu / total, 3),
                "server_cpu_ms_per_request": round(1000 * server / total, 3),
                "server_cpu_share": round(server / wall, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
