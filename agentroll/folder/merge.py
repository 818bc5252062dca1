"""`agentroll merge`: join the output folders of a split job (`--partition I/N`, `--ray`) into one dataset.

By default the merged manifest points at the shards where they are (paths relative to the merged folder), so
nothing is copied; `--copy` copies them in under fresh names. Either way the settings must match (all but the
partition) and no problem may appear in two folders. A shard's routes sidecar goes with it. Every part's shard
is checked (there, of its size, with `--verify` of its sha256) before anything is written; `--overwrite`
replaces an earlier merge only then. The parts' run figures add up into the merged `last_run`. A part whose run
did not complete is refused unless allowed; the merged manifest then says which one (`merged_from[].complete`,
and `complete: false`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError
from ..record.stats import RunStats
from .files import file_sha256, prepare
from .keys import read_keys
from .layout import Layout, is_zstd, routes_name, shard_name
from .manifest import Manifest, RoutesEntry, ShardEntry, changed_settings, in_the_way
from .reader import shard_bytes
from .shards import scan_groups


def _load(folder: Path) -> Manifest:
    manifest = Manifest.load(folder)
    if manifest.merged_from is not None:
        raise OutputError(
            f"{folder} is itself a merged folder: merge the folders it was made from "
            f"({', '.join(str(m.get('folder')) for m in manifest.merged_from)})"
        )
    return manifest


def problem_ids(folder: Path, manifest: Manifest) -> set[str]:
    """The problems a folder holds: from its keys files, or from the shards themselves when the keys were not
    copied along (`cp`, `gsutil` and rsync often skip dot-folders)."""
    layout = Layout(folder)
    ids: set[str] = set()
    for shard in manifest.shards:
        keys = read_keys(layout.keys(shard.file))
        if keys is not None and len(keys) == shard.groups:
            ids.update(pid for pid, _ in keys)
        else:
            data = shard_bytes(folder / shard.file)
            kept, _, _, found = scan_groups(data, is_zstd(shard.file))
            if kept != len(data):
                raise OutputError(f"{folder / shard.file} is damaged after byte {kept} (not whole groups)") from None
            ids.update(pid for pid, _ in found)
    if layout.filtered.exists():
        for line in layout.filtered.read_bytes().splitlines():
            try:
                ids.add(str(orjson.loads(line)["problem_id"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a line torn by a crash: the writer ignores it too
    return ids


def add_numbers(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counters of several runs added key by key (nested dicts too); other values are left out."""
    total: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                total[key] = total.get(key, 0) + value
            elif isinstance(value, dict):
                total[key] = add_numbers([total.get(key, {}), value])
    return total


