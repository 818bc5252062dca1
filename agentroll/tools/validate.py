"""`agentroll validate DIR`: does a folder hold what the writer promises, byte for byte and record for record?

The shards are read here, line by line, not through `agentroll.folder`'s readers (which stop at the first
damage and share the writer's notion of a group): every fault is named by its shard and 1-based line, and one
fault does not hide the next. Faults are listed shard by shard in manifest order, a shard's line faults by line
before its whole-file ones (size, sha256, counts, keys), so the first fault points at a line when one can.

What is checked, and where (each module says the details):

- the manifest: readable, our format and schema version, counts that add up, no shard listed twice; its
  system (`settings.system`; a folder without one is three-stage): a name, its stage names, per-stage
  settings only for those stages (here and `tools.system`);
- each shard (`tools.shards`): present, its byte size and sha256 as the manifest says, whole lines; a
  compressed one (`.jsonl.zst`) decompresses, its frames holding whole groups; its counts and keys file
  (a resume trusts a readable one) against what it holds;
- each record (`tools.records`): exactly the fields of `agentroll.record.schema.Sample`, each of its JSON type;
  values the writer can write (a stage of the system, status, 0/1 masks, schema_version); aligned lengths;
- conversations (`tools.conversations`): a record that `continues` another continues an earlier record of
  its execution by one turn, token for token, its history mask and logprobs exactly that record's tokens;
- executions and groups (`tools.executions`): `rollout_size` consecutive records of one rollout, stages in
  the system's order, one `final_reward`; `group_size` executions of one problem, sample indexes 0..K-1,
  group figures that describe exactly those executions, no problem twice in the folder;
- the system's own checks (its vocabulary's `check`, `agentroll.systems.vocabulary`), on each whole
  execution of well-formed records: e.g. three-stage's selector earns the raw reward of the rewrite it
  picked, single writes one record, critique-revise's outcome is the reviser's. A system that cannot be
  loaded here (a FILE.py not found) is a warning: its own checks are left out;
- routed experts (`tools.sidecars`): each reference within its shard's sidecar, each blob a `.npy` integer
  array of one dtype and shape per record, the sidecar's size and sha256 as the manifest says.

A merged folder (`agentroll merge`) is checked the same way, its shard paths taken relative to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from ..folder import raw as folder_files
from ..folder.layout import MANIFEST, Layout
from ..folder.manifest import unfinished
from ..record.schema import SCHEMA_VERSION
from .faults import MAX_FAULTS, Fault, ValidationReport
from .records import FIELDS, record_faults
from .shards import read_shard
from .system import system_fault, system_of, words

__all__ = ["FIELDS", "MAX_FAULTS", "Fault", "ValidationReport", "record_faults", "validate"]


def _integer(v: Any) -> int | None:
    return v if type(v) is int else None


# -- the folder ------------------------------------------------------------------------------------------------

_ENTRY_FIELDS = {"file": str, "records": int, "executions": int, "groups": int, "bytes": int, "sha256": str}


def _load_manifest(folder: Path, report: ValidationReport) -> dict[str, Any] | None:
    """The manifest as a dict, checked by `Manifest` as every other folder tool checks it (one fault, and no
    further checks, where they would refuse it); a schema other than this agentroll's is one more fault."""
    from ..errors import OutputError
    from ..folder.manifest import Manifest, in_the_way

    path = folder / MANIFEST
    try:
        data = folder_files.manifest_bytes(folder)
    except NotADirectoryError:
        report.add(Fault("manifest", f"{folder} is a file, not a folder: give the output folder that holds {MANIFEST}"))
        return None
    except FileNotFoundError:
        report.add(Fault("manifest", f"no {MANIFEST} in {folder}: not an agentroll output folder"))
        return None
    except IsADirectoryError:
        report.add(Fault("manifest", str(in_the_way(path))))
        return None
    except OSError as exc:
        report.add(Fault("manifest", f"cannot read {path}: {exc.strerror or exc}"))
        return None
    try:
        Manifest.parse(data, path)
    except OutputError as exc:
        report.add(Fault("manifest", str(exc)))
        return None
    manifest: dict[str, Any] = orjson.loads(data)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        report.add(
            Fault(
                "manifest", f"schema_version {manifest.get('schema_version')!r}, this agentroll reads {SCHEMA_VERSION}"
            )
        )
    return manifest


