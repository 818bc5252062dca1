"""Which earlier call a request continues, from what the agent sent: an index of one execution's calls.

A chat request continues an earlier call when its messages are that call's messages, then that call's answer
(as the proxy gave it: content, tool calls, reasoning), then anything new. Messages are compared in their
canonical form (`messages.canonical`), by a chain of hashes over each prefix, so a request is matched in one
pass over its messages whatever the number of earlier calls. The longest match wins (the latest call, on a tie):
its prompt and sampled response ids are reused as they are and only the new messages are rendered. With
`thinking="continue"` an answer echoed without its reasoning still matches (the model's own tokens, thinking
included, stay in the prompt); by default it does not: the agent rewrote what the model saw.

A request that continues nothing is rendered whole. When it carries earlier assistant turns (history rendered
from text: `rerendered`), it starts a new branch of the conversation it shares the most messages with
(`branched_from`): the agent edited or dropped a message, stripped the thinking, or the tools changed. Such a
call is never stitched onto an earlier one's ids.

A completion request (`/v1/completions`) continues an earlier one when its token ids start with that call's
prompt and response ids, or its text with that call's prompt text and response text where the text holds every
response token (a response cut at max_tokens; one that ended on a stop token has that token in its ids but not
in its text). The longest such call is continued; failing that, the request is encoded whole, and branches off
the call whose prompt it extends.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["Chat", "Found", "History", "Text"]


def _step(previous: bytes, item: Any) -> bytes:
    return hashlib.blake2b(previous + orjson.dumps(item, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def chain(key: Any, messages: list[dict[str, Any]]) -> list[bytes]:
    """h[0] for the conversation's setting (tools, template arguments), h[i] for its first i messages."""
    hashes = [_step(b"", key)]
    for message in messages:
        hashes.append(_step(hashes[-1], message))
    return hashes


@dataclass(frozen=True, slots=True)
class Chat:
    """A chat call as the index keeps it: where it sits among the execution's records, and what it was."""

    position: int
    key: Any
    messages: list[dict[str, Any]]  # canonical
    answer: dict[str, Any]  # canonical, as the agent was answered


@dataclass(frozen=True, slots=True)
class Text:
    """A completion call: its prompt as sent (text or ids), the ids it became, its response."""

    position: int
    prompt: str | list[int]
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    whole: bool  # the response text holds every response token


@dataclass(frozen=True, slots=True)
class Found:
    """How a request relates to the calls before it. `parent`: the call it continues (its position), with
    `tail` the request's part after that call's answer (new messages, or the new text or ids); else None, and
    `branched_from` the call whose conversation it departs from, `rerendered` whether it carries earlier model
    turns rendered from text."""

    parent: int | None = None
    tail: Any = None
    branched_from: int | None = None
    rerendered: bool = False
    stripped: bool = False  # continued although the agent dropped the answer's reasoning (thinking="continue")
    bare: bool = False  # a branch that thinking="continue" would have continued: only the reasoning was dropped


@dataclass
class History:
    """The calls of one execution, as requests find them."""

    thinking: str = "branch"  # or "continue": an answer echoed without its reasoning still continues
    _ends: dict[bytes, int] = field(default_factory=dict)  # hash of messages + answer -> position
    _loose: dict[bytes, int] = field(default_factory=dict)  # the same with the answer's reasoning dropped
    _seen: dict[bytes, int] = field(default_factory=dict)  # any prefix of messages + answer -> position
    _texts: list[Text] = field(default_factory=list)

    # -- chat -------------------------------------------------------------------------------------------------
    def add_chat(self, call: Chat) -> None:
        hashes = chain(call.key, call.messages)
        for h in hashes[1:]:
            self._seen[h] = call.position
        end = _step(hashes[-1], call.answer)
        self._ends[end] = self._seen[end] = call.position
        if "reasoning" in call.answer:
            bare = {k: v for k, v in call.answer.items() if k != "reasoning"}
            self._loose[_step(hashes[-1], bare)] = call.position

    def find_chat(self, key: Any, messages: list[dict[str, Any]]) -> Found:
        hashes = chain(key, messages)
        bare = False
        for i in range(len(messages), 0, -1):
            h = hashes[i]
            tail = messages[i:]
            if h in self._ends:
                return Found(self._ends[h], tail, rerendered=_assistant(tail))
            if h in self._loose:
                if self.thinking == "continue":
                    return Found(self._loose[h], tail, rerendered=_assistant(tail), stripped=True)
                bare = bare or not _assistant(tail)  # the reasoning dropped, and nothing else rewritten after
        if not _assistant(messages):
            return Found()
        shared = next((self._seen[h] for h in reversed(hashes[1:]) if h in self._seen), None)
        return Found(branched_from=shared, rerendered=True, bare=bare)

    # -- completions ------------------------------------------------------------------------------------------
    def add_text(self, call: Text) -> None:
        self._texts.append(call)

    def find_text(self, prompt: str | list[int]) -> Found:
        """The longest continuation, else the longest branch, else a new conversation."""
        best: tuple[bool, int, Found] | None = None
        for call in self._texts:
            if isinstance(prompt, list):  # ids against ids, whatever the earlier call was sent as
                done = call.prompt_ids + call.response_ids
                if prompt[: len(done)] == done:
                    found, size = Found(call.position, prompt[len(done) :]), len(done)
                elif len(prompt) > len(call.prompt_ids) and prompt[: len(call.prompt_ids)] == call.prompt_ids:
                    found, size = Found(branched_from=call.position, rerendered=True), len(call.prompt_ids)
                else:
                    continue
            else:
                if not isinstance(call.prompt, str):
                    continue
                done_text = call.prompt + call.response_text
                if call.whole and prompt.startswith(done_text):
                    found, size = Found(call.position, prompt[len(done_text) :]), len(done_text)
                elif len(prompt) > len(call.prompt) and prompt.startswith(call.prompt):
                    found, size = Found(branched_from=call.position, rerendered=True), len(call.prompt)
                else:
                    continue
            rank = (found.parent is not None, size)
            if best is None or rank >= best[:2]:
                best = (*rank, found)
        return best[2] if best is not None else Found()


def _assistant(messages: list[dict[str, Any]]) -> bool:
    return any(m["role"] == "assistant" for m in messages)
