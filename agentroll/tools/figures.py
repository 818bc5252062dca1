"""What `agentroll report` draws, as data: `stats`'s figures plus what a table cannot show, from one read.

The system's figures, pass@k and the --by split are `agentroll.tools.report.sections`' own (fed the same
groups as they stream by), so the page and `agentroll stats` never disagree. Added here: each stage's response
lengths with the truncated ones apart, its mean shaped reward, the calls' speed over the run, the shards'
finish times, and the system's own charts (its vocabulary's `charts`: three-stage's selector against the best
of its candidates), evaluated over the same counters.

Records carry no timestamps, so "throughput over the run" is what the folder does know, each labelled as what
it is: per call, response tokens over `latency_s` (the speed one request saw, retries included) and the latency,
in the order the groups were written; for the folder, the records on disk over time from the shard files'
modification times (one point per shard: a folder that was copied shows the copy's times); for the last run,
its `wall_s` and request count from the manifest. A folder derived from another (`agentroll rescore`:
`settings.derived_from`) generated nothing: it has no throughput, and says where it came from.
"""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Formatter
from typing import Any

from ..record.group import Group
from ..record.stats import RunStats
from ..systems.vocabulary import Chart
from .report import folder_sections, folder_state

MOST_POINTS = 100  # points of the over-the-run lines: groups are pooled into this many windows at most