def validate(folder: str | Path) -> ValidationReport:
    """Check an output folder (or a merged one) against its manifest and the record schema; never raises for
    what is in the folder: every problem is a `Fault` in the report."""
    folder = Path(folder)
    report = ValidationReport(folder=str(folder))
    manifest = _load_manifest(folder, report)
    if manifest is None:
        return report
    report.merged = bool(manifest.get("merged_from"))
    wrong = system_fault(manifest)
    if wrong is not None:
        report.add(Fault("manifest", wrong))
    system = system_of(manifest)
    vocabulary, unloaded = words(system, warn=False)
    if unloaded is not None:
        report.warnings.append(unloaded)
    settings = manifest.get("settings")
    k_setting = _integer(settings.get("samples_per_prompt")) if isinstance(settings, dict) else None
    named = settings.get("policies") if isinstance(settings, dict) else None  # a head-to-head run's, in order
    policies = tuple(str(p.get("name")) for p in named if isinstance(p, dict)) if isinstance(named, list) else ()
    if k_setting is not None and policies:  # a head-to-head run: K per policy
        k_setting *= len(policies)
    entries: list[dict[str, Any]] = []
    listed: set[str] = set()
    for i, entry in enumerate(manifest["shards"]):
        bad = [k for k, t in _ENTRY_FIELDS.items() if not isinstance(entry, dict) or type(entry.get(k)) is not t]
        if bad:
            report.add(Fault("manifest", f"shard entry {i} lacks a valid {', '.join(bad)}"))
        elif entry["file"] in listed:
            report.add(Fault("manifest", f"shard {entry['file']} is listed twice"))
        else:
            listed.add(entry["file"])
            side = entry.get("routes")
            if side is not None and not (
                isinstance(side, dict)
                and type(side.get("file")) is str
                and type(side.get("bytes")) is int
                and type(side.get("sha256")) is str
            ):
                report.add(
                    Fault("manifest", f"shard {entry['file']}: its routes entry lacks a valid file, bytes or sha256")
                )
                entry = {**entry, "routes": None}
            entries.append(entry)
    for what in ("records", "executions", "groups"):
        total = sum(e[what] for e in entries)
        if manifest.get(what) != total:
            report.add(Fault("count", f"the manifest says {manifest.get(what)!r} {what}, its shards add up to {total}"))
    note = unfinished(manifest.get("complete"), manifest.get("last_run"))
    if note:
        report.warnings.append(note)
    layout = Layout(folder)
    on_disk = {p.name for p in layout.finished()}
    for stray in sorted(on_disk - {Path(e["file"]).name for e in entries if Path(e["file"]).parent == Path(".")}):
        report.warnings.append(f"{stray} is in the folder but not in the manifest (a rerun adopts it)")
    sidecars = {e["routes"]["file"] for e in entries if isinstance(e.get("routes"), dict)}
    for stray in sorted({p.name for p in layout.sidecars()} - sidecars):
        report.warnings.append(f"{stray} is a routes sidecar in the folder but not in the manifest")
    for partial in layout.partials():
        report.warnings.append(
            f"{partial.name} is a shard being written, or left by a killed run (a rerun finishes it)"
        )
    for temporary in layout.strays():
        report.warnings.append(f"{temporary.name} is a temporary file left by a stopped run (a rerun removes it)")
    seen: dict[str, str] = {}
    for entry in entries:
        report.shards += 1
        try:
            read_shard(folder, entry, k_setting, seen, report, system, vocabulary, policies)
        except OSError as exc:  # unreadable (permissions, I/O error): a fault like a missing shard
            report.add(Fault("missing", f"cannot read {folder / entry['file']}: {exc.strerror or exc}", entry["file"]))
    return report
