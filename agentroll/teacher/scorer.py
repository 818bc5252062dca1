"""A teacher scoring what a student sampled: the exact ids each call saw and sampled (prompt + response), each a
token-id prompt of the teacher's vLLM (`prompt_logprobs`, one generated token: prefill only, of the whole
sequence: vLLM reads no cached prefix for a `prompt_logprobs` request), several in one request (vLLM's batch of
prompts), and the response positions' logprobs, ranks and top k written into each record. A record whose whole
sequence begins another's (an earlier turn of a conversation continued by ids, or the same call twice) is read
from that one's scores, not prefilled again: a conversation of T turns costs one prefill of its last turn, not T of
a growing prefix (each position's logprob depends only on the ids before it).

The teacher has a client of its own (`CompletionClient`: own endpoints, own concurrency and slots, retries and
endpoint health), apart from the run's, so its requests never take a slot a generation needs. Each record's scores
are kept in the call journal like a generation (their key: the student call's, marked; their digest: the ids, the
teacher's model and K): a stop loses only the scoring requests in flight, and a rerun replays the rest.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from ..client import FIRST, CompletionClient, Priority, follow_metrics
from ..client.wire import PATHS, Completion, parse_scores, score_body
from ..errors import UsageError
from ..process.concurrency import gather_or_cancel
from ..record.schema import Sample
from .settings import TeacherSettings

if TYPE_CHECKING:
    from ..client import Transport
    from ..folder.journal import Journal

MARK = "\x1fteacher"  # appended to the student call's journal key
MOST_SEQUENCES = 32  # sequences scored in one request
MOST_TOKENS = 1 << 17  # and their tokens, added up
NAMED = 20  # unscored records named in the summary and the manifest (all are counted)


class Teacher:
    """One teacher: `settings`, its client, and what its server said of itself (`model`, `max_model_len`).
    `start` (or `use`) before `score`."""

    def __init__(self, settings: TeacherSettings, transport: Transport | None = None) -> None:
        self.settings = settings
        self.client = CompletionClient(list(settings.urls), settings.client, transport=transport)
        self.model = ""
        self.max_model_len: int | None = None
        self.scored = 0  # records the server scored
        self.requests = 0  # the requests they took (several records a request)
        self.replayed = 0  # records scored from the call journal of an earlier run
        self.unscored = 0  # records that fill the teacher's context: kept without teacher fields
        self.unscored_records: list[str] = []  # the first NAMED of them, named

    @property
    def url(self) -> str:
        return ", ".join(e.url for e in self.client.endpoints)

    async def start(self, model: str, max_model_len: int | None) -> None:
        """The served model and its context as discovered (`handshake.discover`); under auto concurrency, the
        teacher's own caps follow its /metrics."""
        self.model, self.max_model_len = model, max_model_len
        if self.client.adaptive:
            await follow_metrics(self.client)

    def room(self, context: int | None, what: str, student: bool = True) -> bool:
        """Whether a sequence of `context` tokens (`what`: the records it stands for) fits the teacher's context
        with the one token a scoring call generates. Under --teacher-all-or-nothing one that does not is refused
        (a `UsageError`, before anything is scored); else such records are kept unscored (`leave`). `student`:
        the student's context can still be set (generate), not a finished folder's (distill)."""
        limit = self.max_model_len
        if context is None or limit is None or context < limit:
            return True
        if not self.settings.all_or_nothing:
            return False
        raise UsageError(
            f"--teacher {self.url}: its max_model_len ({limit}) leaves no room to score {what} of {context} tokens "
            f"(prompt + response) plus the one token a scoring call generates: serve the teacher with "
            f"--max-model-len {context + 1} or more"
            + (f", or give the student --max-context-len {limit - 1}" if student else "")
            + " (without --teacher-all-or-nothing such records are kept unscored)"
        )

    def leave(self, sample: Sample) -> None:
        """A record that fills the teacher's context: kept without teacher fields, counted and (the first NAMED)
        named, so a trainer's loss skips it and the summary says how many."""
        clear(sample)
        self.unscored += 1
        if len(self.unscored_records) < NAMED:
            self.unscored_records.append(_name(sample))

    async def score(
        self,
        samples: list[Sample],
        keys: list[str] | None = None,
        journal: Journal | None = None,
        group: tuple[str, str] = ("", ""),
        priority: Priority = FIRST,
    ) -> None:
        """Score each sample's response in its own context and set its `teacher_*` fields: as few requests as the
        batch limits allow (`MOST_SEQUENCES`, `MOST_TOKENS`), those made in an earlier run replayed from `journal`
        (`keys`: each call's identity there, `group` the group they belong to). Raises `CallFailed` when the teacher
        fails for good (the caller fails the group: a record is never written half scored)."""
        k = self.settings.logprobs
        asked: list[tuple[Sample, str | None, str]] = []
        limit = self.max_model_len
        for i, sample in enumerate(samples):
            sequence = sample.prompt_token_ids + sample.response_token_ids
            if limit is not None and len(sequence) >= limit:  # no room for the token a scoring call generates
                self.leave(sample)
                continue
            if not sample.response_token_ids:
                self.apply(sample, Completion(sequence, [], [], None, "length", None, ranks=[]))
                continue
            key = keys[i] + MARK if keys is not None and journal is not None else None
            digest = hashlib.blake2b(orjson.dumps([sequence, self.model, k]), digest_size=12).hexdigest()
            found = journal.get(key, digest) if journal is not None and key is not None else None
            if found is not None:
                self.replayed += 1
                self.apply(sample, _unkept(found, sample))
            else:
                asked.append((sample, key, digest))
        batches: list[list[Cover]] = []
        tokens = 0
        for cover in covers(asked):
            if not batches or len(batches[-1]) >= MOST_SEQUENCES or tokens + len(cover.sequence) > MOST_TOKENS:
                batches.append([])
                tokens = 0
            batches[-1].append(cover)
            tokens += len(cover.sequence)
        await gather_or_cancel(*(self._batch(batch, journal, group, priority) for batch in batches))

    async def _batch(
        self, batch: list[Cover], journal: Journal | None, group: tuple[str, str], priority: Priority
    ) -> None:
        sequences = [c.sequence for c in batch]
        starts = [c.start for c in batch]
        hash_of = batch[0].members[0][0].problem_hash
        answers = await score(self.client, sequences, starts, self.model, self.settings.logprobs, hash_of, priority)
        self.requests += 1
        for cover, answer in zip(batch, answers, strict=True):
            for sample, key, digest in cover.members:
                done = cover.cut(answer, sample)
                self.scored += 1
                if journal is not None and key is not None:
                    journal.put(key, digest, group, _kept(done))
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
            "scoring_requests": self.requests,
            "replayed": self.replayed,
            "unscored": self.unscored,
            "unscored_records": list(self.unscored_records),
            "requests": asdict(self.client.counters),
        }

    async def aclose(self) -> None:
        await self.client.aclose()


