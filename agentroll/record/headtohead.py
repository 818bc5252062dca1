"""Head to head: which policy of a `--policy` run is better, problem by problem, and how sure that is.

Per problem, each policy's mean `final_reward` over its K executions (the same K prompts' worth of tries for
every policy); for each pair of policies (a, b, in the run's order) a problem is a win for a when a's mean is
higher, a tie when equal, a loss when lower. The table counts them, gives the mean difference of the means
(a - b: with 0/1 rewards and equal K, the difference in accuracy), and says how sure both are by a paired
bootstrap over problems: the problems are drawn again with replacement (both policies' results of a drawn
problem go together, which is what makes it paired), `resamples` times, and the 2.5th and 97.5th percentiles
of each figure over the draws are its 95 % interval. The verdict names a policy only when the interval of the
mean difference leaves 0 out and at least 6 problems differ (`decisive`: on fewer the bootstrap is surer than a
sign test could be); one problem has no interval.

Deterministic: the draws come from `numpy.random.default_rng(seed)` over the problems ordered by a hash of
their ids, so a folder gives the same intervals however its groups were ordered (resumed, merged, `--ray`).

`Comparison` is an accumulator that adds up like the rest of `RunStats`: it keeps each problem's means (for the
intervals) and, after a round trip through a manifest's counters, only the counts (which still add up; the
intervals then need the records: `agentroll stats`).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentroll.record.schema import Sample

TIE = 1e-9  # two means this close are a tie (float sums of the same rewards in another order)
RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


def policy_means(executions: Iterable[Sequence[Sample]]) -> dict[str, float]:
    """Each policy's mean `final_reward` over its executions of one problem (policies in first-seen order)."""
    sums: dict[str, list[float]] = {}
    for samples in executions:
        if samples and samples[0].policy is not None:
            sums.setdefault(samples[0].policy, []).append(samples[0].final_reward)
    return {name: math.fsum(values) / len(values) for name, values in sums.items()}


def problem_key(problem_id: str) -> int:
    """A stable 63-bit key of a problem id: the bootstrap's order, independent of the order groups came in."""
    return int.from_bytes(hashlib.blake2b(problem_id.encode(), digest_size=8).digest(), "big") >> 1


@dataclass(slots=True)
class Tally:
    """One pair's counts: problems, a's wins, ties, a's losses, and the sum of a - b over the problems."""

    problems: int = 0
    wins: int = 0
    ties: int = 0
    losses: int = 0
    difference_sum: float = 0.0

    def add(self, difference: float) -> None:
        self.problems += 1
        self.difference_sum += difference
        if abs(difference) <= TIE:
            self.ties += 1
        elif difference > 0:
            self.wins += 1
        else:
            self.losses += 1

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(getattr(self, k) + getattr(other, k) for k in self.__slots__))


