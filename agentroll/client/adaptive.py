"""`--concurrency auto`: each endpoint's requests in flight follow what its vLLM says about its own queue.

Once a second per endpoint we read `/metrics` (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, `vllm:num_preemptions_total`) and move that endpoint's limit:

- **grow** while the server has room (nothing waiting, no new preemption, KV cache under 90 %) and we use the
  limit we have: doubling until the first sign of congestion (slow start), then by an eighth;
- **back off** when requests queue (more waiting than a tenth of the limit) or preemptions rise: to what the
  server is running, and at most 90 % of the limit, so a server shared with other clients is not crowded;
- stay within [`minimum`, `maximum`] (`--max-concurrency`).

Alone on a server of capacity C this settles between C and 1.125 C: the batch stays full and the queue short.
An endpoint without `/metrics` (or with unreadable ones) keeps a fixed `fallback`, with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .transport import TransportFailure

if TYPE_CHECKING:
    from .core import CompletionClient
    from .endpoints import Endpoint

log = logging.getLogger("agentroll")

GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_preemptions_total": "preemptions",
}


@dataclass(slots=True)
class Load:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemptions: float = 0.0


def parse_metrics(text: str) -> Load | None:
    """The four series over their label sets (several engines, models): counts summed, KV-cache usage the
    highest; None when `running` and `waiting` are both absent (not a vLLM, or not its metrics)."""
    load, seen = Load(), set()
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        field = GAUGES.get(line.split("{", 1)[0].split(" ", 1)[0])
        if field is None:
            continue
        try:
            value = float(line.rsplit("}", 1)[-1].split()[0])  # `name{labels} value` (vLLM sends no timestamps)
        except (ValueError, IndexError):
            continue
        if math.isfinite(value):  # counts add up over engines; a usage share is the fullest engine's
            combined = max if field == "kv_usage" else float.__add__
            setattr(load, field, combined(getattr(load, field), value))
            seen.add(field)
    return load if {"running", "waiting"} & seen else None


@dataclass(slots=True)
class Controller:
    """One endpoint's limit. `update(load, in_flight)` after each read gives the new limit."""

    limit: int
    minimum: int = 4
    maximum: int = 1024
    slow_start: bool = True
    _preemptions: float | None = None

    def update(self, load: Load, in_flight: int) -> int:
        preempted = self._preemptions is not None and load.preemptions > self._preemptions
        self._preemptions = load.preemptions
        if preempted or load.waiting > max(1.0, 0.1 * self.limit):
            self.slow_start = False
            self.limit = max(self.minimum, min(int(0.9 * self.limit), int(load.running) or self.limit))
        elif load.waiting == 0 and load.kv_usage < 0.9 and in_flight >= 0.9 * self.limit:
            step = self.limit if self.slow_start else max(1, self.limit // 8)
            self.limit = min(self.maximum, self.limit + step)
        return self.limit


async def follow_metrics(client: CompletionClient, interval_s: float = 1.0) -> None:
    """--concurrency auto: each endpoint starts at `start` and follows its /metrics ; one
    without readable metrics keeps `fallback`, with a warning."""
    c = client.settings.concurrency
    for endpoint in client.endpoints:
        try:
            status, body = await client.side_request("GET", f"{endpoint.url}/metrics")
        except TransportFailure:
            status, body = 0, b""
        if status != 200 or parse_metrics(body.decode("utf-8", "replace")) is None:
            endpoint.limit = min(c.fallback, c.per_endpoint)
            log.warning(
                "%s has no readable vLLM /metrics (HTTP %s): its concurrency stays at %d",
                endpoint.url,
                status or "none",
                endpoint.limit,
            )
        else:
            controller = Controller(
                min(c.start, c.per_endpoint), minimum=min(4, c.per_endpoint), maximum=c.per_endpoint
            )
            endpoint.limit = controller.limit
            client.spawn(_follow(client, endpoint, controller, interval_s, parse_metrics))
        client.counters.concurrency[endpoint.url] = int(endpoint.limit)


async def _follow(
    client: CompletionClient, endpoint: Endpoint, controller: Controller, interval_s: float, parse: Any
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        if endpoint.down:
            continue
        try:
            status, body = await client.side_request("GET", f"{endpoint.url}/metrics")
        except TransportFailure:
            continue
        load = parse(body.decode("utf-8", "replace")) if status == 200 else None
        if load is None:
            continue
        endpoint.limit = controller.update(load, endpoint.in_flight)
        client.counters.concurrency[endpoint.url] = int(endpoint.limit)
        client.budget.dispatch()
