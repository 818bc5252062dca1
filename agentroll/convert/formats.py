"""Each `--to` format: its files, which options it takes, its defaults (frozen records, whole conversations, the
advantage its trainer needs or computes itself), and its writer. `convert()` checks the options against this
table before anything is read or written."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import dpo, megatron, sft, slime, trl
from .common import ADVANTAGES, LAYOUTS, STDS, ChatMessages, Problem

Read = Callable[[], Iterable[Problem]]
Written = tuple[int, list[Path], dict[str, int]]  # rows, files, extra summary counts


@dataclass(slots=True)
class Options:
    """What a writer is given besides the problems."""

    out: Path
    include_frozen: bool
    chat: ChatMessages | None
    max_pairs_per_group: int | None
    groups_per_file: int | None
    ranks: int
    settings: dict[str, Any]  # the source manifest's


@dataclass(slots=True)
class Spec:
    """One format. `advantage`: the default `--advantage`, or None when the format takes none, with `refusal`
    saying why (its trainer computes advantages itself, or its rows carry rewards)."""

    name: str
    write: Callable[[Read, Options], Written]
    names: list[str]
    stale: str | None = None
    rl: bool = True  # frozen records left out by default
    whole: bool = False  # whole conversations by default (`trajectories`)
    chat: bool = False  # --layout / --tokenizer
    pairs: bool = False  # --max-pairs-per-group
    steps: bool = False  # --groups-per-file
    ranks: bool = False  # --ranks
    routes: bool = False  # reads routed experts
    advantage: str | None = "none"
    needs_advantage: bool = False
    refusal: str = ""
    requires: Callable[[], Any] | None = None

    def require(self) -> None:
        if self.requires is not None:
            self.requires()

    def check(self, advantage: str | None, std: str | None, max_pairs: int | None, layout: str | None,
              tokenizer: str | None, groups_per_file: int | None, ranks: int | None,
              trajectories: bool | None) -> str:
        """The `--advantage` to use; a one-line `UsageError` for an option this format does not take."""
        if advantage is not None and advantage not in ADVANTAGES:
            raise UsageError(f"--advantage takes one of {', '.join(ADVANTAGES)}, not {advantage!r}")
        if self.advantage is None:
            if advantage not in (None, "none"):
                raise UsageError(f"--advantage is not for --to {self.name}: {self.refusal}")
            chosen = "none"
        else:
            chosen = advantage or self.advantage
            if self.needs_advantage and chosen == "none":
                raise UsageError(f"--to {self.name} needs an advantage on every trained token: --advantage grpo or "
                                 "mean")
        if std is not None:
            if std not in STDS:
                raise UsageError(f"--std takes one of {', '.join(STDS)}, not {std!r}")
            if chosen != "grpo":
                raise UsageError("--std is for --advantage grpo (the standard deviation it divides by)")
        only = {"--max-pairs-per-group": (max_pairs, self.pairs), "--layout": (layout, self.chat),
                "--tokenizer": (tokenizer, self.chat), "--groups-per-file": (groups_per_file, self.steps),
                "--ranks": (ranks, self.ranks)}
        for flag, (value, allowed) in only.items():
            if value is not None and not allowed:
                takers = [s.name for s in SPECS.values() if getattr(s, _ATTRS[flag])]
                raise UsageError(f"{flag} is for --to {' and '.join(takers)}, not {self.name}")
        if trajectories is not None and not self.whole:
            takers = [s.name for s in SPECS.values() if s.whole]
            raise UsageError(f"trajectories is for --to {', '.join(takers)}, not {self.name}")
        for flag, number in (("--max-pairs-per-group", max_pairs), ("--groups-per-file", groups_per_file),
                             ("--ranks", ranks)):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
                raise UsageError(f"{flag} takes a whole number of at least 1, not {number!r}")
        if layout is not None and layout not in LAYOUTS:
            raise UsageError(f"--layout takes one of {', '.join(LAYOUTS)}, not {layout!r}")
        if tokenizer is not None and layout == "standard":
            raise UsageError("--tokenizer is for --layout conversational (it recovers the chat messages)")
        return chosen


_ATTRS = {"--max-pairs-per-group": "pairs", "--layout": "chat", "--tokenizer": "chat", "--groups-per-file": "steps",
          "--ranks": "ranks"}
_REWARDS = "its rows carry rewards, not advantages"


def _dpo(read: Read, o: Options) -> Written:
    return dpo.write(read(), o.out, o.chat, o.max_pairs_per_group), [o.out / dpo.FILE], {}


def _sft(read: Read, o: Options) -> Written:
    return sft.write(read(), o.out, o.chat), [o.out / sft.FILE], {}


def _trl(read: Read, o: Options) -> Written:
    return trl.write(read(), o.out), [o.out / trl.FILE], {}


def _slime(read: Read, o: Options) -> Written:
    rows, files, left = slime.write(read(), o.out, o.groups_per_file)
    return rows, files, {"left_over_problems": left} if o.groups_per_file is not None else {}


def _megatron(read: Read, o: Options) -> Written:
    rows, placeholders = megatron.write(read, o.out, o.include_frozen)
    return rows, [o.out / megatron.FILE], {"placeholders": placeholders}


SPECS: dict[str, Spec] = {spec.name: spec for spec in [
    Spec("dpo", _dpo, [dpo.FILE], rl=False, chat=True, pairs=True, advantage=None, refusal=_REWARDS),
    Spec("sft", _sft, [sft.FILE], rl=False, chat=True, advantage=None, refusal=_REWARDS),
    Spec("trl", _trl, [trl.FILE]),
    Spec("slime", _slime, [slime.FILE], slime.PT_PATTERN, whole=True, steps=True, routes=True,
         requires=slime.require_torch),
    Spec("megatron", _megatron, [megatron.FILE], whole=True, advantage=None,
         refusal="Megatron computes its GRPO advantages from reward over each RolloutGroup "
                 "(rl_utils.calculate_grpo_advantages) and never reads one"),
]}
FORMATS = tuple(SPECS)
