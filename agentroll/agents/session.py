"""One execution's side of the proxy: its requests become token-exact calls of its `Context`, in order.

Each call is a record of the execution, in the order the calls finish (a call continues one that finished before
its request was sent, so a turn always comes after the turn it continues). A call's worker number, which derives
its seed and keys it in the call journal, is read off the request itself (what it asks, which choice of `n`, the
how-manieth time the execution asks it), never off its arrival order: after a stop, an agent that asks the same
again is answered from the journal, whichever of its concurrent requests arrives first.

A call that fails for good fails the execution (`failed`): the agent is answered 500, and the system stops it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson

from ..context import Context, ExecutionFailed
from ..process.concurrency import gather_or_cancel
from ..toolcalls import Parser
from . import messages as forms
from .history import Chat, Found, History, Text
from .messages import BadRequest
from .replies import Answer, answer_of
from .requests import ChatRequest, TextRequest

if TYPE_CHECKING:
    from ..record.schema import Sample

STAGE = "agent"
BARE = (
    "the agent sends the model's answers back without their reasoning: under thinking=branch each such turn is a "
    "new branch, rendered from text; --system-option thinking=continue continues them by the model's own ids"
)
log = logging.getLogger("agentroll")
NO_ROOM = "This model's maximum context length is {limit} tokens: the prompt leaves no room to generate"


class Session:
    """The calls of one execution, made for its agent's requests."""

    def __init__(self, ctx: Context, parse: Parser, thinking: str, pinned: bool = False) -> None:
        self.ctx = ctx
        self.pinned = pinned  # --system-option sampling=run: the run's sampling is sent, whatever the agent asks
        self.parse = parse
        self.samples: list[Sample] = []
        self.history = History(thinking)
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._asked: Counter[bytes] = Counter()
        self._workers: set[int] = set()
        self._calls: dict[str, dict[str, Any]] = {}  # tool call id -> its entry in a record's tool_calls
        self._tasks: set[asyncio.Task[Any]] = set()
        self.held: dict[str, list[dict[str, Any]]] = {}  # a response's id -> its messages and answer (Responses API)
        runtime = ctx.engine.stage(STAGE)
        self.encoder, self.think = runtime.encoder, runtime.config.think
        self.limit = runtime.config.max_context_len
        self.model, self.alternatives = runtime.config.model, runtime.config.alternatives  # as its agent is told

    # -- requests -----------------------------------------------------------------------------------------------
    async def chat(self, request: ChatRequest) -> list[tuple[Sample, Answer]]:
        """The request's `n` calls, each continuing the call its messages extend, or rendered whole."""
        canonical = [forms.canonical(m, i) for i, m in enumerate(request.messages)]
        form = forms.for_server if self.encoder.server_render is not None else forms.for_template
        rendered = [form(m, i) for i, m in enumerate(request.messages)]
        key = [request.tools, self.encoder.kwargs]
        found = self.history.find_chat(key, canonical)
        if found.bare:
            self.ctx.engine.stats.count("branches_by_reasoning")
            log.warning(BARE)
        asked = orjson.dumps(["chat", key, canonical, request.overrides, *_stops(request)], option=orjson.OPT_SORT_KEYS)
        sent = self._sent(request.overrides)

        async def one(choice: int) -> Sample:
            worker = self._worker(asked, choice)
            if found.parent is not None:
                tail = rendered[len(canonical) - len(found.tail) :]
                made = await self.ctx.complete(
                    STAGE,
                    tail,
                    worker=worker,
                    after=self.samples[found.parent],
                    tools=request.tools,
                    stop=request.stop,
                    **sent,
                )
            else:
                made = await self.ctx.complete(
                    STAGE, rendered, worker=worker, tools=request.tools, stop=request.stop, **sent
                )
            return self._no_room(made)

        made = await self._guarded(gather_or_cancel(*(one(i) for i in range(request.n))))
        out = []
        for sample in made:
            position = self._keep(sample, found, request.overrides)
            answer = answer_of(
                sample,
                think=self.think,
                parse=self.parse,
                tools=request.tools,
                tool_choice=request.tool_choice,
                # the call's own identity (what was asked, not when it finished): the same ids on a replay
                where=(
                    self.ctx.config.seed,
                    self.ctx.problem.id,
                    self.ctx.sample_index,
                    self.ctx.attempt,
                    sample.worker,
                ),
            )
            sample.tool_calls = answer.recorded
            self._calls.update((c["id"], c) for c in answer.recorded or [])
            self.history.add_chat(Chat(position, key, canonical, forms.canonical(answer.message())))
            out.append((sample, answer))
        self._results(canonical)
        return out

    async def text(self, request: TextRequest) -> list[Sample]:
        """The request's `n` calls: token ids extending an earlier call go on from its ids, else the prompt is
        encoded (a text prompt as vLLM encodes one: special tokens added)."""
        found = self.history.find_text(request.prompt)
        asked = orjson.dumps(["text", request.prompt, request.overrides, *_stops(request)], option=orjson.OPT_SORT_KEYS)
        sent = self._sent(request.overrides)
        tokenizer = self.encoder.tokenizer
        if found.parent is None:
            given = request.prompt
            ids = given if isinstance(given, list) else list(tokenizer.encode(given))
        elif isinstance(found.tail, str):
            ids = list(tokenizer.encode(found.tail, add_special_tokens=False)) if found.tail else []
        else:
            ids = list(found.tail)

        async def one(choice: int) -> Sample:
            worker = self._worker(asked, choice)
            stop, more = request.stop, sent
            if found.parent is not None:
                parent = self.samples[found.parent]
                return self._no_room(await self.ctx.extend(STAGE, parent, ids, worker=worker, stop=stop, **more))
            return self._no_room(await self.ctx.complete(STAGE, ids, worker=worker, stop=stop, **more))

        made = await self._guarded(gather_or_cancel(*(one(i) for i in range(request.n))))
        for sample in made:
            position = self._keep(sample, found, request.overrides)
            text, whole = sample.response, sample.finish_reason == "length"
            if sample.finish_reason == "stop" and isinstance(sample.stop_reason, str):
                # cut before the stop string, the text the agent got lacks the tokens that completed it: the
                # whole decoded response is what a prompt goes on from by ids (the agent writes the stop string)
                full = self.encoder.decoded(sample.response_token_ids, sample.prompt_token_ids)
                text, whole = (full, True) if full.startswith(sample.response) else (text, False)
            ids_ = (sample.prompt_token_ids, sample.response_token_ids)
            self.history.add_text(Text(position, request.prompt, *ids_, text, whole))
        return made

    # -- bookkeeping --------------------------------------------------------------------------------------------
    def _worker(self, asked: bytes, choice: int) -> int:
        """A worker number from what is asked: the same request, choice and time of asking give the same."""
        slot = asked + f"\x1f{choice}".encode()
        self._asked[slot] += 1
        digest = hashlib.blake2b(slot + f"\x1f{self._asked[slot]}".encode(), digest_size=4).digest()
        worker = int.from_bytes(digest, "big") & 0x7FFFFFFF
        while worker in self._workers:  # two requests hashed alike: the later one takes the next number
            worker = (worker + 1) & 0x7FFFFFFF
        self._workers.add(worker)
        return worker

    def _no_room(self, sample: Sample | None) -> Sample:
        if sample is None:
            raise BadRequest(NO_ROOM.format(limit=self.limit), "messages")
        return sample

    def _sent(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The sampling the call goes out with beyond the run's: the agent's, or none when pinned."""
        return {} if self.pinned else overrides

    def _keep(self, sample: Sample, found: Found, overrides: dict[str, Any]) -> int:
        position = len(self.samples)
        self.samples.append(sample)
        if self.pinned:  # what the agent asked (the keys it set), beside `sampling`, what was sent
            sample.agent_sampling = dict(overrides)
        sample.branched_from = found.branched_from if found.parent is None else None
        sample.rerendered = found.rerendered
        return position

    def _results(self, messages: list[dict[str, Any]]) -> None:
        """A tool call's result, as the agent sends it back, goes into the record that made the call (once)."""
        for message in messages:
            entry = self._calls.get(str(message.get("tool_call_id"))) if message["role"] == "tool" else None
            if entry is not None and entry["result"] is None:
                entry["result"] = message["content"]

    async def _guarded(self, work: Any) -> Any:
        """Run a request's calls as a task the session can cancel when the execution ends; a call that fails for
        good fails the execution."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        try:
            return await task
        except ExecutionFailed as exc:
            self.fail(exc)
            raise
        finally:
            if not task.done():  # the request itself was cancelled (the agent went away)
                task.cancel()
            self._tasks.discard(task)

    def fail(self, exc: BaseException) -> None:
        if not self.failed.done():
            self.failed.set_result(exc)

    async def close(self) -> None:
        """The execution is over: its requests still running are cancelled (their calls are not recorded)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _stops(request: ChatRequest | TextRequest) -> list[Any]:
    """A request's stop strings in what keys its calls, only when it has some (the keys of others unchanged)."""
    return [{"stop": request.stop}] if request.stop else []
