"""Multi-turn conversations, for `validate`: a record that `continues` another is checked against it, token for
token, within its execution."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_TOLERANCE = 1e-9


@dataclass(slots=True)
class _Turn:
    """What a later turn of the same execution is checked against."""

    line: int
    turn: int
    trainable: bool
    prompt: list[int]
    response: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    history_mask: list[int] | None
    history_logprobs: list[float] | None


def _list(v: Any, item: type) -> typing.TypeGuard[list[Any]]:
    return type(v) is list and all(type(x) is item or (item is float and type(x) is int) for x in v)


class Conversations:
    """The records of the execution being read (consecutive records of one rollout_id), so that a record that
    `continues` an earlier one is checked against it: a valid earlier position, the next turn, its prompt and
    response a prefix of this prompt token for token, and the history mask and logprobs exactly that earlier
    record's (its own history over its prompt, its loss mask and logprobs over its response, 0 on what came
    after). Only the current execution is kept."""

    def __init__(self, add: Callable[[int | None, str, str], None]) -> None:
        self.add = add
        self.rollout: Any = None
        self.turns: list[_Turn | None] = []

    def unreadable(self) -> None:
        """A line that is no record: it keeps its place in the execution it was in (nothing can continue it)."""
        if self.turns:
            self.turns.append(None)

    def record(self, line: int, r: dict[str, Any]) -> None:
        if r.get("rollout_id") != self.rollout or not self.turns:
            self.rollout, self.turns = r.get("rollout_id"), []
        position = len(self.turns)
        turn = self._turn(line, r)
        self.turns.append(turn)
        continues = r.get("continues")
        if turn is None or type(continues) is not int:
            return  # a first turn, or a schema fault already said
        if not 0 <= continues < position:
            self.add(
                line,
                "conversation",
                f"continues {continues} is not an earlier record of its execution (this "
                f"is its record {position}, counting from 0)",
            )
            return
        earlier = self.turns[continues]
        if earlier is None:
            return  # unreadable: its own faults are said
        where = f"the record it continues (line {earlier.line})"
        if turn.turn != earlier.turn + 1:
            self.add(line, "conversation", f"turn {turn.turn} continues {where}, which is turn {earlier.turn}")
        head = earlier.prompt + earlier.response
        if turn.prompt[: len(head)] != head:
            diff = next(
                (i for i, (a, b) in enumerate(zip(turn.prompt, head, strict=False)) if a != b),
                min(len(turn.prompt), len(head)),
            )
            self.add(
                line,
                "conversation",
                f"prompt_token_ids do not start with the prompt and response of {where}: "
                f"they differ at token {diff} (of {len(head)})",
            )
            return
        if turn.history_mask is None or turn.history_logprobs is None:
            return  # said by record_faults
        p, n = len(earlier.prompt), len(earlier.response)
        mask = list(earlier.history_mask) if earlier.history_mask is not None else [0] * p
        logprobs = list(earlier.history_logprobs) if earlier.history_logprobs is not None else [0.0] * p
        model = [*mask, *earlier.loss_mask]
        sampled = [*logprobs, *(x if m else 0.0 for x, m in zip(earlier.logprobs, earlier.loss_mask, strict=True))]
        rest = len(turn.prompt) - p - n
        expected_mask = [*model, *[0] * rest]
        expected_logprobs = [*sampled, *[0.0] * rest]
        if turn.history_mask != expected_mask:
            frozen = [*mask, *[0] * n, *[0] * rest]
            if earlier.trainable or turn.history_mask != frozen:  # a frozen turn's tokens may be marked 0
                bad = next(i for i, (a, b) in enumerate(zip(turn.history_mask, expected_mask, strict=True)) if a != b)
                part = (
                    "its prompt (that record's history_mask)"
                    if bad < p
                    else "its response (that record's loss_mask)"
                    if bad < p + n
                    else "the tokens after it (0)"
                )
                self.add(
                    line,
                    "conversation",
                    f"history_mask item {bad} is {turn.history_mask[bad]} where {where} "
                    f"says {expected_mask[bad]}: over {part}",
                )
                return
            expected_logprobs = [*logprobs, *[0.0] * (n + rest)]
        wrong = next(
            (
                i
                for i, (a, b) in enumerate(zip(turn.history_logprobs, expected_logprobs, strict=True))
                if not math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)
            ),
            None,
        )
        if wrong is not None:
            self.add(
                line,
                "conversation",
                f"history_logprobs item {wrong} is {turn.history_logprobs[wrong]} where "
                f"{where} sampled {expected_logprobs[wrong]}",
            )

    @staticmethod
    def _turn(line: int, r: dict[str, Any]) -> _Turn | None:
        prompt, response, loss_mask = r.get("prompt_token_ids"), r.get("response_token_ids"), r.get("loss_mask")
        logprobs, mask, history = r.get("response_logprobs"), r.get("history_mask"), r.get("history_logprobs")
        if not (
            _list(prompt, int)
            and _list(response, int)
            and _list(loss_mask, int)
            and _list(logprobs, float)
            and type(r.get("turn")) is int
            and len(loss_mask) == len(logprobs) == len(response)
        ):
            return None
        first_turn = mask is None and history is None
        if not first_turn and not (
            _list(mask, int) and _list(history, float) and len(mask) == len(history) == len(prompt)
        ):
            return None
        return _Turn(
            line,
            r["turn"],
            r.get("trainable") is not False,
            prompt,
            response,
            loss_mask,
            [float(x) for x in logprobs],
            mask,
            None if history is None else [float(x) for x in history],
        )