class Cover:
    """One sequence sent to the teacher and the records whose whole sequence begins it (itself among them)."""

    __slots__ = ("members", "sequence", "start")

    def __init__(self, sequence: list[int], member: tuple[Sample, str | None, str]) -> None:
        self.sequence = sequence
        self.members = [member]
        self.start = len(member[0].prompt_token_ids)  # the first position any member's response holds

    def take(self, member: tuple[Sample, str | None, str], sequence: list[int]) -> bool:
        if len(sequence) > len(self.sequence) or self.sequence[: len(sequence)] != sequence:
            return False
        self.members.append(member)
        self.start = min(self.start, len(member[0].prompt_token_ids))
        return True

    def cut(self, answer: Completion, sample: Sample) -> Completion:
        """`sample`'s response positions of the scores of `sequence[start:]`."""
        begin = len(sample.prompt_token_ids) - self.start
        end = begin + len(sample.response_token_ids)
        done = Completion(
            sample.prompt_token_ids + sample.response_token_ids,
            answer.token_ids[begin:end],
            answer.logprobs[begin:end],
            None,
            answer.finish_reason,
            answer.stop_reason,
            ranks=None if answer.ranks is None else answer.ranks[begin:end],
        )
        if answer.top_token_ids is not None and answer.top_logprobs is not None:
            done.top_token_ids, done.top_logprobs = answer.top_token_ids[begin:end], answer.top_logprobs[begin:end]
        return done


def covers(asked: list[tuple[Sample, str | None, str]]) -> list[Cover]:
    """The sequences to send: the longest first, each later one taken by a sequence it begins, where there is."""
    sequences = [s.prompt_token_ids + s.response_token_ids for s, _, _ in asked]
    found: list[Cover] = []
    for i in sorted(range(len(asked)), key=lambda i: -len(sequences[i])):
        if not any(cover.take(asked[i], sequences[i]) for cover in found):
            found.append(Cover(sequences[i], asked[i]))
    return found


async def score(
    client: CompletionClient,
    sequences: list[list[int]],
    starts: list[int],
    model: str,
    alternatives: int = 0,
    key: str | None = None,
    priority: Priority = FIRST,
) -> list[Completion]:
    """The scores of each `sequences[i][starts[i]:]` by the teacher `client` serves, in one request (vLLM's
    `prompt_logprobs` over each sequence: `wire.score_body`, `wire.parse_scores`), retried as a completion is."""
    payload = orjson.dumps(score_body(model, sequences, alternatives))
    read = partial(parse_scores, sequences=sequences, starts=starts, alternatives=alternatives)
    return await client.call(PATHS["completions"], payload, read, model, sequences[0], None, key, priority)


async def score_each(
    asked: list[tuple[Teacher, Sample, str]],
    journal: Journal | None = None,
    group: tuple[str, str] = ("", ""),
    priority: Priority = FIRST,
) -> None:
    """Each (teacher, sample, journal key): a teacher's samples scored together (`Teacher.score`: its batches)."""
    by_teacher: dict[int, tuple[Teacher, list[Sample], list[str]]] = {}
    for teacher, sample, key in asked:
        entry = by_teacher.setdefault(id(teacher), (teacher, [], []))
        entry[1].append(sample)
        entry[2].append(key)
    await gather_or_cancel(*(t.score(mine, keys, journal, group, priority) for t, mine, keys in by_teacher.values()))


def _kept(done: Completion) -> dict[str, Any]:
    """What the journal keeps of a record's scores: the scores alone (the ids are the record's, and the digest)."""
    return {"logprobs": done.logprobs, "ranks": done.ranks, "top_ids": done.top_token_ids, "top": done.top_logprobs}


def _unkept(found: dict[str, Any], sample: Sample) -> Completion:
    sequence = sample.prompt_token_ids + sample.response_token_ids
    done = Completion(
        sequence, sample.response_token_ids, found["logprobs"], None, "length", None, ranks=found["ranks"]
    )
    done.top_token_ids, done.top_logprobs = found.get("top_ids"), found.get("top")
    return done


def _name(sample: Sample) -> str:
    """A record as the summary names it: problem/sample, stage, and its worker and turn where it has several."""
    where = "".join(f" {k} {v}" for k, v in (("worker", sample.worker), ("turn", sample.turn)) if v)
    return f"{sample.problem_id}/{sample.sample_index} {sample.stage}{where}"


def clear(sample: Sample) -> None:
    """No teacher for this record (its stage has none)."""
    sample.teacher_logprobs = sample.teacher_ranks = None
    sample.teacher_top_ids = sample.teacher_top_logprobs = None
