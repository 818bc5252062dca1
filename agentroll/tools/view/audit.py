"""What `agentroll audit` found, for the records it names: `view DIR --audit audit.json`.

The audit keeps nothing in the folder: its result is the report it prints (`audit --json`), which names the
records out of tolerance (`failed`) and those of largest |recorded - recomputed| (`worst`, `--worst N` of each),
each with its figures and its worst token (position, recorded and recomputed logprob). So the page can mark
those records and that token, and no other: the recomputed logprob of every token is not kept anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ...errors import UsageError

KEY = ("rollout_id", "stage", "worker", "turn")  # how the audit names a record (its `identity` has these)
KEPT = ("tokens", "mean_abs", "max_abs", "share_over", "tokens_outside", "worst_token", "faults", "fails")


class Audit:
    """The audit report's named records, by record."""

    def __init__(self, path: Path) -> None:
        try:
            report = orjson.loads(path.read_bytes())
        except OSError as exc:
            raise UsageError(f"--audit {path}: cannot read it ({exc.strerror or exc})") from exc
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"--audit {path}: not JSON ({exc}); write it with agentroll audit DIR --json") from exc
        if not isinstance(report, dict) or not isinstance(report.get("worst"), list):
            raise UsageError(f"--audit {path}: not the report of agentroll audit --json (no 'worst' list)")
        self.path = path
        self.records: dict[tuple[Any, ...], dict[str, Any]] = {}
        for verdict in ("worst", "failed"):  # a failed record's entry wins: it says why
            for entry in report.get(verdict) or []:
                if isinstance(entry, dict):
                    found = {name: entry.get(name) for name in KEPT}
                    self.records[self._key(entry)] = {
                        **found,
                        "failed": verdict == "failed" or bool(entry.get("fails")),
                    }
        self.summary = {
            "file": str(path),
            "model": report.get("model"),
            "ok": report.get("ok"),
            "tolerance": report.get("tolerance"),
            "records": (report.get("overall") or {}).get("records"),
            "named": len(self.records),
        }

    @staticmethod
    def _key(record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(record.get(name) for name in KEY)

    def of(self, record: dict[str, Any]) -> dict[str, Any] | None:
        return self.records.get(self._key(record))

    def count(self, records: list[dict[str, Any]]) -> tuple[int, int]:
        """(records of these the audit names, of them out of tolerance)."""
        found = [self.of(r) for r in records]
        named = [f for f in found if f is not None]
        return len(named), sum(bool(f["failed"]) for f in named)
