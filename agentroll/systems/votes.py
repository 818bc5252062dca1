"""Majority vote and best of N over an execution's `solver` samples: the figures of a system that samples several
solvers per execution (three-stage; a `Vocabulary` to extend), against which the rest of the system earns its
cost. A system with one solver per execution does not report them: they would repeat the solver's accuracy. A
solver that goes on over several turns (tool use) is one sample: its last turn (`answers`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import ClassVar

from ..record.parsing import last_boxed
from ..record.schema import Sample
from .vocabulary import Figure, Vocabulary, accuracy

MAJORITY_VOTE = Figure("majority_vote_accuracy", "majority vote", "majority_correct", needs="majority_votes")
BEST_OF_N = Figure("best_of_n_accuracy", "best of N", "best_of_n_correct")
SOLVER_FIGURES = (accuracy("solver"), MAJORITY_VOTE, BEST_OF_N)


def answers(samples: list[Sample], stage: str = "solver") -> list[Sample]:
    """The samples of `stage` that end their conversation within the stage: not continued by a later turn of
    the same stage (a tool-use conversation's last turn; every sample of a one-call stage). One per answer, so a
    conversation of many turns counts once."""
    continued = {s.continues for s in samples if s.stage == stage and s.continues is not None}
    return [s for at, s in enumerate(samples) if s.stage == stage and at not in continued]


def majority(solvers: list[Sample]) -> bool | None:
    """Does the most common boxed answer among the solvers score 1? Ties go to the answer seen first. None: no
    solver boxed an answer (code, free text): there was nothing to vote on."""
    votes: Counter[str] = Counter()
    reward_of: dict[str, float] = {}
    for s in solvers:
        answer = last_boxed(s.content) if s.content else None
        if answer is not None:
            key = " ".join(answer.split())
            votes[key] += 1
            reward_of.setdefault(key, s.raw_reward)
    return reward_of[votes.most_common(1)[0][0]] == 1.0 if votes else None


class Votes(Vocabulary):
    """The solver stage's accuracy, majority vote (executions with no boxed answer count as wrong; "-" when no
    execution had one) and best of N (some solver right), each over the executions."""

    figures: ClassVar[tuple[Figure, ...]] = SOLVER_FIGURES

    def tally(self, samples: list[Sample]) -> Mapping[str, float]:
        solvers = answers(samples)
        vote = majority(solvers)
        return {
            "majority_votes": vote is not None,
            "majority_correct": vote is True,
            "best_of_n_correct": any(s.raw_reward == 1.0 for s in solvers),
        }
