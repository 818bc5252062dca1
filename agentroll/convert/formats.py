"""Each `--to` format: its files, which options it takes, its defaults (frozen records, whole conversations, the
advantage its trainer needs or computes itself), and its writer. `convert()` checks the options against this
table before anything is read or written."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import dpo, megatron, nemo_rl, openrlhf, prime_rl, sft, skyrl, slime, trl, verifiers, verl
from .common import ADVANTAGES, LAYOUTS, STDS, Problem
from .messages import ChatMessages

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
    across: str | None = None  # --across-policies: pairs across policies, their prompts checked at this stage
    loss: str = "rl"  # prime-rl: the loss components the trained tokens feed (--loss)
    teacher_topk: bool | None = None  # verl: the teacher's top k per row, or the next token's logprob


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
    chat: bool = False  # chat messages recovered: --tokenizer
    layout: bool = True  # with chat: --layout standard too
    pairs: bool = False  # --max-pairs-per-group
    steps: bool = False  # --groups-per-file
    ranks: bool = False  # --ranks
    routes: bool = False  # reads the sidecar: routed experts as arrays, sampling masks as lists
    losses: bool = False  # --loss
    topk: bool = False  # --teacher-topk
    advantage: str | None = "none"
    needs_advantage: bool = False
    refusal: str = ""
    epsilon: float = 0.0  # what the trainer's GRPO adds to the std it divides by (`--advantage grpo`)
    requires: Callable[[], Any] | None = None

    def require(self) -> None:
        if self.requires is not None:
            self.requires()

    def check(
        self,
        advantage: str | None,
        std: str | None,
        max_pairs: int | None,
        layout: str | None,
        tokenizer: str | None,
        groups_per_file: int | None,
        ranks: int | None,
        trajectories: bool | None,
        loss: str | None = None,
        teacher_topk: bool | None = None,
    ) -> str:
        """The `--advantage` to use; a one-line `UsageError` for an option this format does not take."""
        if advantage is not None and advantage not in ADVANTAGES:
            raise UsageError(f"--advantage takes one of {', '.join(ADVANTAGES)}, not {advantage!r}")
        if loss is not None and loss not in prime_rl.LOSSES:
            raise UsageError(f"--loss takes one of {', '.join(prime_rl.LOSSES)}, not {loss!r}")
        if self.advantage is None:
            if advantage not in (None, "none"):
                raise UsageError(f"--advantage is not for --to {self.name}: {self.refusal}")
            chosen = "none"
        elif loss == "ref_kl":  # distillation alone: no rl component, no advantage to carry
            if advantage not in (None, "none"):
                raise UsageError("--loss ref_kl trains the teacher's KL alone: no --advantage (or rl+ref_kl)")
            chosen = "none"
        else:
            chosen = advantage or self.advantage
            if self.needs_advantage and chosen == "none":
                raise UsageError(
                    f"--to {self.name} needs an advantage on every trained token: --advantage grpo or mean"
                    + (" (or --loss ref_kl: the teacher's KL alone)" if self.losses else "")
                )
        if std is not None:
            if std not in STDS:
                raise UsageError(f"--std takes one of {', '.join(STDS)}, not {std!r}")
            if chosen != "grpo":
                raise UsageError("--std is for --advantage grpo (the standard deviation it divides by)")
        only = {
            "--max-pairs-per-group": (max_pairs, self.pairs),
            "--layout": (layout, self.chat and self.layout),
            "--tokenizer": (tokenizer, self.chat),
            "--groups-per-file": (groups_per_file, self.steps),
            "--ranks": (ranks, self.ranks),
            "--loss": (loss, self.losses),
            "--teacher-topk": (teacher_topk, self.topk),
        }
        for flag, (value, allowed) in only.items():
            if value is not None and not allowed:
                takers = [s.name for s in SPECS.values() if all(getattr(s, a) for a in _ATTRS[flag])]
                raise UsageError(f"{flag} is for --to {' and '.join(takers)}, not {self.name}")
        if trajectories is not None and not self.whole:
            takers = [s.name for s in SPECS.values() if s.whole]
            raise UsageError(f"trajectories is for --to {', '.join(takers)}, not {self.name}")
        for flag, number in (
            ("--max-pairs-per-group", max_pairs),
            ("--groups-per-file", groups_per_file),
            ("--ranks", ranks),
        ):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
                raise UsageError(f"{flag} takes a whole number of at least 1, not {number!r}")
        if layout is not None and layout not in LAYOUTS:
            raise UsageError(f"--layout takes one of {', '.join(LAYOUTS)}, not {layout!r}")
        if tokenizer is not None and layout == "standard":
            raise UsageError("--tokenizer is for --layout conversational (it recovers the chat messages)")
        return chosen


_ATTRS = {
    "--max-pairs-per-group": ("pairs",),
    "--layout": ("chat", "layout"),
    "--tokenizer": ("chat",),
    "--groups-per-file": ("steps",),
    "--ranks": ("ranks",),
    "--loss": ("losses",),
    "--teacher-topk": ("topk",),
}
_REWARDS = "its rows carry rewards, not advantages"


def _dpo(read: Read, o: Options) -> Written:
    return dpo.write(read(), o.out, o.chat, o.max_pairs_per_group, o.across), [o.out / dpo.FILE], {}


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


def _verl(read: Read, o: Options) -> Written:
    return verl.write(read(), o.out, o.include_frozen, o.teacher_topk), [o.out / verl.FILE], {}


def _openrlhf(read: Read, o: Options) -> Written:
    return openrlhf.write(read(), o.out, o.include_frozen), [o.out / openrlhf.FILE], {}


def _prime_rl(read: Read, o: Options) -> Written:
    rows, files = prime_rl.write(read(), o.out, o.groups_per_file, o.ranks, o.settings, o.loss)
    return rows, files, {}


def _nemo_rl(read: Read, o: Options) -> Written:
    return nemo_rl.write(read(), o.out, o.include_frozen), [o.out / nemo_rl.FILE], {}


def _nemo_rl_dpo(read: Read, o: Options) -> Written:
    assert o.chat is not None
    rows = nemo_rl.write_dpo(read(), o.out, o.chat, o.max_pairs_per_group, o.across)
    return rows, [o.out / nemo_rl.DPO_FILE], {}


def _verifiers(read: Read, o: Options) -> Written:
    rows = verifiers.write(read(), o.out, o.include_frozen, o.settings)
    return rows, [o.out / verifiers.FILE, o.out / verifiers.METADATA], {}


def _skyrl(read: Read, o: Options) -> Written:
    return skyrl.write(read(), o.out, o.include_frozen), [o.out / skyrl.FILE], {}


def _computes(trainer: str, how: str) -> str:
    return f"{trainer} computes its GRPO advantages from the reward itself ({how})"


SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in [
        Spec("dpo", _dpo, [dpo.FILE], rl=False, chat=True, pairs=True, advantage=None, refusal=_REWARDS),
        Spec("sft", _sft, [sft.FILE], rl=False, chat=True, advantage=None, refusal=_REWARDS),
        Spec("trl", _trl, [trl.FILE], epsilon=1e-4),  # grpo_trainer.py, _generate_and_score_completions
        Spec(
            "slime",
            _slime,
            [slime.FILE],
            slime.PT_PATTERN,
            whole=True,
            steps=True,
            routes=True,
            requires=slime.require_torch,
            epsilon=1e-6,  # slime/ray/rollout.py, _post_process_rewards
        ),
        Spec(
            "megatron",
            _megatron,
            [megatron.FILE],
            whole=True,
            advantage=None,
            refusal="Megatron computes its GRPO advantages from reward over each RolloutGroup "
            "(rl_utils.calculate_grpo_advantages) and never reads one",
        ),
        Spec(
            "verl",
            _verl,
            [verl.FILE],
            whole=True,
            routes=True,
            topk=True,
            advantage=None,
            refusal=_computes("verl", "over each uid, the (problem, stage) group"),
        ),
        Spec(
            "openrlhf", _openrlhf, [openrlhf.FILE], whole=True, epsilon=1e-9
        ),  # experience_maker.py, compute_advantages_and_returns
        Spec(
            "prime-rl",
            _prime_rl,
            [prime_rl.DIR],
            whole=True,
            steps=True,
            ranks=True,
            routes=True,
            losses=True,
            advantage="mean",
            needs_advantage=True,
            requires=prime_rl.require_msgspec,
        ),
        Spec(
            "nemo-rl",
            _nemo_rl,
            [nemo_rl.FILE],
            whole=True,
            advantage=None,
            refusal=_computes("NeMo-RL", "per identical prompt tokens"),
        ),
        Spec(
            "nemo-rl-dpo",
            _nemo_rl_dpo,
            [nemo_rl.DPO_FILE],
            rl=False,
            chat=True,
            layout=False,
            pairs=True,
            advantage=None,
            refusal=_REWARDS,
        ),
        Spec("verifiers", _verifiers, [verifiers.FILE, verifiers.METADATA], whole=True, advantage="mean", routes=True),
        Spec(
            "skyrl",
            _skyrl,
            [skyrl.FILE],
            whole=True,
            advantage=None,
            refusal=_computes("SkyRL", "over each trajectory_ids instance_id, the (problem, stage) group"),
        ),
    ]
}
FORMATS = tuple(SPECS)