@dataclass(slots=True)
class StageLengths:
    lengths: array = field(default_factory=lambda: array("I"))
    truncated: array = field(default_factory=lambda: array("B"))
    reward_sum: float = 0.0

    def add(self, tokens: int, truncated: bool, reward: float) -> None:
        self.lengths.append(tokens)
        self.truncated.append(truncated)
        self.reward_sum += reward

    def histogram(self, top: int | None) -> dict[str, Any]:
        """Response lengths in bins of a round width from 0 to the longest (or `top`, max_tokens), counted apart
        for completed and truncated samples."""
        edges = length_bins(self.lengths, top)
        width = edges[1] - edges[0]
        completed, truncated = [0] * (len(edges) - 1), [0] * (len(edges) - 1)
        for tokens, cut in zip(self.lengths, self.truncated, strict=True):
            (truncated if cut else completed)[min(int(tokens // width), len(edges) - 2)] += 1
        n = len(self.lengths)
        return {
            "edges": edges,
            "completed": completed,
            "truncated": truncated,
            "max_tokens": top,
            "samples": n,
            "truncated_samples": sum(truncated),
            "mean": sum(self.lengths) / n if n else None,
            "longest": max(self.lengths, default=0),
        }


def length_bins(lengths: Iterable[int], top: int | None, count: int = 24) -> list[float]:
    """Bin edges from 0 past the longest response (or `top` when it is the larger), about `count` bins of a
    round width (1, 2 or 5 times a power of ten)."""
    longest = max(max(lengths, default=0), top or 0, 1)
    raw = longest / count
    power = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    width = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [float(i * width) for i in range(longest // width + 2)]


def chart(spec: Chart, run: RunStats, policy: str | None = None) -> dict[str, Any]:
    """A system's chart (`Vocabulary.charts`) as data: its bars and counts over the run's counters, the
    counters its caption names, and `missing` (what to say instead) while the counter it needs is 0. `policy`:
    a head-to-head folder's, whose own executions `run` counts (one chart per policy: none pools them)."""
    named = {field for _, field, _, _ in Formatter().parse(spec.caption) if field}
    applies = spec.needs is None or bool(run.value(spec.needs))
    return {
        "name": spec.name if policy is None else f"{spec.name}-{policy}",
        "title": spec.title if policy is None else f"{spec.title} · policy {policy}",
        "caption": spec.caption,
        "values": {name: run.value(name) for name in sorted(named)},
        "bars": [{"key": f.key, "label": f.label, "value": run.figure(f)} for f in spec.bars],
        "counts": [{"label": label, "value": run.value(counter)} for label, counter in spec.counts],
        "missing": None if applies else spec.missing or f"{spec.needs} is 0: nothing to draw",
    }


@dataclass(slots=True)
class Collector:
    """Watches groups go by (`watch`) and keeps what the page needs beyond `stats`."""

    stages: dict[tuple[str, str | None], StageLengths] = field(default_factory=dict)  # per (stage, policy)
    group_calls: array = field(default_factory=lambda: array("d"))
    group_tokens: array = field(default_factory=lambda: array("d"))
    group_latency: array = field(default_factory=lambda: array("d"))

    def watch(self, groups: Iterable[Group]) -> Iterator[Group]:
        for group in groups:
            self.add(group)
            yield group

    def add(self, group: Group) -> None:
        calls = tokens = latency = 0.0
        for samples in group.executions:
            for s in samples:
                key = (s.stage, s.policy)
                stage = self.stages.get(key) or self.stages.setdefault(key, StageLengths())
                stage.add(len(s.response_token_ids), s.status == "truncated", s.reward)
                calls += 1
                tokens += len(s.response_token_ids)
                latency += s.latency_s
        self.group_calls.append(calls)
        self.group_tokens.append(tokens)
        self.group_latency.append(latency)

    def speed(self) -> list[dict[str, float]]:
        """The groups in write order, pooled into at most `MOST_POINTS` windows: per window, the groups written by
        its end, response tokens per second of call time, and the mean call latency."""
        count = len(self.group_calls)
        size = max(1, math.ceil(count / MOST_POINTS))
        out = []
        for start in range(0, count, size):
            end = min(count, start + size)
            calls = sum(self.group_calls[start:end])
            latency = sum(self.group_latency[start:end])
            tokens = sum(self.group_tokens[start:end])
            out.append(
                {
                    "groups": float(end),
                    "tokens_per_s": tokens / latency if latency else 0.0,
                    "latency_s": latency / calls if calls else 0.0,
                }
            )
        return out


def shard_times(folder: Path, manifest: dict[str, Any]) -> list[dict[str, float]]:
    """(seconds after the first shard was finished, records on disk then), one point per finished shard, ordered
    by when each was finished (`finished_at` in the manifest, else the file's modification time), so parallel
    partitions of a merged folder interleave correctly."""
    from ..folder import shard_paths

    try:
        paths = shard_paths(folder)
    except Exception:  # a damaged manifest: the reader has already said so
        return []
    entries = [s if isinstance(s, dict) else {} for s in manifest.get("shards", [])]
    points = []
    for path, entry in zip(paths, entries, strict=False):
        finished = entry.get("finished_at")  # the writer's clock; older folders: the file's modification time
        try:
            when = float(finished) if isinstance(finished, int | float) else os.stat(path).st_mtime
            points.append((when, int(entry.get("records") or 0)))
        except (OSError, TypeError, ValueError):
            return []
    points.sort()
    out, total = [], 0
    for mtime, count in points:
        total += count
        out.append({"s": mtime - points[0][0], "records": float(total)})
    return out


def _obj(value: Any) -> dict[str, Any]:
    """A manifest's object, or {} where it holds something else (validate reports that; the page goes on)."""
    return value if isinstance(value, dict) else {}


def max_tokens(manifest: dict[str, Any], stage: str) -> int | None:
    """The stage's --max-tokens (a --stage setting, else the run's), for the length charts' marker."""
    settings = _obj(manifest.get("settings"))
    per_stage = _obj(_obj(settings.get("stage_settings")).get(stage))
    value = per_stage.get("max_tokens", settings.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def figures(folder: str | os.PathLike[str], by: str | None = None) -> dict[str, Any]:
    """Everything the page shows, as data (see the module's docstring): `stats` (what `agentroll stats` gives),
    `lengths` (a head-to-head folder's per `stage-policy`), `shaped_reward` (a head-to-head folder's None: its
    `shaped_reward_by_policy`), `speed`, `shard_times`, `charts` (the system's), `last_run`, `derived_from`,
    `manifest`."""
    from ..folder import load_manifest, read_groups

    path = Path(folder)
    loaded = load_manifest(path)
    manifest = loaded.to_dict()
    collector = Collector()
    found = folder_sections(loaded, collector.watch(read_groups(path)), by)
    data = {"folder": str(folder), **folder_state(loaded), **found.to_dict()}
    stages = data["system"]["stages"]
    # a head-to-head folder's lengths and shaped rewards are each policy's (`stage-policy`), never pooled
    policies: list[str | None] = [*found.whole.policies] or [None]
    lengths = {
        name if policy is None else f"{name}-{policy}": collector.stages[name, policy].histogram(
            max_tokens(manifest, name)
        )
        for name in stages
        for policy in policies
        if (name, policy) in collector.stages
    }

    def shaped(policy: str | None) -> dict[str, float | None]:
        found = {name: collector.stages.get((name, policy)) for name in stages}
        return {name: c.reward_sum / len(c.lengths) if c and len(c.lengths) else None for name, c in found.items()}

    last = _obj(manifest.get("last_run"))
    return {
        "stats": data,
        "lengths": lengths,
        "shaped_reward": shaped(None) if policies == [None] else dict.fromkeys(stages),
        **({} if policies == [None] else {"shaped_reward_by_policy": {str(p): shaped(p) for p in policies}}),
        "speed": collector.speed(),
        "shard_times": shard_times(path, manifest),
        "charts": [
            chart(spec, section.run, policy)
            for spec in found.words.charts
            for policy, section in (found.whole.policies.items() or [(None, found.whole)])  # never pooled
        ],
        "derived_from": _obj(manifest.get("settings")).get("derived_from"),
        "last_run": {
            "wall_s": last.get("wall_s"),
            "requests": _obj(last.get("requests")).get("requests"),
            "records": _obj(last.get("stats")).get("records_written"),
            "stages": _obj(_obj(last.get("stats")).get("stages")),
        },
        "manifest": {
            key: manifest.get(key)
            for key in ("complete", "records", "groups", "executions", "schema_version", "merged_from")
        },
    }