def merge(
    inputs: list[Path],
    output: Path,
    copy: bool = False,
    verify: bool = False,
    allow_incomplete: bool = False,
    overwrite: bool = False,
) -> Manifest:
    """Write `output/manifest.json` joining `inputs`; return it. Any OS error is one `OutputError` line."""
    try:
        return _merge([Path(f) for f in inputs], Path(output), copy, verify, allow_incomplete, overwrite)
    except OSError as exc:
        raise OutputError(f"merge: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": ")) from exc


def _check_output(output: Path, overwrite: bool) -> bool:
    """An empty folder (False), or with --overwrite one an earlier merge wrote (True: it is to be replaced, never
    a run's own rollouts). Nothing is removed here: the new parts are checked first."""
    layout = Layout(output)
    if layout.manifest.is_dir():
        raise in_the_way(layout.manifest)
    if not (layout.manifest.exists() or layout.ours()):
        return False
    if not overwrite:
        raise OutputError(
            f"{output} already holds rollouts or a manifest; choose an empty folder, or pass "
            "--overwrite to redo an earlier merge there"
        )
    try:
        earlier = Manifest.load(output) if layout.manifest.exists() else None
    except OutputError:
        earlier = None
    if earlier is None or earlier.merged_from is None:
        raise OutputError(f"{output} holds rollouts of a run, not a merge: --overwrite redoes only a merge")
    return True


def _remove_earlier(output: Path) -> None:
    layout = Layout(output)
    layout.manifest.unlink()  # first: no manifest outlives the copies it lists
    for path in layout.ours():  # the copies an earlier `merge --copy` made
        path.unlink()


def _check_part(folder: Path, shard: ShardEntry, verify: bool) -> None:
    """A part's shard (and sidecar) is there, of the size its entry says, and with `verify` of its sha256."""
    files = [(folder / shard.file, shard.bytes, shard.sha256)]
    if shard.routes is not None:
        files.append((folder / shard.routes.file, shard.routes.bytes, shard.routes.sha256))
    for path, size, digest in files:
        if not path.exists():
            raise OutputError(f"{path} is listed in {folder}'s manifest but is not there (moved away?)")
        if path.stat().st_size != size:
            raise OutputError(
                f"{path} is damaged: {path.stat().st_size} bytes where {Layout(folder).manifest} says {size}"
            )
        if verify and file_sha256(path) != digest:
            raise OutputError(f"{path} does not match the sha256 in {Layout(folder).manifest}")


def _merge(
    inputs: list[Path], output: Path, copy: bool, verify: bool, allow_incomplete: bool, overwrite: bool
) -> Manifest:
    if not inputs:
        raise OutputError("merge needs at least one output folder")
    target = output.resolve()
    for folder in inputs:
        if folder.resolve() == target:
            raise OutputError(f"-o {output} is one of the folders to merge; write the merged view to a new folder")
    manifests = [(folder, _load(folder)) for folder in inputs]
    unfinished = [str(f) for f, m in manifests if not m.complete]
    if unfinished and not allow_incomplete:
        raise OutputError(
            f"{', '.join(unfinished)}: its run did not complete (its groups are not all there): rerun "
            "it first, or pass --allow-incomplete"
        )
    common = {k: v for k, v in manifests[0][1].settings.items() if k != "partition"}
    owner: dict[str, Path] = {}
    for folder, manifest in manifests:
        settings = {k: v for k, v in manifest.settings.items() if k != "partition"}
        if settings != common:
            changed = [name for name, _, _ in changed_settings(settings, common)]
            raise OutputError(f"{folder} was made with other settings than {manifests[0][0]} ({', '.join(changed)})")
        for pid in problem_ids(folder, manifest):
            if pid in owner:
                raise OutputError(f"problem {pid!r} is in both {owner[pid]} and {folder}")
            owner[pid] = folder
    replace = _check_output(output, overwrite)
    for folder, manifest in manifests:
        for shard in manifest.shards:
            _check_part(folder, shard, verify)
    prepare(output)
    if replace:
        _remove_earlier(output)
    shards: list[ShardEntry] = []
    for folder, manifest in manifests:
        for shard in manifest.shards:
            shards.append(_place(folder, shard, output, len(shards), copy))
    servers = [x for _, m in manifests for x in m.servers]
    stats = [RunStats.from_dict(m.last_run["stats"]) for _, m in manifests if isinstance(m.last_run.get("stats"), dict)]
    requests = [m.last_run["requests"] for _, m in manifests if isinstance(m.last_run.get("requests"), dict)]
    identity = hashlib.blake2b("|".join(sorted(m.folder_id for _, m in manifests)).encode(), digest_size=16)
    merged = Manifest(
        settings={**common, "partition": None},
        shards=shards,
        complete=not unfinished,
        schema_version=manifests[0][1].schema_version,
        filtered_groups=sum(m.filtered_groups for _, m in manifests),
        servers=[x for i, x in enumerate(servers) if x not in servers[:i]],
        last_run={
            "stats": sum(stats[1:], stats[0]).to_dict() if stats else {},
            "requests": add_numbers(requests),
            "parts": len(manifests),
        },
        folder_id=identity.hexdigest(),  # the same parts merged again are the same dataset to a follower
        merged_from=[
            {"folder": str(f), "partition": m.settings.get("partition"), "complete": m.complete} for f, m in manifests
        ],
    )
    merged.save(output)
    return merged


def _place(folder: Path, shard: ShardEntry, output: Path, index: int, copy: bool) -> ShardEntry:
    """A part's (checked) shard as the merged manifest lists it: pointed at where it is, or copied in as shard
    `index`."""
    source = folder / shard.file
    side = folder / shard.routes.file if shard.routes is not None else None
    entry = ShardEntry(
        shard.file,
        shard.records,
        shard.executions,
        shard.groups,
        shard.bytes,
        shard.sha256,
        shard.routes,
        str(folder),
        shard.finished_at,
    )
    if copy:
        target = output / shard_name(index, "zstd" if is_zstd(source) else "none")
        shutil.copyfile(source, target)
        entry.file = target.name
        if side is not None and shard.routes is not None:
            shutil.copyfile(side, output / routes_name(target.name))
            entry.routes = RoutesEntry(routes_name(target.name), shard.routes.bytes, shard.routes.sha256)
    else:
        entry.file = os.path.relpath(source.resolve(), output.resolve())
        if side is not None and shard.routes is not None:
            entry.routes = RoutesEntry(
                os.path.relpath(side.resolve(), output.resolve()), shard.routes.bytes, shard.routes.sha256
            )
    return entry
