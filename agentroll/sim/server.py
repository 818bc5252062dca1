"""A simulated vLLM server: vLLM 0.32's OpenAI-compatible wire format over real HTTP, with scripted answers.

Field names, `finish_reason` values, error bodies and status codes follow what a real vLLM 0.32 answers (see
`docs/simulated-server.md` and the captures it was checked against). It runs the model nobody trains: a
`Script` writes the text, the bundled tiny tokenizer turns it into token ids, and logprobs are seeded noise.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import orjson

from ..resources import sim_tokenizer_dir
from .script import Script

VLLM_VERSION = "0.32.0"
DEFAULT_MODEL = "agentroll-sim"


def error_body(message: str, kind: str, code: int, param: str | None = None, legacy: bool = False) -> dict[str, Any]:
    """vLLM's error shape: nested since 0.10.1, flat (`"object": "error"`) before."""
    if legacy:
        return {"object": "error", "message": message, "type": kind, "param": param, "code": code}
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class HTTPFailure(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body


@dataclass
class Faults:
    """Fault injection for reliability tests: probabilities per completion request."""

    error_rate: float = 0.0  # answered 500 or 503, alternating both vLLM error shapes
    drop_rate: float = 0.0  # connection closed with no answer
    latency_s: float = 0.0  # added to every completion request


@dataclass
class SimServer:
    script: Script = field(default_factory=Script)
    model: str = DEFAULT_MODEL
    max_model_len: int = 4096
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    record: bool = True  # keep every completion exchange in `log` (tests read it; benchmarks turn it off)
    api_key: str | None = None  # like `vllm serve --api-key`: /v1/* then needs `Authorization: Bearer KEY`
    tokenizer_dir: Path = field(default_factory=sim_tokenizer_dir)

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(self.tokenizer_dir) / "tokenizer.json"))
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.eos_id: int = self.tokenizer.token_to_id("<|im_end|>") or 0
        self._filler = list(self.tokenizer.encode(" and so on", add_special_tokens=False).ids)
        self._id_strings = [f"token_id:{i}" for i in range(self.vocab_size)]
        noise = random.Random(self.seed + 1)  # logprobs: seeded noise, sliced per answer
        self._noise = [round(-noise.expovariate(1.5), 6) for _ in range(self.max_model_len + 8192)]
        self._encoded: dict[str, list[int]] = {}
        self.rng = random.Random(self.seed)
        self.log: list[dict[str, Any]] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self.completions = 0
        self.aborted = 0  # requests whose client disconnected before the answer
        self.first_request_at: float | None = None
        self.url: str | None = None
        self._chat_template: Any = None
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._progress = threading.Condition()

    # -- HTTP plumbing ----------------------------------------------------------------------------------------
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._server = await asyncio.start_server(self._connection, host, port, backlog=4096)
        bound = self._server.sockets[0].getsockname()
        self.url = f"http://{bound[0]}:{bound[1]}"
        return self.url

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

    def wait_for_completions(self, count: int, timeout: float = 60.0) -> bool:
        """Block (another thread) until `count` completions have been answered: tests synchronise on this."""
        return self.wait_until(lambda: self.completions >= count, timeout)

    def wait_until(self, condition: Any, timeout: float = 60.0) -> bool:
        with self._progress:
            return self._progress.wait_for(condition, timeout)

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    async def aclose(self) -> None:
        """Stop listening and close every open connection (as a killed server would)."""
        if self._server is not None:
            self._server.close()
        for _ in range(5):  # connections accepted just before the close take a few loop turns to show up
            await asyncio.sleep(0.01)
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    request, body = event, bytearray()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    answer = await self._answer_unless_gone(request, bytes(body), reader)
                    if answer is None:  # the client left (vLLM aborts the request), or an injected drop
                        return
                    status, payload = answer
                    headers = [("server", "uvicorn"), ("content-length", str(len(payload)))]
                    if payload:
                        kind = "text/plain; version=0.0.4" if payload[:1] == b"#" else "application/json"
                        headers.append(("content-type", kind))
                    writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
                    writer.write(conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
                    await writer.drain()
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or PAUSED on a closed peer
                    return
        except (h11.RemoteProtocolError, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            writer.close()

    async def _answer_unless_gone(self, request: h11.Request, body: bytes,
                                  reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
        """Dispatch, but like vLLM stop working on a request whose client disconnected (counted in `aborted`)."""
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        work = asyncio.ensure_future(self._dispatch(request.method.decode(), request.target.decode(), body, headers))
        gone = asyncio.ensure_future(reader.read(1))  # clients here never pipeline: any read result means EOF
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in (work, gone):
                future.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
        if work.cancelled():
            self.aborted += 1
            self._notify()
            return None
        status, payload = work.result()
        return None if status == 0 else (status, payload)

    async def _dispatch(self, method: str, target: str, body: bytes,
                        headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        path = target.split("?", 1)[0]
        if self.api_key and path.startswith("/v1") and (headers or {}).get("authorization") != f"Bearer {self.api_key}":
            return 401, b'{"error":"Unauthorized"}'  # vLLM's --api-key middleware, verbatim
        routes: dict[tuple[str, str], Any] = {
            ("GET", "/health"): self._health,
            ("GET", "/version"): lambda _: {"version": VLLM_VERSION},
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._detokenize,
        }
        try:
            if (method, path) == ("POST", "/v1/completions"):
                return await self._completions_http(body)
            if (method, path) == ("GET", "/metrics"):
                return 200, self._metrics()
            handler = routes.get((method, path))
            if handler is None:
                known = any(p == path for _, p in routes)
                return (405, b'{"detail":"Method Not Allowed"}') if known else (404, b'{"detail":"Not Found"}')
            result = handler(self._json(body) if method == "POST" else None)
            return 200, b"" if result is None else orjson.dumps(result)
        except HTTPFailure as failure:
            return failure.status, orjson.dumps(failure.body)

    @staticmethod
    def _json(body: bytes) -> dict[str, Any]:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise HTTPFailure(400, error_body(f"JSON decode error: {exc}", "BadRequestError", 400)) from None
        if not isinstance(data, dict):
            raise HTTPFailure(400, error_body("Input should be a valid dictionary", "BadRequestError", 400))
        return data

    # -- endpoints --------------------------------------------------------------------------------------------
    def _metrics(self) -> bytes:
        """A few of vLLM's Prometheus series (same names), plus the simulator's own first-request time."""
        label = f'model_name="{self.model}"'
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{label}}} {float(self.in_flight)}\n"
            "# TYPE vllm:request_success_total counter\n"
            f"vllm:request_success_total{{{label}}} {float(self.completions)}\n"
            "# TYPE agentroll_sim_first_request_unix gauge\n"
            f"agentroll_sim_first_request_unix {self.first_request_at or 0.0}\n"
        ).encode()

    def _health(self, _: Any) -> None:
        return None

    def _models(self, _: Any) -> dict[str, Any]:
        created = int(time.time())
        return {"object": "list", "data": [{
            "id": self.model, "object": "model", "created": created, "owned_by": "vllm", "root": self.model,
            "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}]}]}

    def _render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        if self._chat_template is None:
            import jinja2

            config = orjson.loads((Path(self.tokenizer_dir) / "tokenizer_config.json").read_bytes())
            self._chat_template = jinja2.Environment().from_string(config["chat_template"])
        return str(self._chat_template.render(messages=messages, add_generation_prompt=add_generation_prompt))

    def _tokenize(self, data: dict[str, Any]) -> dict[str, Any]:
        if "messages" in data:
            text = self._render_chat(data["messages"], data.get("add_generation_prompt", True))
            ids = self.tokenizer.encode(text, add_special_tokens=data.get("add_special_tokens", False)).ids
        else:
            special = data.get("add_special_tokens", True)
            ids = self.tokenizer.encode(str(data.get("prompt", "")), add_special_tokens=special).ids
        strs = [self.tokenizer.id_to_token(i) for i in ids] if data.get("return_token_strs") else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    def _detokenize(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": self.tokenizer.decode(list(data.get("tokens", [])), skip_special_tokens=False)}

    async def _completions_http(self, body: bytes) -> tuple[int, bytes]:
        if self.first_request_at is None:
            self.first_request_at = time.time()
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        try:
            status, payload, exchange = self._outcome(body)
            # The answer leaves `latency_s` after the request arrived, whatever computing it cost.
            remaining = self.faults.latency_s - (loop.time() - arrived)
            if remaining > 0:
                await asyncio.sleep(remaining)
            if exchange is not None and self.record:
                self.log.append(exchange)
            if status == 200:
                with self._progress:
                    self.completions += 1
                    self._progress.notify_all()
            return status, payload
        finally:
            self.in_flight -= 1

    def _outcome(self, body: bytes) -> tuple[int, bytes, dict[str, Any] | None]:
        """Status, body and (for a 200) the exchange to log; status 0 means drop the connection."""
        roll = self.rng.random()
        if roll < self.faults.drop_rate:
            return 0, b"", None
        if roll < self.faults.drop_rate + self.faults.error_rate:
            legacy = self.rng.random() < 0.5
            status = 500 if self.rng.random() < 0.5 else 503
            kind = "InternalServerError" if status == 500 else "ServiceUnavailableError"
            return status, orjson.dumps(error_body("simulated engine failure", kind, status, legacy=legacy)), None
        try:
            request = self._json(body)
            response = self.complete(request)
        except HTTPFailure as failure:
            return failure.status, orjson.dumps(failure.body), None
        except Exception as exc:  # a broken script is the engine failing: vLLM answers 500
            return 500, orjson.dumps(error_body(f"{type(exc).__name__}: {exc}", "InternalServerError", 500)), None
        return 200, orjson.dumps(response), {"request": request, "response": response}

    # -- the completion itself --------------------------------------------------------------------------------
    def _prompt_ids(self, request: dict[str, Any]) -> list[int]:
        prompt = request.get("prompt")
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt).ids)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            for t in prompt:
                if not 0 <= t < self.vocab_size:
                    raise HTTPFailure(400, error_body(f"Token id {t} is out of vocabulary", "BadRequestError", 400))
            return prompt
        raise HTTPFailure(400, error_body("prompt must be a string or a list of token ids", "BadRequestError", 400,
                                          "prompt"))

    def complete(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one `/v1/completions` body as vLLM would (status 200), or raise `HTTPFailure`."""
        model = request.get("model")
        if model is not None and model != self.model:
            raise HTTPFailure(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
        if request.get("stream"):
            raise HTTPFailure(400, error_body("the simulated server does not stream", "BadRequestError", 400, "stream"))
        prompt_ids = self._prompt_ids(request)
        limit = self.max_model_len
        if len(prompt_ids) >= limit:
            raise HTTPFailure(400, error_body(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{len(prompt_ids)} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={len(prompt_ids)})",
                "BadRequestError", 400, "input_tokens"))
        max_tokens = request.get("max_tokens")
        max_tokens = 16 if max_tokens is None else int(max_tokens)
        if max_tokens > limit:
            raise HTTPFailure(400, error_body(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer "
                f"output tokens. (parameter=max_tokens, value={max_tokens})", "BadRequestError", 400, "max_tokens"))
        if max_tokens < 1:
            raise HTTPFailure(400, error_body("max_tokens must be at least 1, got 0.", "BadRequestError", 400,
                                              "max_tokens"))
        max_tokens = min(max_tokens, limit - len(prompt_ids))  # vLLM cuts silently near the context limit
        seed = request.get("seed")
        rng = random.Random(seed) if seed is not None else random.Random(self.rng.getrandbits(64))
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        n = int(request.get("n") or 1)
        choices = [self._choice(i, request, prompt_ids, prompt_text, max_tokens, rng) for i in range(n)]
        completion_tokens = sum(len(c.pop("_ids")) for c in choices)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
            "model": self.model, "choices": choices, "service_tier": None,
            "system_fingerprint": f"vllm-{VLLM_VERSION}-simulated",
            "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) * n + completion_tokens,
                      "completion_tokens": completion_tokens, "prompt_tokens_details": None,
                      "completion_tokens_details": None},
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        }

    def _encode_answer(self, text: str) -> list[int]:
        """Token ids for an answer: the think block's encoding is cached (the script reuses think blocks), the
        rest encoded fresh. Two encodings joined are a valid token sequence that decodes to the joined text."""
        head, sep, tail = text.partition("</think>")
        if not sep:
            head, tail = text, ""
        ids = self._encoded.get(head)
        if ids is None:
            if len(self._encoded) > 4096:
                self._encoded.clear()
            ids = self._encoded[head] = list(self.tokenizer.encode(head, add_special_tokens=False).ids)
        if sep or tail:
            return ids + list(self.tokenizer.encode(sep + tail, add_special_tokens=False).ids)
        return list(ids)

    def _choice(self, index: int, request: dict[str, Any], prompt_ids: list[int], prompt_text: str,
                max_tokens: int, rng: random.Random) -> dict[str, Any]:
        scripted = self.script.answer(prompt_text, rng, request)
        ids = self._encode_answer(scripted.text)
        if scripted.truncate:  # a model that rambles on: pad with filler up to the budget
            ids += self._filler * (max_tokens // len(self._filler) + 1)
        if len(ids) + 1 > max_tokens or scripted.truncate:
            ids, finish = ids[:max_tokens], "length"
        else:
            ids, finish = [*ids, self.eos_id], "stop"  # EOS is generated, so it is in token_ids...
        text_ids = ids[:-1] if finish == "stop" else ids  # ...but not in the text
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        as_ids = bool(request.get("return_tokens_as_token_ids"))
        want_ids = bool(request.get("return_token_ids"))
        k = request.get("logprobs")
        logprobs = None
        if k is not None:
            start = rng.randrange(len(self._noise) - len(ids))
            values = self._noise[start:start + len(ids)]
            if as_ids:
                tokens = [self._id_strings[t] for t in ids]
            else:
                tokens = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:-1]
            if k:
                top = []
                for token, value in zip(tokens, values, strict=True):
                    entry = {token: value}
                    for _ in range(int(k)):
                        other = rng.randrange(self.vocab_size)
                        name = self._id_strings[other] if as_ids else (self.tokenizer.id_to_token(other) or "")
                        entry.setdefault(name, round(value - rng.random(), 6))
                    top.append(entry)
            else:
                top = [{token: value} for token, value in zip(tokens, values, strict=True)]
            logprobs = {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": top}
        return {
            "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None,
            "token_ids": ids if want_ids else None, "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None, "routed_experts": None, "_ids": ids,
        }
