"""A teacher scoring what a student sampled: the exact ids the student saw and sampled (prompt + response), sent
as one token-id prompt to the teacher's vLLM (`prompt_logprobs`, one generated token: prefill only), and the
response positions' logprobs, ranks and top k written into the record.

The teacher has a client of its own (`CompletionClient`: own endpoints, own concurrency and slots, retries and
endpoint health), apart from the run's, so its calls never take a slot a generation needs. A scored call is kept
in the call journal like a generation (its key: the student call's, marked; its digest: the ids, the teacher's
model and K): a stop loses only the scoring calls in flight, and a rerun replays the rest.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import orjson

from ..client import FIRST, CompletionClient, Priority, follow_metrics
from ..errors import UsageError
from ..schema import Sample
from ..wire import Completion
from .settings import TeacherSettings

if TYPE_CHECKING:
    from ..client import Transport
    from ..folder.journal import Journal

MARK = "\x1fteacher"  # appended to the student call's journal key


class Teacher:
    """One teacher: `settings`, its client, and what its server said of itself (`model`, `max_model_len`).
    `start` (or `use`) before `score`."""

    def __init__(self, settings: TeacherSettings, transport: Transport | None = None) -> None:
        self.settings = settings
        self.client = CompletionClient(list(settings.urls), settings.client, transport=transport)
        self.model = ""
        self.max_model_len: int | None = None
        self.scored = 0  # scoring calls the server answered
        self.replayed = 0  # scoring calls answered from the call journal of an earlier run

    @property
    def url(self) -> str:
        return ", ".join(e.url for e in self.client.endpoints)

    async def start(self, model: str, max_model_len: int | None) -> None:
        """The served model and its context as discovered (`handshake.discover`); under auto concurrency, the
        teacher's own caps follow its /metrics."""
        self.model, self.max_model_len = model, max_model_len
        if self.client.adaptive:
            await follow_metrics(self.client)

    def room(self, context: int | None, what: str, student: bool = True) -> None:
        """A sequence of `context` tokens (`what`: the records it stands for) must fit the teacher's context with
        the one token a scoring call generates: refused before anything is scored, not on every long record.
        `student`: the student's context can still be set (generate), not a finished folder's (distill)."""
        limit = self.max_model_len
        if context is None or limit is None or context < limit:
            return
        raise UsageError(
            f"--teacher {self.url}: its max_model_len ({limit}) leaves no room to score {what} of {context} tokens "
            f"(prompt + response) plus the one token a scoring call generates: serve the teacher with "
            f"--max-model-len {context + 1} or more"
            + (f", or give the student --max-context-len {limit - 1}" if student else "")
        )

    async def score(
        self,
        sample: Sample,
        journal: Journal | None = None,
        key: str | None = None,
        group: tuple[str, str] = ("", ""),
        priority: Priority = FIRST,
    ) -> None:
        """Score `sample`'s response in its own context and set its `teacher_*` fields. `key` (with `journal`):
        the call's identity in the journal, `group` the group it belongs to. Raises `CallFailed` when the
        teacher fails for good (the caller fails the group: a record is never written half scored)."""
        sequence = sample.prompt_token_ids + sample.response_token_ids
        start = len(sample.prompt_token_ids)
        k = self.settings.logprobs
        if not sample.response_token_ids:
            self.apply(sample, Completion(sequence, [], [], None, "length", None, ranks=[]))
            return
        digest = hashlib.blake2b(orjson.dumps([sequence, self.model, k]), digest_size=12).hexdigest()
        found = journal.get(key + MARK, digest) if journal is not None and key is not None else None
        if found is not None:
            self.replayed += 1
            done = Completion.from_json(found, sequence)
        else:
            done = await self.client.score(sequence, start, self.model, k, key=sample.problem_hash, priority=priority)
            self.scored += 1
            if journal is not None and key is not None:
                journal.put(key + MARK, digest, group, done.to_json())
        self.apply(sample, done)

    def apply(self, sample: Sample, done: Completion) -> None:
        sample.teacher_logprobs = [float(x) for x in done.logprobs]
        sample.teacher_ranks = [int(r or 0) for r in done.ranks or ()]
        if self.settings.logprobs:
            sample.teacher_top_ids = done.top_token_ids or []
            sample.teacher_top_logprobs = done.top_logprobs or []
        else:
            sample.teacher_top_ids = sample.teacher_top_logprobs = None

    def settled(self, group: int) -> None:
        """The group is done with: its slots' bookkeeping in the teacher's own budget goes (as the run's does)."""
        self.client.budget.finished(group)

    def report(self) -> dict[str, Any]:
        """What the summary and the manifest's `last_run.teachers` say of it."""
        return {
            "model": self.model,
            "endpoints": [e.url for e in self.client.endpoints],
            "logprobs": self.settings.logprobs,
            "scored": self.scored,
            "replayed": self.replayed,
            "requests": asdict(self.client.counters),
        }

    async def aclose(self) -> None:
        await self.client.aclose()


def clear(sample: Sample) -> None:
    """No teacher for this record (its stage has none)."""
    sample.teacher_logprobs = sample.teacher_ranks = None
    sample.teacher_top_ids = sample.teacher_top_logprobs = None
