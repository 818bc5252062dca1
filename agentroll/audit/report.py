"""The audit's figures, per stage and overall, each record's verdict, and the report (as data; cli prints it).

Per compared token, d = recorded - recomputed logprob of the sampled token (the server's value minus the
trainer's). The KL estimate is k3 = mean(exp(-d) - 1 + d), Schulman's low-variance estimator of KL(server ||
trainer) from tokens sampled from the server's distribution: never negative, unbiased when the recorded
logprobs are those of the distribution sampled from (processed logprobs, or plain sampling); k1 = mean(d) is
given too. `share_over` is the share of compared tokens with |d| above the tolerance's threshold.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from .logprobs import AMBIGUOUS, MASKED, OK, OUTSIDE, PENALTIES, UNCOMPARABLE
from .options import Tolerance
from .units import identity

SKIP_REASONS = {
    AMBIGUOUS: "ambiguous cut",
    UNCOMPARABLE: "greedy with top-k/top-p/min-p",
    PENALTIES: "penalties",
    MASKED: "outside the loss mask",
}
KL_ESTIMATOR = (
    "k3 = mean(exp(-d) - 1 + d), d = recorded - recomputed logprob of each compared sampled token: "
    "KL(server || trainer)"
)


@dataclass(slots=True)
class Figures:
    """Running sums over tokens and records (a folder is never held in memory)."""

    records: int = 0
    records_failed: int = 0
    tokens: int = 0
    sum_abs: float = 0.0
    max_abs: float = 0.0
    sum_d: float = 0.0
    sum_k3: float = 0.0
    over: int = 0
    outside: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def add(self, d: float, threshold: float) -> None:
        self.tokens += 1
        self.sum_abs += abs(d)
        self.max_abs = max(self.max_abs, abs(d))
        self.sum_d += d
        self.sum_k3 += math.expm1(-d) + d if d > -700 else math.inf
        self.over += abs(d) > threshold

    def merge(self, other: Figures) -> None:
        self.records += other.records
        self.records_failed += other.records_failed
        self.tokens += other.tokens
        self.sum_abs += other.sum_abs
        self.max_abs = max(self.max_abs, other.max_abs)
        self.sum_d += other.sum_d
        self.sum_k3 += other.sum_k3
        self.over += other.over
        self.outside += other.outside
        for reason, n in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n

    def mean_abs(self) -> float | None:
        return self.sum_abs / self.tokens if self.tokens else None

    def share_over(self) -> float | None:
        return self.over / self.tokens if self.tokens else None

    def to_dict(self) -> dict[str, Any]:
        n = self.tokens
        return {
            "records": self.records,
            "records_failed": self.records_failed,
            "tokens": n,
            "mean_abs": self.mean_abs(),
            "max_abs": self.max_abs if n else None,
            "kl_k3": self.sum_k3 / n if n else None,
            "kl_k1": self.sum_d / n if n else None,
            "share_over": self.share_over(),
            "tokens_over": self.over,
            "tokens_outside": self.outside,
            "tokens_skipped": dict(sorted(self.skipped.items())),
        }


@dataclass(slots=True)
class RecordResult:
    who: dict[str, Any]
    figures: Figures
    faults: list[tuple[str, str]]
    worst: dict[str, Any] | None  # the token of largest |d|
    reasons: list[str]  # why it fails; empty: within tolerance

    def to_dict(self) -> dict[str, Any]:
        f = self.figures
        return {
            **self.who,
            "tokens": f.tokens,
            "mean_abs": f.mean_abs(),
            "max_abs": f.max_abs if f.tokens else None,
            "share_over": f.share_over(),
            "tokens_outside": f.outside,
            "worst_token": self.worst,
            "faults": [{"kind": k, "message": m} for k, m in self.faults],
            "fails": self.reasons,
        }


def judge(figures: Figures, faults: list[tuple[str, str]], tolerance: Tolerance) -> list[str]:
    """Why a record fails (empty: it passes)."""
    reasons = [f"{kind}: {message}" for kind, message in faults]
    if figures.outside:
        reasons.append(f"{figures.outside} sampled tokens outside what its top-k/top-p/min-p keep")
    if figures.tokens:
        mean, share = figures.mean_abs() or 0.0, figures.share_over() or 0.0
        if figures.max_abs > tolerance.max_abs:
            reasons.append(f"max |Δ| {figures.max_abs:.3g} > {tolerance.max_abs:g}")
        if mean > tolerance.mean_abs:
            reasons.append(f"mean |Δ| {mean:.3g} > {tolerance.mean_abs:g}")
        if share > tolerance.share:
            reasons.append(f"{share:.1%} of tokens over {tolerance.threshold:g} > {tolerance.share:.1%}")
    return reasons


class Collector:
    """Folds each turn's result into its record's verdict, its stage's figures and the lists of worst records."""

    def __init__(self, tolerance: Tolerance, worst: int) -> None:
        self.tolerance, self.keep = tolerance, worst
        self.stages: dict[str, Figures] = {}
        self.faults: dict[str, int] = {}
        self.templates: dict[str, dict[str, int]] = {}
        self._worst: list[tuple[float, int, RecordResult]] = []  # min-heaps of the `keep` largest
        self._failed: list[tuple[tuple[int, float], int, RecordResult]] = []
        self._n = 0

    def template(self, stage: str, verdict: str) -> None:
        bucket = self.templates.setdefault(stage, {"match": 0, "mismatch": 0, "unrecoverable": 0})
        bucket[verdict] += 1

    def add(
        self,
        record: dict[str, Any],
        faults: list[tuple[str, str]],
        recorded: list[float] | None = None,
        recomputed: list[float] | None = None,
        codes: list[int] | None = None,
    ) -> RecordResult:
        """One audited record: its tokens (None: not compared, say for a fault that makes them meaningless)."""
        figures = Figures(records=1)
        worst = None
        for j, (a, b, code) in enumerate(zip(recorded or [], recomputed or [], codes or [], strict=True)):
            if code == OUTSIDE:
                figures.outside += 1
            elif code != OK:
                reason = SKIP_REASONS[code]
                figures.skipped[reason] = figures.skipped.get(reason, 0) + 1
            else:
                d = a - b
                if worst is None or abs(d) > abs(worst["delta"]):
                    worst = {
                        "position": j,
                        "token": record["response_token_ids"][j],
                        "recorded": a,
                        "recomputed": b,
                        "delta": d,
                    }
                figures.add(d if math.isfinite(d) else math.copysign(1e300, d), self.tolerance.threshold)
        reasons = judge(figures, faults, self.tolerance)
        figures.records_failed = int(bool(reasons))
        result = RecordResult(identity(record), figures, faults, worst, reasons)
        self.stages.setdefault(str(record.get("stage")), Figures()).merge(figures)
        for kind, _ in faults:
            self.faults[kind] = self.faults.get(kind, 0) + 1
        self._n += 1
        if figures.tokens:
            self._push(self._worst, figures.max_abs, result)
        if reasons:
            self._push(self._failed, (int(bool(faults or figures.outside)), figures.max_abs), result)
        return result

    def _push(self, heap: list[Any], key: Any, result: RecordResult) -> None:
        if self.keep == 0:
            return
        item = (key, -self._n, result)  # earlier records win ties
        if len(heap) < self.keep:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)

    def overall(self) -> Figures:
        total = Figures()
        for figures in self.stages.values():
            total.merge(figures)
        return total

    def worst(self) -> list[RecordResult]:
        return [r for *_, r in sorted(self._worst, key=lambda x: x[:2], reverse=True)]

    def failed(self) -> list[RecordResult]:
        return [r for *_, r in sorted(self._failed, key=lambda x: x[:2], reverse=True)]


