"""`--reward judge`: an LLM judge behind an OpenAI-compatible `/v1/chat/completions`, with a client of its own.

Its own concurrency cap, per-attempt timeout, retries with backoff and API key (`JudgeSettings`), apart from the
policy's. A failure is never a reward: a transport error, a timeout, a 408/429/5xx, a reply without a verdict or
with one out of range is asked again (a new request, up to `max_retries` more), and a sample still without a
verdict has none (`RewardResult.failed == "judge"`, `judge.failed` saying why): the caller fails its group (or,
with `--judge-failures keep`, keeps it frozen). A status that no retry mends (400, 401, 404: a wrong model, URL or
key) stops the run (`RewardError`, exit 5). Each verdict is journaled under its group (the request's digest), so a
rerun of a failed group asks only what has no verdict yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import orjson

from ..errors import RewardError
from .base import NO_CONTENT, RewardRequest, RewardResult
from .judge import JudgeSettings, capped, group_verdict, render, verdict
from .remote import RETRYABLE

if TYPE_CHECKING:
    from ..folder.journal import Journal

MARK = "\x1fjudge"  # journal keys: problem id + this + the request's digest


class Counts(Protocol):
    """Where the judge's figures go: the run's `RunStats` (its `judge_*` fields)."""

    judge_requests: int
    judge_replayed: int
    judge_retried: int
    judge_failed: int
    judge_prompt_tokens: int
    judge_completion_tokens: int
    judge_wall_s: float


class _Scratch:
    """Counts nobody reads (the `Reward` protocol's `score`, called without a run's stats)."""

    def __init__(self) -> None:
        self.judge_requests = self.judge_replayed = self.judge_retried = self.judge_failed = 0
        self.judge_prompt_tokens = self.judge_completion_tokens = 0
        self.judge_wall_s = 0.0


class JudgeReward:
    name = "judge"

    def __init__(self, settings: JudgeSettings) -> None:
        if not settings.url.startswith(("http://", "https://")):
            raise RewardError(f"--judge-url {settings.url!r} must be an http:// or https:// URL")
        self.settings = settings
        base = settings.url.rstrip("/")
        chat = f"{base.removesuffix('/v1')}/v1/chat/completions"
        self.endpoint = base if base.endswith("/chat/completions") else chat
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            headers = {"content-type": "application/json"}
            if self.settings.api_key:
                headers["authorization"] = f"Bearer {self.settings.api_key}"
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
                headers=headers,
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._http

    # -- the Reward protocol (no journal: rescore without one, a user's own use) --------------------------------
    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return await self.judged(requests, None, ("", ""), _Scratch())

    async def judged(
        self, requests: list[RewardRequest], journal: Journal | None, group: tuple[str, str], counts: Counts
    ) -> list[RewardResult]:
        """Each request's verdict (one judge request each), replayed from `journal` where it holds one."""
        return list(await asyncio.gather(*(self._pointwise(r, journal, group, counts) for r in requests)))

    async def _pointwise(
        self, request: RewardRequest, journal: Journal | None, group: tuple[str, str], counts: Counts
    ) -> RewardResult:
        if request.content is None:
            return NO_CONTENT
        try:
            messages = render(self.settings.messages, _values(request))
        except KeyError as exc:
            return self._failed(f"the judge prompt names {{{exc.args[0]}}}, a field this row does not have", counts)

        def read(text: str) -> list[tuple[float, float]]:
            return [verdict(text, self.settings)]

        found = await self._ask(messages, read, journal, group, request.problem_id, counts)
        if isinstance(found, str):
            return self._failed(found, counts)
        (value, score), reply = found[0][0], found[1]
        return RewardResult(value, f"judge score {score:g}", judge=_kept(reply, score))

    async def judged_group(
        self, requests: list[RewardRequest], journal: Journal | None, group: tuple[str, str], counts: Counts
    ) -> list[RewardResult]:
        """`--judge-mode group`: the answers of these requests (a problem's K, one stage) in one judge request,
        `{answers}` holding them numbered; each scored by its `Score i: X`. Requests without content are not
        shown (they score 0, `no answer content`); a failure fails every shown one."""
        shown = [i for i, r in enumerate(requests) if r.content is not None]
        results: list[RewardResult] = [NO_CONTENT] * len(requests)
        if not shown:
            return results
        first = requests[shown[0]]
        answers = "\n\n".join(f"Answer {n}:\n{requests[i].content}" for n, i in enumerate(shown, 1))
        try:
            messages = render(self.settings.messages, {**_values(first), "answers": answers, "answer": answers})
        except KeyError as exc:
            why = f"the judge prompt names {{{exc.args[0]}}}, a field this row does not have"
            return [self._failed(why, counts) if i in shown else r for i, r in enumerate(results)]

        def read(text: str) -> list[tuple[float, float]]:
            return group_verdict(text, len(shown), self.settings)

        found = await self._ask(messages, read, journal, group, first.problem_id, counts)
        for n, i in enumerate(shown):
            if isinstance(found, str):
                results[i] = self._failed(found, counts)
            else:
                value, score = found[0][n]
                kept = _kept(found[1], score) | {"answer": n + 1, "of": len(shown)}
                results[i] = RewardResult(value, f"judge score {score:g} (answer {n + 1} of {len(shown)})", judge=kept)
        return results

    def _failed(self, why: str, counts: Counts) -> RewardResult:
        counts.judge_failed += 1
        judge = {"model": self.settings.model, "failed": why}
        return RewardResult(0.0, f"judge failed: {why}", failed="judge", judge=judge)

    # -- the requests ------------------------------------------------------------------------------------------
    async def _ask(
        self,
        messages: list[dict[str, str]],
        read: Any,
        journal: Journal | None,
        group: tuple[str, str],
        problem_id: str,
        counts: Counts,
    ) -> tuple[list[tuple[float, float]], dict[str, Any]] | str:
        """The parsed verdict and the reply as kept, or why there is none after every attempt."""
        s = self.settings
        body = {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
        }
        data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        key = f"{problem_id}{MARK}{digest}"
        if journal is not None:
            kept = journal.get(key, digest)
            if kept is not None:
                try:
                    counts.judge_replayed += 1
                    return read(str(kept["text"])), kept
                except (KeyError, ValueError):  # a journal from a run that read verdicts otherwise: asked again
                    counts.judge_replayed -= 1
        problem = "no attempt"
        for attempt in range(s.max_retries + 1):
            if attempt:
                counts.judge_retried += 1
                cap = s.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(random.uniform(cap / 2, cap))
            outcome = await self._post(data, counts)
            if isinstance(outcome, str):
                problem = outcome
                continue
            try:
                parsed = read(outcome["text"])
            except ValueError as exc:
                problem = f"{exc} (reply: {outcome['text'][-160:]!r})"
                continue
            if journal is not None:
                journal.put(key, digest, group, outcome)
            return parsed, outcome
        return f"{problem}, after {s.max_retries + 1} attempts"

    async def _post(self, data: bytes, counts: Counts) -> dict[str, Any] | str:
        """One request: the reply as kept ({text, model, prompt_tokens, completion_tokens}), or why it failed."""
        s = self.settings
        started = time.monotonic()
        try:
            async with self._slots, self._session().post(self.endpoint, data=data) as response:
                status, raw = response.status, await response.read()
        except asyncio.TimeoutError:
            return f"no reply within {s.timeout_s:g}s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            counts.judge_requests += 1
            counts.judge_wall_s += time.monotonic() - started
        if status != 200:
            said = raw[:200].decode("utf-8", "replace")
            if status not in RETRYABLE:
                raise RewardError(f"judge {self.endpoint} answered HTTP {status}: {said}")
            return f"HTTP {status}: {said}"
        try:
            reply = orjson.loads(raw)
            text = reply["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("no text content")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            return f"not a chat completion ({type(exc).__name__}: {raw[:120]!r})"
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        counts.judge_prompt_tokens += int(usage.get("prompt_tokens") or 0)
        counts.judge_completion_tokens += int(usage.get("completion_tokens") or 0)
        return {
            "text": text,
            "model": str(reply.get("model") or s.model),
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
        }

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()


def _values(request: RewardRequest) -> dict[str, Any]:
    """What a template may name: the row's metadata fields, then the request's own (which win)."""
    return {
        **request.metadata,
        "problem": request.problem,
        "answer": request.content if request.content is not None else "",
        "response": request.response,
        "label": "" if request.label is None else request.label,
        "id": request.problem_id,
    }


def _kept(reply: dict[str, Any], score: float) -> dict[str, Any]:
    """What a record keeps of a verdict: the reply's text (capped), the model that wrote it, its tokens."""
    return {
        "model": reply.get("model"),
        "score": score,
        "verdict": capped(str(reply.get("text", ""))),
        "prompt_tokens": reply.get("prompt_tokens"),
        "completion_tokens": reply.get("completion_tokens"),
    }
