"""`--judge-failures keep`: a group with a sample the judge gave no verdict is written, but held back from training.

The sample without a verdict has no reward (its `raw_reward` 0 stands for none: `judge.failed` says why), so the
group's baseline (its mean and std, every advantage computed from them) is not known either: every record of the
group is frozen (`trainable: false`, which every converter leaves out), with a note in `reward_info` saying so.
`rescore --failed-only` asks the judge again for those samples alone and, once each has its verdict, releases
the group: the records frozen here are trainable again (a stage frozen for its own reasons stays frozen).
"""

from __future__ import annotations

from typing import Any

HELD = "held back: a sample of its group has no verdict from the judge"
WAS_TRAINABLE = HELD + " (trainable)"


def unjudged(sample: Any) -> bool:
    judge = getattr(sample, "judge", None)
    return isinstance(judge, dict) and judge.get("failed") is not None


def needs_judging(executions: list[list[Any]]) -> bool:
    return any(unjudged(s) for samples in executions for s in samples)


def hold(executions: list[list[Any]]) -> bool:
    """Freeze every record of a group with a sample without a verdict (noted); True when it did."""
    if not needs_judging(executions):
        return False
    for samples in executions:
        for sample in samples:
            note = WAS_TRAINABLE if sample.trainable else HELD
            sample.reward_info = f"{sample.reward_info}; {note}" if sample.reward_info else note
            sample.trainable = False
    return True


def release(executions: list[list[Any]]) -> None:
    """Undo `hold` (before the group is scored again): each record as it was before it was held."""
    for samples in executions:
        for sample in samples:
            info = sample.reward_info or ""
            for note, was in ((WAS_TRAINABLE, True), (HELD, False)):
                if info.endswith(note):
                    sample.reward_info = info[: -len(note)].removesuffix("; ") or None
                    sample.trainable = was
                    break
