"""What the real-vLLM tests share: a recording proxy, problem files, the CLI run, and vLLM's raw answers read
independently of agentroll's own parser (so a check compares a record with what vLLM itself sent)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from agentroll.process.resources import sim_tokenizer_dir

from ..conftest import run_cli

TOKENIZER = str(sim_tokenizer_dir())  # the tiny model ships this very tokenizer
COMPLETIONS, GENERATE = "/v1/completions", "/inference/v1/generate"
SAMPLING_KEYS = ("seed", "temperature", "top_p", "top_k", "min_p", "max_tokens")


class RecordingProxy:
    """Forwards to vLLM and logs each completion's raw answer, from either API; `strip_token_ids` hides
    `token_ids` of /v1/completions answers from the client (as a server without return_token_ids would), after
    logging them."""

    def __init__(self, upstream: str, strip_token_ids: bool = False) -> None:
        self.upstream, self.strip = upstream, strip_token_ids
        self.log: list[dict] = []
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=body or None,
                headers={"content-type": "application/json"},
            ) as answer,
        ):
            raw, status = await answer.read(), answer.status
        if request.path in (COMPLETIONS, GENERATE) and status == 200:
            self.log.append({"path": request.path, "request": json.loads(body), "response": json.loads(raw)})
            if self.strip and request.path == COMPLETIONS:
                payload = json.loads(raw)  # a copy to alter: the log keeps what vLLM sent
                for choice in payload["choices"]:
                    choice["token_ids"] = None
                raw = json.dumps(payload).encode()
        return web.Response(body=raw, status=status, content_type="application/json")

    def __enter__(self) -> RecordingProxy:
        def main() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            runner = web.AppRunner(app)
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
            self._ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def problems(path: Path, count: int) -> Path:
    with path.open("w") as f:
        for i in range(count):
            f.write(
                json.dumps({"id": f"r{i}", "prompt": f"What is {i} times {i + 2}?", "label": str(i * (i + 2))}) + "\n"
            )
    return path


def generate(url: str, input_path: Path, out: Path, *extra: str, seed: int = 3, max_tokens: int = 24):
    return run_cli(
        "generate",
        str(input_path),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--no-think",
        "--max-tokens",
        str(max_tokens),
        "--reward",
        "exact",
        "--seed",
        str(seed),
        *extra,
        timeout=900,
    )


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def key(record: dict) -> tuple:
    """A record's place in the run: the same in two runs of one input with one seed."""
    return record["problem_id"], record["stage"], record["worker"], record["sample_index"]


@dataclass
class Answer:
    """One answer as vLLM sent it, read straight from the JSON of either API."""

    api: str
    prompt: list[int]
    params: dict[str, Any]  # the sampling parameters of the request
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    stop_reason: int | str | None
    choice: dict[str, Any]
    payload: dict[str, Any]
    ranks: list[int] | None = None  # generate only
    top: list[list[tuple[int, float]]] | None = None  # generate with logprobs asked: ranks 1..K, in rank order


def answers(log: list[dict], alternatives: int = 0) -> list[Answer]:
    """The run's own calls from a proxy log: without agentroll's start-up probes, which ask for one token."""
    out = []
    for exchange in log:
        request, payload = exchange["request"], exchange["response"]
        choice = payload["choices"][0]
        if exchange["path"] == GENERATE:
            params = request["sampling_params"]
            if params["max_tokens"] == 1:
                continue
            content = choice["logprobs"]["content"]
            assert [c["token_id"] for c in content] == choice["token_ids"]
            top = None
            if alternatives:
                top = []
                for c in content:
                    ranked = sorted(
                        (t for t in c["top_logprobs"] if t["rank"] <= alternatives), key=lambda t: t["rank"]
                    )
                    # asked for K + 1 entries (sampled token first), vLLM always holds ranks 1..K
                    assert [t["rank"] for t in ranked] == list(range(1, alternatives + 1)), c["top_logprobs"]
                    top.append([(t["token_id"], t["logprob"]) for t in ranked])
            out.append(
                Answer(
                    "generate",
                    request["token_ids"],
                    params,
                    choice["token_ids"],
                    [c["logprob"] for c in content],
                    choice["finish_reason"],
                    choice["stop_reason"],
                    choice,
                    payload,
                    ranks=[c["rank"] for c in content],
                    top=top,
                )
            )
        else:
            if request["max_tokens"] == 1:
                continue
            out.append(
                Answer(
                    "completions",
                    request["prompt"],
                    request,
                    choice["token_ids"],
                    choice["logprobs"]["token_logprobs"],
                    choice["finish_reason"],
                    choice["stop_reason"],
                    choice,
                    payload,
                )
            )
    return out


def match(records: list[dict], served: list[Answer]) -> list[tuple[dict, Answer]]:
    """Each record with the one answer of its call: same prompt ids and same per-call seed. One to one."""
    by_call: dict[tuple, Answer] = {}
    for a in served:
        call = (tuple(a.prompt), a.params["seed"])
        assert call not in by_call, "two calls with one prompt and one seed"
        by_call[call] = a
    pairs = []
    for r in records:
        call = tuple(r["prompt_token_ids"]), r["sampling"]["seed"]
        assert call in by_call, f"record {key(r)} matches no call vLLM answered"
        a = by_call.pop(call)
        pairs.append((r, a))
    assert not by_call, f"{len(by_call)} answered calls have no record"
    return pairs


def same_ranking(ids_a: list[int], lps_a: list[float], ids_b: list[int], lps_b: list[float]) -> bool:
    """The same top tokens with the same logprobs, in the same order up to tokens of exactly equal logprob."""
    return lps_a == lps_b and sorted(zip(lps_a, ids_a, strict=True)) == sorted(zip(lps_b, ids_b, strict=True))


def logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))
