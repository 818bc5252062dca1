"""`agentroll merge`: join the output folders of a split job (`--partition I/N`) into one dataset.

By default the merged manifest points at the shards where they are (paths relative to the merged folder), so
nothing is copied; `--copy` copies them in under fresh names. Either way the settings must match (all but the
partition) and no problem may appear in two folders. A shard's routes sidecar goes with it: pointed at, or
copied under the name that goes with the shard's new one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson

from .errors import OutputError
from .readers import load_manifest
from .shards import is_zstd, routes_name, scan_groups, shard_name
from .writer import MANIFEST, STATE_DIR, _atomic_write, _file_sha256, changed_settings


def _load(folder: Path) -> dict[str, Any]:
    manifest = load_manifest(folder)
    if manifest.get("merged_from"):
        raise OutputError(f"{folder} is itself a merged folder: merge the folders it was made from "
                          f"({', '.join(str(m.get('folder')) for m in manifest['merged_from'])})")
    return manifest


def _problem_ids(folder: Path, manifest: dict[str, Any]) -> set[str]:
    """The problems a folder holds: from its keys files, or from the shards themselves when the keys were not
    copied along (`cp`, `gsutil` and rsync often skip dot-folders)."""
    ids: set[str] = set()
    for shard in manifest["shards"]:
        keys = folder / STATE_DIR / "keys" / (Path(shard["file"]).name.split(".")[0] + ".keys")
        try:
            ids.update(str(pid) for pid, _ in orjson.loads(keys.read_bytes()))
        except (OSError, orjson.JSONDecodeError, TypeError, ValueError):
            try:
                data = (folder / shard["file"]).read_bytes()
            except OSError as exc:
                raise OutputError(f"{folder / shard['file']}: {exc.strerror or exc}") from exc
            kept, _, _, found = scan_groups(data, is_zstd(shard["file"]))
            if kept != len(data):
                raise OutputError(f"{folder / shard['file']} is damaged after byte {kept} (not whole groups)") from None
            ids.update(pid for pid, _ in found)
    filtered = folder / STATE_DIR / "filtered.jsonl"
    if filtered.exists():
        for line in filtered.read_bytes().splitlines():
            try:
                ids.add(str(orjson.loads(line)["problem_id"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a line torn by a crash: the writer ignores it too
    return ids


def merge(inputs: list[Path], output: Path, copy: bool = False, verify: bool = False) -> dict[str, Any]:
    """Write `output/manifest.json` joining `inputs`; return it. Any OS error is one `OutputError` line."""
    try:
        return _merge(inputs, output, copy, verify)
    except OSError as exc:
        raise OutputError(f"merge: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": ")) from exc


def _merge(inputs: list[Path], output: Path, copy: bool, verify: bool) -> dict[str, Any]:
    if not inputs:
        raise OutputError("merge needs at least one output folder")
    target = output.resolve()
    for folder in inputs:
        if Path(folder).resolve() == target:
            raise OutputError(f"-o {output} is one of the folders to merge; write the merged view to a new folder")
    manifests = [(Path(folder), _load(Path(folder))) for folder in inputs]
    common = {k: v for k, v in manifests[0][1]["settings"].items() if k != "partition"}
    owner: dict[str, Path] = {}
    for folder, manifest in manifests:
        settings = {k: v for k, v in manifest["settings"].items() if k != "partition"}
        if settings != common:
            changed = [name for name, _, _ in changed_settings(settings, common)]
            raise OutputError(f"{folder} was made with other settings than {manifests[0][0]} ({', '.join(changed)})")
        for pid in _problem_ids(folder, manifest):
            if pid in owner:
                raise OutputError(f"problem {pid!r} is in both {owner[pid]} and {folder}")
            owner[pid] = folder
    output.mkdir(parents=True, exist_ok=True)
    if (output / MANIFEST).exists() or any(output.glob("rollouts-*")):
        raise OutputError(f"{output} already holds rollouts or a manifest; choose an empty folder")
    shards: list[dict[str, Any]] = []
    for folder, manifest in manifests:
        for shard in manifest["shards"]:
            source = folder / shard["file"]
            routes = shard.get("routes")
            side = folder / routes["file"] if isinstance(routes, dict) else None
            for path, info in ((source, shard), (side, routes)):
                if verify and path is not None and _file_sha256(path) != info["sha256"]:
                    raise OutputError(f"{path} does not match the sha256 in {folder / MANIFEST}")
            entry = dict(shard)
            if copy:
                target = output / shard_name(len(shards), "zstd" if is_zstd(source) else "none")
                shutil.copyfile(source, target)
                entry["file"] = target.name
                if side is not None:
                    shutil.copyfile(side, output / routes_name(target.name))
                    entry["routes"] = {**routes, "file": routes_name(target.name)}
            else:
                entry["file"] = os.path.relpath(source.resolve(), output.resolve())
                if side is not None:
                    entry["routes"] = {**routes, "file": os.path.relpath(side.resolve(), output.resolve())}
            entry["from"] = str(folder)
            shards.append(entry)
    servers = [x for _, m in manifests for x in m.get("servers") or [] if isinstance(x, dict)]
    merged = {
        "format": "agentroll.rollouts",
        "schema_version": manifests[0][1]["schema_version"],
        "complete": all(m.get("complete") for _, m in manifests),
        "records": sum(s["records"] for s in shards),
        "executions": sum(s["executions"] for s in shards),
        "groups": sum(s.get("groups", 0) for s in shards),
        "filtered_groups": sum(m.get("filtered_groups", 0) for _, m in manifests),
        "shards": shards,
        "settings": {**common, "partition": None},
        "servers": [x for i, x in enumerate(servers) if x not in servers[:i]],
        "merged_from": [{"folder": str(f), "partition": m["settings"].get("partition"),
                         "complete": m.get("complete")} for f, m in manifests],
    }
    _atomic_write(output / MANIFEST, orjson.dumps(merged, option=orjson.OPT_INDENT_2))
    return merged