@dataclass(slots=True)
class Comparison:
    """The problems seen so far, each policy's mean on each (`add`), and the table over them (`table`)."""

    policies: list[str] = field(default_factory=list)
    keys: array = field(default_factory=lambda: array("q"))
    means: dict[str, array] = field(default_factory=dict)  # per policy, aligned with `keys` (nan: not run)
    counted: dict[tuple[str, str], Tally] = field(default_factory=dict)  # counts without problems (from a dict)
    uniform: int = 0  # of the problems, those only known as uniform groups filtered out (`add_uniform`)

    def add(self, problem_id: str, means: Mapping[str, float]) -> None:
        for name in means:
            if name not in self.means:
                self.policies.append(name)
                self.means[name] = array("d", [math.nan] * len(self.keys))
        self.keys.append(problem_key(problem_id))
        for name, column in self.means.items():
            column.append(means.get(name, math.nan))

    def add_uniform(self, count: int) -> None:
        """`count` problems known only as filtered out by `--filter-uniform-groups` (a folder keeps no record of
        them): every execution of every policy ended alike, so each is a tie, a difference of exactly 0."""
        for i in range(count):
            self.add(f"\x00uniform {i}", dict.fromkeys(self.policies, 0.0))
        self.uniform += count

    def add_group(self, problem_id: str, executions: Iterable[Sequence[Sample]]) -> None:
        means = policy_means(executions)
        if means:
            self.add(problem_id, means)

    def __bool__(self) -> bool:
        return bool(self.policies)

    def pairs(self) -> list[tuple[str, str]]:
        return [(a, b) for i, a in enumerate(self.policies) for b in self.policies[i + 1 :]]

    def _differences(self, a: str, b: str) -> tuple[list[int], list[float]]:
        found = [
            (key, x - y)
            for key, x, y in zip(self.keys, self.means[a], self.means[b], strict=True)
            if not (math.isnan(x) or math.isnan(y))
        ]
        found.sort()
        return [k for k, _ in found], [d for _, d in found]

    def tallies(self) -> dict[tuple[str, str], Tally]:
        out: dict[tuple[str, str], Tally] = {}
        for a, b in self.pairs():
            tally = Tally()
            if a in self.means and b in self.means:
                for difference in self._differences(a, b)[1]:
                    tally.add(difference)
            out[(a, b)] = tally + self.counted.get((a, b), Tally())
        return out

    def table(self, resamples: int = RESAMPLES, seed: int = SEED, level: float = LEVEL) -> dict[str, Any]:
        """Every pair's row (see the module's docstring), and the bootstrap's settings."""
        rows = []
        for (a, b), tally in self.tallies().items():
            n = tally.problems
            row: dict[str, Any] = {
                "a": a,
                "b": b,
                "problems": n,
                "wins": tally.wins,
                "ties": tally.ties,
                "losses": tally.losses,
                "win_rate": tally.wins / n if n else None,
                "tie_rate": tally.ties / n if n else None,
                "loss_rate": tally.losses / n if n else None,
                "mean_difference": tally.difference_sum / n if n else None,
                "net_win_rate": (tally.wins - tally.losses) / n if n else None,
                "mean_difference_ci": None,
                "net_win_rate_ci": None,
                "a_better_share": None,
            }
            if n > 1 and (a, b) not in self.counted and a in self.means and b in self.means:
                row.update(bootstrap(self._differences(a, b)[1], resamples, seed, level))
            row["verdict"] = verdict(row, level)
            rows.append(row)
        return {
            "policies": list(self.policies),
            "pairs": rows,
            "bootstrap": {"resamples": resamples, "seed": seed, "level": level, "over": "problems"},
            "filtered_ties": self.uniform,
        }

    def to_dict(self) -> dict[str, Any]:
        """The counts (what adds up through a manifest: no problem is kept)."""
        return {
            "policies": list(self.policies),
            "pairs": [{"a": a, "b": b, **_tally_dict(t)} for (a, b), t in self.tallies().items()],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Comparison:
        out = cls()
        if not isinstance(data, dict):
            return out
        out.policies = [str(p) for p in data.get("policies") or [] if isinstance(p, str)]
        for row in data.get("pairs") or []:
            named = isinstance(row, dict) and isinstance(row.get("a"), str) and isinstance(row.get("b"), str)
            if named and all(_number(row.get(k)) for k in Tally.__slots__):
                out.counted[(row["a"], row["b"])] = Tally(
                    int(row["problems"]), int(row["wins"]), int(row["ties"]), int(row["losses"]), row["difference_sum"]
                )
        return out

    def __add__(self, other: Comparison) -> Comparison:
        total = Comparison()
        for part in (self, other):
            for name in part.policies:
                if name not in total.policies:
                    total.policies.append(name)
        names = total.policies
        for part in (self, other):
            missing = array("d", [math.nan] * len(part.keys))
            total.keys.extend(part.keys)
            for name in names:
                total.means.setdefault(name, array("d")).extend(part.means.get(name, missing))
            for pair, tally in part.counted.items():
                total.counted[pair] = total.counted.get(pair, Tally()) + tally
            total.uniform += part.uniform
        return total


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tally_dict(tally: Tally) -> dict[str, Any]:
    return {k: getattr(tally, k) for k in Tally.__slots__}


def bootstrap(differences: Sequence[float], resamples: int, seed: int, level: float) -> dict[str, Any]:
    """The paired bootstrap over problems of the mean difference and of the net win rate: their intervals at
    `level`, and the share of draws in which a's mean is the higher."""
    import numpy as np

    d = np.asarray(differences, dtype=np.float64)
    signs = np.where(np.abs(d) <= TIE, 0.0, np.sign(d))
    n = len(d)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(resamples, 2_000_000 // n))
    means, nets = [], []
    for start in range(0, resamples, chunk):
        draw = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        means.append(d[draw].mean(axis=1))
        nets.append(signs[draw].mean(axis=1))
    mean_draws, net_draws = np.concatenate(means), np.concatenate(nets)
    tail = (1 - level) / 2
    return {
        "mean_difference_ci": [float(x) for x in np.quantile(mean_draws, [tail, 1 - tail])],
        "net_win_rate_ci": [float(x) for x in np.quantile(net_draws, [tail, 1 - tail])],
        "a_better_share": float(np.mean(mean_draws > TIE)),
    }


def decisive(level: float) -> int:
    """Problems that must differ (wins plus losses) before a verdict: the fewest whose clean sweep a two-sided
    sign test would call no chance at `level` (6 at 95 %). Below that the percentile bootstrap still leaves 0 out
    of its interval whenever every problem that differs went one way (4 problems, 3 wins: [+0.5, +1.0]), which
    says nothing on so few."""
    return math.floor(math.log2(2 / (1 - level))) + 1


def verdict(row: Mapping[str, Any], level: float = LEVEL) -> str:
    """`a`'s name or `b`'s when the interval of the mean difference leaves 0 out (by more than float noise, `TIE`)
    and enough problems differ (`decisive`); else what can be said."""
    ci, n = row.get("mean_difference_ci"), row.get("problems") or 0
    if not n:
        return "no problems"
    if ci is None:
        return (
            f"too few problems for an interval ({n})"
            if n < 2
            else "no interval (counts only: run agentroll stats on the folder)"
        )
    better = row["a"] if ci[0] > TIE else row["b"] if ci[1] < -TIE else None
    if better is None:
        return "no clear difference"
    differ, needed = row["wins"] + row["losses"], decisive(level)
    if differ < needed:
        return f"too few problems that differ ({differ}) for a verdict: {needed} at least"
    return f"{better} better"
