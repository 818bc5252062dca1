"""Routed experts and sampling masks, for `validate`: each record's reference within its shard's sidecar, each
routes blob a `.npy` integer array of the right shape, each mask one kept set per response token holding its
sampled token, and the sidecar against its manifest entry (docs/routed-experts.md)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..folder import masks, routes
from ..folder import raw as folder_files


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


class Routes:
    """A shard's routes sidecar under check: each record's reference as the lines are read, then the file
    against its manifest entry (`info`; None: the shard has no sidecar)."""

    def __init__(self, folder: Path, info: dict[str, Any] | None, add: Callable[[int | None, str, str], None]):
        self.info, self.add = info, add
        self.fd: int | None = None
        self.size = self.end = self.whole = 0
        self.prompts: dict[routes.Span, tuple[int, str, tuple[int, ...]] | str] = {}  # decoded once per shard
        if info is not None:
            try:
                self.fd = folder_files.open_sidecar(folder / info["file"])
                self.size = os.fstat(self.fd).st_size
            except OSError as exc:
                add(None, "missing", f"routes sidecar {info['file']}: {exc.strerror or exc}")

    def __enter__(self) -> Routes:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _blob(self, name: str, span: routes.Span) -> tuple[int, str, tuple[int, ...]] | str:
        assert self.fd is not None
        got = self.prompts.get(span)
        if got is None:
            try:
                array = routes.decode(folder_files.pread(self.fd, span[1], span[0]))
                got = (array.shape[0], array.dtype.str, array.shape[1:])
            except ValueError as exc:
                got = str(exc)
            if name == "prompt":
                self.prompts[span] = got
        return got

    def record(self, line: int, record: dict[str, Any]) -> None:
        if record.get("sampling_mask") is not None:
            self.mask(line, record)
        ref = record.get("routed_experts")
        if ref is None:
            return
        try:
            parts = routes.spans(ref)
        except ValueError as exc:
            self.add(line, "routes", f"routed_experts: {exc}")
            return
        if self.info is None:
            self.add(line, "routes", "routed_experts references a sidecar, but the manifest lists none for this shard")
            return
        if self.fd is None:
            return  # the sidecar is missing: said once
        shapes = {}
        for name, span in parts.items():
            if span is None:
                continue
            if span[0] + span[1] > self.size:
                self.add(
                    line,
                    "routes",
                    f"routes {name} blob [{span[0]}, {span[1]}] ends past the sidecar's {self.size} bytes",
                )
                return
            self.end = max(self.end, span[0] + span[1])
            got = self._blob(name, span)
            if isinstance(got, str):
                self.add(line, "routes", f"routes {name} blob [{span[0]}, {span[1]}]: {got}")
                return
            shapes[name] = got
        if len({(dtype, tail) for _, dtype, tail in shapes.values()}) > 1:
            self.add(
                line,
                "routes",
                "routes parts differ in dtype or (layers, experts per token): "
                + ", ".join(f"{name} {dtype} {tail}" for name, (_, dtype, tail) in shapes.items()),
            )
            return
        prompt, response = record.get("prompt_token_ids"), record.get("response_token_ids")
        if not isinstance(prompt, list) or not isinstance(response, list):
            return  # a schema fault, already said
        expected = len(prompt) + len(response) - 1
        rows = sum(r for r, _, _ in shapes.values())
        if "rows" in shapes:
            self.whole += rows != expected  # stored whole, as the server sent it: a warning
        elif parts["prompt"] is None and prompt:
            self.add(line, "routes", f"routes prompt part is null, but the prompt has {len(prompt)} tokens")
        elif "prompt" in shapes and shapes["prompt"][0] != len(prompt):
            self.add(
                line, "routes", f"routes prompt part has {shapes['prompt'][0]} rows, the prompt {len(prompt)} tokens"
            )
        elif rows != expected:
            self.add(line, "routes", f"routes have {rows} rows once joined, where prompt + response - 1 is {expected}")

    def mask(self, line: int, record: dict[str, Any]) -> None:
        """A sampling mask: its blobs inside the sidecar, one kept set per response token, each holding the
        token sampled at that step."""
        try:
            parts = masks.spans(record["sampling_mask"])
        except ValueError as exc:
            self.add(line, "mask", f"sampling_mask: {exc}")
            return
        if self.info is None:
            self.add(line, "mask", "sampling_mask references a sidecar, but the manifest lists none for this shard")
            return
        if self.fd is None:
            return  # the sidecar is missing: said once
        for name, span in parts.items():
            if span[0] + span[1] > self.size:
                self.add(
                    line, "mask", f"sampling-mask {name} blob {list(span)} ends past the sidecar's {self.size} bytes"
                )
                return
            self.end = max(self.end, span[0] + span[1])
        fd = self.fd
        try:
            kept = masks.load(record["sampling_mask"], lambda offset, n: folder_files.pread(fd, n, offset))
        except ValueError as exc:
            self.add(line, "mask", f"sampling_mask: {exc}")
            return
        response = record.get("response_token_ids")
        if not isinstance(response, list):
            return  # a schema fault, already said
        if len(kept) != len(response):
            self.add(line, "mask", f"sampling_mask has {len(kept)} steps for {len(response)} response tokens")
            return
        at = masks.outside(kept, response)
        if at is not None:
            self.add(
                line,
                "mask",
                f"response token {at} (id {response[at]}) is not in its step's sampling mask "
                f"({len(kept[at])} ids kept): it was not sampled from that set",
            )

    def finish(self, shard: str, warnings: list[str]) -> None:
        if self.fd is None or self.info is None:
            return
        digest, offset = hashlib.sha256(), 0
        while block := folder_files.pread(self.fd, 1 << 20, offset):
            digest.update(block)
            offset += len(block)
        name = self.info["file"]
        if self.size != self.info["bytes"]:
            self.add(
                None, "bytes", f"routes sidecar {name}: {self.size} bytes where the manifest says {self.info['bytes']}"
            )
        if digest.hexdigest() != self.info["sha256"]:
            self.add(
                None,
                "sha256",
                f"routes sidecar {name}: sha256 {digest.hexdigest()} where the manifest says {self.info['sha256']}",
            )
        if self.end < self.size:
            warnings.append(f"{name}: {self.size - self.end} bytes after the last blob its records reference")
        if self.whole:
            warnings.append(
                f"{shard}: {_count(self.whole, 'record')} with routes of other than prompt + response - 1 "
                "rows (stored whole, as the server sent them)"
            )
