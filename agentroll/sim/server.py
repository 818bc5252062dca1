"""A simulated vLLM server: vLLM 0.32's OpenAI-compatible wire format over real HTTP, with scripted answers.

Field names, `finish_reason` values, error bodies, status codes, metrics and connection handling follow what a
real vLLM 0.32 answers (docs/simulated-server.md, checked against captures of a real server). It runs the model
nobody trains: a `Script` writes the text, the bundled tiny tokenizer turns it into token ids, and logprobs are
seeded noise. Modules: `app` (HTTP), `engine` (completions), `scheduler` (capacity), `metrics`, `validation`,
`wire` (vLLM's vocabulary), `faults`, `script`.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ..process.resources import sim_tokenizer_dir
from .app import handler
from .engine import Engine
from .faults import Faults
from .metrics import Counters
from .scheduler import BLOCK_TOKENS, Scheduler
from .script import Script
from .wire import DEFAULT_MODEL, VLLM_VERSION, HTTPFailure, error_body

__all__ = ["DEFAULT_MODEL", "VLLM_VERSION", "Faults", "HTTPFailure", "SimServer", "error_body"]


@dataclass
class SimServer:
    script: Script = field(default_factory=Script)
    model: str = DEFAULT_MODEL
    max_model_len: int = 4096
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    record: bool = True  # keep every 200 completion exchange in `log` (tests read it; benchmarks turn it off)
    api_key: str | None = None  # like `vllm serve --api-key`: /v1, /v2, /inference then need `Bearer KEY`
    tokenizer_dir: Path = field(default_factory=sim_tokenizer_dir)
    max_running: int = 256  # like --max-num-seqs: requests decoding at once; the rest wait, first come first served
    kv_cache_tokens: int | None = None  # KV-cache size in tokens; None: room for max_running full-length requests
    keepalive_timeout_s: float = 5.0  # idle keep-alive connections close after this, as uvicorn's default
    enable_scale_out: bool = False  # like `vllm serve --enable-scale-out`: POST /inference/v1/generate answers
    logprobs_mode: str = "raw_logprobs"  # like --logprobs-mode: or processed_logprobs (after temperature, top-k)
    moe: tuple[int, int, int] | None = None  # (layers, experts, experts per token): a MoE model's routes...
    return_routed_experts: bool = False  # ...returned per request, like --enable-return-routed-experts
    return_sampling_mask: bool = False  # like --return-sampling-mask: /generate sends each token's kept ids
    weight_version: str = "default"  # the policy version /generate's weight_versions spans name
    scheduling_policy: str = "fcfs"  # like --scheduling-policy: or priority (a request's `priority`, lower first)

    def __post_init__(self) -> None:
        if self.logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode must be raw_logprobs or processed_logprobs, not {self.logprobs_mode!r}")
        self.engine = Engine(
            self.script,
            self.model,
            self.max_model_len,
            Path(self.tokenizer_dir),
            self.faults,
            self.seed,
            self.logprobs_mode,
            self.moe if self.return_routed_experts else None,
            self.weight_version,
            self.return_sampling_mask,
        )
        kv_tokens = self.kv_cache_tokens or self.max_running * self.max_model_len
        if kv_tokens < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({kv_tokens}) must hold one request of max_model_len "
                f"({self.max_model_len}), as vLLM requires at start-up"
            )
        self.scheduler = Scheduler(
            self.max_running, kv_tokens // BLOCK_TOKENS, on_change=self._notify, policy=self.scheduling_policy
        )
        self.rng = random.Random(self.seed + 2)  # fault draws, apart from the answers' randomness
        self.counters = Counters(created=time.time())
        self.log: list[dict[str, Any]] = []
        self.in_flight = 0  # requests inside the completion handler: validating, waiting or running
        self.peak_in_flight = 0
        self.completions = 0  # completions answered 200 with a completion body (aborted ones included)
        self.aborted = 0  # requests whose client disconnected before the answer
        self.malformed_sent = 0
        self.first_request_at: float | None = None
        self.url: str | None = None
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._progress = threading.Condition()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on the running loop; returns the base URL (port 0 picks a free one)."""
        server = web.Server(
            handler(self),
            handler_cancellation=True,
            keepalive_timeout=self.keepalive_timeout_s,
            access_log=None,
            request_factory=self._request_factory,
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=0.5)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, host, port, backlog=4096)
        await self._site.start()
        bound = self._runner.addresses[0]
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

    def _request_factory(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        loop = asyncio.get_running_loop()
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=64 * 2**20)

    def start(self) -> str:
        """Serve from a background thread on a free loopback port; return the base URL once it listens."""
        ready = threading.Event()

        def main() -> None:
            loop = self._loop = asyncio.new_event_loop()
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="sim-vllm", daemon=True)
        self._thread.start()
        ready.wait()
        assert self.url is not None
        return self.url

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop, self._loop = self._loop, None
        asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=10)

    async def aclose(self) -> None:
        """Stop listening and close every open connection at once, as a killed server would."""
        self._closing = True
        # connections just accepted are still being set up (asyncio's accept tasks): let them be made, to be closed
        # below; closing the listener under them would leave their sockets open (asyncio drops a socket whose
        # server closed before its transport was made)
        for _ in range(10):
            accepting = [
                task
                for task in asyncio.all_tasks()
                if task is not asyncio.current_task()
                and getattr(task.get_coro(), "__name__", "") == "_accept_connection2"
            ]
            if not accepting:
                break
            await asyncio.gather(*accepting, return_exceptions=True)
        if self._site is not None:
            await self._site.stop()
        if self._runner is None:
            return
        for _ in range(3):  # connections accepted just before the listener closed show up a loop turn later
            for connection in self._runner.server.connections if self._runner.server else ():
                transport = connection.transport
                connection.force_close()
                if transport is not None:  # a response still being written: dropped, not drained (close() would
                    transport.abort()  # wait for it, and a loop stopped meanwhile leaves the socket open)
            await asyncio.sleep(0)
        await self._runner.cleanup()

    # -- what tests synchronise on -----------------------------------------------------------------------------
    def wait_for_completions(self, count: int, timeout: float = 60.0) -> bool:
        """Block (another thread) until `count` completions have been answered: tests synchronise on this."""
        return self.wait_until(lambda: self.completions >= count, timeout)

    def wait_until(self, condition: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Block until `condition()` holds; re-checked whenever a request arrives, queues, runs, ends or leaves."""
        with self._progress:
            return self._progress.wait_for(condition, timeout)

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    # -- bookkeeping the HTTP layer calls ----------------------------------------------------------------------
    def arrived(self) -> None:
        if self.first_request_at is None:
            self.first_request_at = time.time()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self._notify()

    def departed(self) -> None:
        self.in_flight -= 1
        self._notify()

    def client_left(self) -> None:
        if not self._closing:  # a server shutting down cancels its handlers too: those are not client aborts
            self.aborted += 1

    def draw_fault(self) -> str | None:
        f = self.faults
        roll = self.rng.random()
        for kind, rate in (
            ("drop", f.drop_rate),
            ("error", f.error_rate),
            ("malformed", f.malformed_rate),
            ("abort", f.abort_rate),
        ):
            if roll < rate:
                return kind
            roll -= rate
        return None

    def finished(self, request: dict[str, Any], response: dict[str, Any]) -> None:
        self.counters.prompt_tokens += response["usage"]["prompt_tokens"]
        self.counters.generation_tokens += response["usage"]["completion_tokens"]
        self.counters.finished.update(choice["finish_reason"] for choice in response["choices"])
        if self.record:
            self.log.append({"request": request, "response": response})
        with self._progress:
            self.completions += 1
            self._progress.notify_all()

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one `/v1/completions` body as vLLM would (status 200), or raise `HTTPFailure`."""
        body, ids_batch = self.engine.prompts(request)
        return self.engine.complete(body, ids_batch)