def lines(report: dict[str, Any]) -> list[str]:
    """The report's verdict and lists, for a terminal (the stage table is drawn by the CLI)."""
    out = [
        f"{'teacher ' if report.get('against') == 'teacher' else ''}model {report['model']} ({report['dtype']} on "
        f"{report['device']}); logprobs mode "
        f"{report['logprobs_mode']} (from {report['logprobs_mode_source']}); tolerance {report['precision']}: "
        + ", ".join(f"{k} {v:g}" for k, v in report["tolerance"].items())
    ]
    out += [f"warning: {w}" for w in report["warnings"]]
    units = report["units"]
    out.append(
        f"audited {units['audited']} of {units['total']} conversations"
        + (f" (--sample {report['sample']}, seed {report['seed']}, stratified by stage)" if report["sample"] else "")
    )
    for stage, reasons in report["skipped_records"].items():
        out.append(f"not audited ({stage}): " + ", ".join(f"{n} {why}" for why, n in reasons.items()))
    for stage, t in report["templates"].items():
        out.append(
            f"chat template ({stage}): {t['match']} first-turn prompts match a fresh rendering, "
            f"{t['mismatch']} differ, {t['unrecoverable']} could not be re-rendered"
        )
    stages = list(report["stages"].items()) + ([("all", report["overall"])] if len(report["stages"]) > 1 else [])
    for stage, f in stages:
        if f["tokens_skipped"]:
            out.append(
                f"tokens not compared ({stage}): " + ", ".join(f"{n} {w}" for w, n in f["tokens_skipped"].items())
            )
    if report["faults"]:
        out.append("faults: " + ", ".join(f"{n} {kind}" for kind, n in report["faults"].items()))
    out += [f"fault ({f['kind']}): {f['message']}" for f in report["folder_faults"]]
    if report["failed"]:
        out.append(f"{report['overall']['records_failed']} records out of tolerance; the worst:")
        out += [f"  {_name(r)}: {'; '.join(r['fails'])}{_token(r)}" for r in report["failed"]]
    elif report["worst"]:
        out.append("largest differences (within tolerance):")
        out += [f"  {_name(r)}: max |Δ| {r['max_abs']:.3g}, mean |Δ| {r['mean_abs']:.3g}" for r in report["worst"]]
    overall = report["overall"]
    if report["ok"]:
        out.append(f"ok: {overall['records']} records, {overall['tokens']} tokens within tolerance")
    else:
        folder = report["folder_faults"]
        out.append(
            f"FAIL: {overall['records_failed']} of {overall['records']} records out of tolerance"
            + (
                f"; {len(folder)} folder fault{'s' if len(folder) > 1 else ''} ({', '.join(f['kind'] for f in folder)})"
                if folder
                else ""
            )
        )
    return out


def _token(r: dict[str, Any]) -> str:
    w = r.get("worst_token")
    if not w or abs(w["delta"]) == 0:
        return ""
    return (
        f" (worst: response token {w['position']}, id {w['token']}: recorded {w['recorded']:.6g}, "
        f"recomputed {w['recomputed']:.6g})"
    )


def _name(r: dict[str, Any]) -> str:
    return (
        f"problem {r['problem_id']} rollout {r['rollout_id']} {r['stage']} turn {r['turn']} worker {r['worker']} "
        f"sample {r['sample_index']}"
    )
