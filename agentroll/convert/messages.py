"""The chat messages behind a rendered prompt, for the conversational layouts (TRL's, NeMo-RL's preference data):
records keep the prompt as rendered text and ids, so the messages are recovered from the model's chat template
and accepted only when rendering them again gives the record's prompt exactly (`ChatMessages`)."""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError
from ..folder.manifest import Manifest

Record = dict[str, Any]


# Two placeholders no chat template rewrites (private-use characters around a name), one per message.
_SENTINELS = ("\ue000agentroll-message-0\ue001", "\ue000agentroll-message-1\ue001")
_SHAPES = (("user",), ("system", "user"))


class ChatMessages:
    """The chat messages a rendered prompt came from, for TRL's conversational layout.

    Records keep the prompt as rendered text and ids, not the messages (the stage templates and the row's
    problem statement are not stored). The model's chat template is rendered once with placeholder messages
    (a user message; a system message and a user message) to learn the text around each message; a record's
    prompt is matched against that, and the messages found are accepted only if rendering them again gives the
    record's prompt exactly. So `apply_chat_template(messages, add_generation_prompt=True)` is the record's
    `prompt`, whose token ids are `prompt_token_ids`; no ids are ever derived from the messages.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template_kwargs: dict[str, Any],
        name: str = "the tokenizer",
        run: str | None = None,
        way_out: str = "use --layout standard (the prompt as rendered text)",
    ) -> None:
        self.name = name
        self.run = run  # the tokenizer the run used (the manifest's), when `name` is another
        self.way_out = way_out  # what to do about a prompt that is not one message (the format's own way)
        self._tokenizer = tokenizer
        self._kwargs = chat_template_kwargs
        self._patterns: list[tuple[tuple[str, ...], re.Pattern[str]]] = []
        frames = []
        for shape in _SHAPES:
            placeholders = [{"role": role, "content": s} for role, s in zip(shape, _SENTINELS, strict=False)]
            try:
                text = self.render(placeholders)
            except Exception:  # a template that refuses this shape (say, no system role): try the next
                continue
            pieces = _split(text, _SENTINELS[: len(shape)])
            if pieces is not None:
                for group in ("(.*)", "(.*?)"):  # greedy, then lazy: the re-rendering decides
                    self._patterns.append((shape, re.compile(group.join(map(re.escape, pieces)), re.S)))
                frames.append(self._frame(placeholders) or "".join(pieces))
        self._cache: dict[str, list[dict[str, str]] | None] = {}
        # A message's content never holds the markup the template frames messages with: a content that does is
        # several messages rendered together (a later turn's prompt, a row's own conversation), not one. Only
        # the special tokens of that frame count: a user may well write an added token the frame never uses
        # (`<think>` in Qwen3's vocabulary).
        special = set(getattr(tokenizer, "all_special_tokens", None) or [])
        special |= {
            str(getattr(t, "content", t)) for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
        }
        self._markup = sorted(t for t in special if t.strip() and any(t in frame for frame in frames))

    def render(self, messages: list[dict[str, str]]) -> str:
        return str(
            self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **self._kwargs)
        )

    def _frame(self, messages: list[dict[str, str]]) -> str | None:
        """The template's text around the messages without the generation prompt (which may hold tokens no
        message boundary does, as Qwen3's empty `<think></think>` with thinking off), or None."""
        try:
            text = str(
                self._tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=False, **self._kwargs
                )
            )
        except Exception:
            return None
        pieces = _split(text, _SENTINELS[: len(messages)])
        return None if pieces is None else "".join(pieces)

    def __call__(self, prompt: str) -> list[dict[str, str]] | None:
        """The messages that render to exactly `prompt`, or None."""
        if prompt not in self._cache:
            self._cache[prompt] = self._find(prompt)
        return self._cache[prompt]

    def _find(self, prompt: str) -> list[dict[str, str]] | None:
        for shape, pattern in self._patterns:
            match = pattern.fullmatch(prompt)
            if match:
                if any(token in content for content in match.groups() for token in self._markup):
                    continue
                messages = [{"role": role, "content": c} for role, c in zip(shape, match.groups(), strict=True)]
                try:
                    if self.render(messages) == prompt:
                        return messages
                except Exception:
                    continue
        return None


def _split(text: str, sentinels: tuple[str, ...]) -> list[str] | None:
    pieces, rest = [], text
    for sentinel in sentinels:
        if rest.count(sentinel) != 1:
            return None
        before, rest = rest.split(sentinel)
        pieces.append(before)
    return [*pieces, rest]


def load_messages(manifest: Manifest, tokenizer: str | None, way_out: str | None = None) -> ChatMessages:
    """`ChatMessages` with --tokenizer, else the tokenizer and chat-template arguments the run used. `way_out`:
    what a refusal suggests, for a format without `--layout standard`."""
    from ..render.chat import load_tokenizer

    settings = manifest.settings
    run = settings.get("tokenizer")
    name = tokenizer or run
    if not name:
        raise UsageError("the folder's manifest names no tokenizer: pass --tokenizer, or --layout standard")
    other = str(run) if run and str(run) != str(name) else None
    kwargs = dict(settings.get("chat_template_kwargs") or {})
    return ChatMessages(load_tokenizer(str(name)), kwargs, str(name), other, *([way_out] if way_out else []))


def prompt_messages(chat: ChatMessages, record: Record) -> list[dict[str, str]]:
    """The record's prompt as messages; a one-line `UsageError` naming the record (problem, stage, turn) and the
    way out when they cannot be recovered exactly."""
    messages = chat(record["prompt"])
    if messages is not None:
        return messages
    turn = record.get("turn") or 0
    where = f"problem {record['problem_id']}, {record['stage']}, turn {turn}"
    standard = chat.way_out
    if turn:
        raise UsageError(
            f"{where}: its prompt holds the conversation so far (it continues turn {turn - 1}), which the "
            f"conversational layout cannot write as one user message; {standard}"
        )
    if chat.run is not None:
        raise UsageError(
            f"{where}: its prompt is not {chat.name}'s chat template of one user message (and an optional system "
            f"message); the run used {chat.run}: pass that with --tokenizer, or {standard}"
        )
    raise UsageError(
        f"{where}: its prompt is not the run's chat template ({chat.name}) of one user message (and an optional "
        f"system message): a row's own conversation, or a prompt the system built otherwise; {standard}"
    )


def response_messages(record: Record) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": record["response"]}]
