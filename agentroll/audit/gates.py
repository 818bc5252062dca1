"""What decides an audit besides its records' figures: the run's tokenizer and chat template against the model's,
first-turn prompts the template check could not re-render, shards that are no longer what the manifest says,
records that do not say how they were sampled, and how much of the audit compared anything at all.

A folder fault (`{"kind", "message"}`) fails the audit as a record fault fails its record; a warning does not.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..context import provenance
from ..errors import UsageError
from ..folder import Manifest, shard_files
from .report import Figures

CHUNK = 1 << 20
SAMPLING = ("temperature", "top_p", "top_k", "min_p")  # what a record's `sampling` says of its distribution


def fault(kind: str, message: str) -> dict[str, str]:
    return {"kind": kind, "message": message}


def run_provenance(manifest: Manifest, tokenizer: Any, accept_template: bool) -> tuple[list[str], list[dict[str, str]]]:
    """(warnings, folder faults) from the hashes each run recorded in `servers[]`. Another tokenizer is a warning
    (the vocabulary check and the logprobs speak for it). Another chat template is a fault unless accepted: its
    prompts were rendered by that template, which text recovered from them cannot tell (a default system prompt
    the run's template injected re-renders as the same text)."""
    servers = manifest.servers
    warnings: list[str] = []
    faults: list[dict[str, str]] = []
    theirs = provenance.tokenizer_sha256(tokenizer)
    if any(s.get("tokenizer_sha256") not in (None, theirs) for s in servers):
        warnings.append("the model's tokenizer is not the run's (tokenizer_sha256 differs from the manifest's)")
    ours = provenance.chat_template_sha256(tokenizer)
    other = [i for i, s in enumerate(servers) if s.get("chat_template_sha256") not in (None, ours)]
    if other:
        which = ", ".join(f"servers[{i}]" for i in other)
        message = (
            f"the run's chat template is not the model's: chat_template_sha256 of the manifest's {which} differs "
            "from the model's tokenizer's, so its prompts were rendered by another template"
        )
        if accept_template:
            warnings.append(f"{message} (accepted: --accept-chat-template)")
        else:
            faults.append(fault("template", f"{message} (pass --accept-chat-template if that is intended)"))
    return warnings, faults


def unrendered(templates: dict[str, dict[str, int]], accept: bool) -> tuple[list[str], list[dict[str, str]]]:
    """First-turn prompts the template check could not re-render were not checked: a fault unless accepted."""
    n = sum(t["unrecoverable"] for t in templates.values())
    if not n:
        return [], []
    message = (
        f"{n} first-turn prompt{'s' if n != 1 else ''} could not be re-rendered with the model's chat template "
        "(not one user message and an optional system message under it: a row's own conversation, or another "
        "template), so their ids were not checked"
    )
    if accept:
        return [f"{message} (accepted: --accept-unrendered)"], []
    return [], [fault("unrendered", f"{message}; pass --accept-unrendered to accept that, or --no-template-check")]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def edited_shards(folder: str | os.PathLike[str], manifest: Manifest) -> list[str]:
    """A warning per shard (or routes sidecar) whose size or sha256 is not the manifest's: changed after the run
    wrote it. The audit reads the records as they are now; `agentroll validate` says which line changed."""
    out = []
    for shard in shard_files(folder, manifest):
        entry = shard.entry
        pairs = [(shard.path, entry.bytes, entry.sha256)]
        if shard.routes is not None and entry.routes is not None:
            pairs.append((shard.routes, entry.routes.bytes, entry.routes.sha256))
        for path, size, digest in pairs:
            try:
                differs = (
                    "size and sha256" if path.stat().st_size != size else "sha256" if _sha256(path) != digest else ""
                )
            except OSError:
                continue  # reading the records says what is missing
            if differs:
                out.append(
                    f"{path.name}: its {differs} differ from the manifest's: it was changed after the run wrote it "
                    f"(agentroll validate {folder} says where); audited as it is now"
                )
    return out


def describe(sampling: dict[str, Any]) -> str:
    return ", ".join(f"{k} {sampling[k]}" for k in SAMPLING if k in sampling) or "nothing"


def sampling_fallback(settings: dict[str, Any]) -> dict[str, Any]:
    """What a record without its own `sampling` (folders of schema 2 and before) was sampled with: the run's."""
    return {
        k: v for k, v in (settings.get("sampling") or {}).items() if k in ("temperature", "top_p", "top_k", "min_p")
    }


def fallback_warning(records: int, fallback: dict[str, Any]) -> str:
    if fallback:
        return (
            f"{records} records have no sampling of their own (a folder of schema 2 or before): the run's "
            f"settings.sampling was used ({describe(fallback)})"
        )
    return (
        f"{records} records have no sampling of their own (a folder of schema 2 or before) and the manifest has "
        "no settings.sampling: temperature 1 without filters was assumed"
    )


def coverage(overall: Figures, failed: bool) -> str | None:
    """A warning when most response tokens of the audited records were not compared. Raises `UsageError` when
    none was and nothing failed: passing an audit that compared nothing would say the folder is fine."""
    skipped = sum(overall.skipped.values())
    total = overall.tokens + skipped + overall.outside
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(overall.skipped.items(), key=lambda kv: -kv[1]))
    if overall.tokens == 0 and not failed:
        detail = (
            f"{total} response tokens of {overall.records} records, none compared ({why})"
            if total
            else (f"the {overall.records} audited records have no response tokens")
        )
        raise UsageError(f"nothing could be compared: {detail}")
    if skipped * 2 > total:
        return (
            f"most tokens were not compared: {overall.tokens} of {total} response tokens compared; not compared: {why}"
        )
    return None
