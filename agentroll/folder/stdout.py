"""`-o -`: groups as JSONL on standard output, for a pipe into a loader. There is no folder: no resume.

While the run writes records there, standard output belongs to them alone: a `print()` in a user's reward or
system (or a library's chatter on fd 1) goes to stderr instead, so the stream stays JSONL line for line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from ..errors import OutputError, PipeClosed, UsageError
from ..record.group import Group


class StdoutWriter:
    """Each group's records go out contiguously; a closed pipe ends the run (exit 141, like SIGPIPE)."""

    def __init__(self) -> None:
        self.run_info: dict[str, Any] = {}
        self.server: dict[str, Any] = {}
        self._out: IO[bytes] | None = None
        self._saved: tuple[Any, int | None] | None = None  # sys.stdout and a copy of fd 1, put back at close
        self._broken = False

    def open(self, check: Callable[[dict[str, str]], None] | None = None) -> dict[str, str]:
        """Take standard output for the records: fd 1 is copied for them, and both fd 1 and `sys.stdout` point at
        stderr until `close`. Nothing is done already (`check`, for a folder's writer, has nothing to see)."""
        stdout = sys.stdout
        try:
            real = stdout.fileno() == 1
        except (AttributeError, OSError, ValueError):  # an in-process runner's stream: no descriptor to move
            real = False
        if real:
            stdout.flush()
            records, kept = os.dup(1), os.dup(1)
            os.dup2(2, 1)
            self._out = os.fdopen(records, "wb")
            self._saved = (stdout, kept)
        else:
            self._out = stdout.buffer
            self._saved = (stdout, None)
        sys.stdout = sys.stderr
        return {}

    def commit(self, group: Group) -> None:
        if group.status != "complete":
            return
        if any(s.routed_experts is not None for samples in group.executions for s in samples):
            raise UsageError(
                "routed experts cannot be streamed to stdout (-o -): they go to a sidecar file beside "
                "each shard; write to a folder"
            )
        out = self._out if self._out is not None else sys.stdout.buffer
        try:
            out.write(group.encode())
            out.flush()
        except BrokenPipeError:
            self._quiet()  # the consumer (head, a loader) is gone: nothing more to say to it
            raise PipeClosed("stdout was closed by its reader") from None
        except OSError as exc:  # disk full behind a redirect, a closed terminal...
            self._quiet()  # nothing half-flushed at exit
            raise OutputError(f"cannot write to stdout: {exc.strerror or exc}") from exc

    def _quiet(self) -> None:
        """Point the records' descriptor at /dev/null so that exiting flushes nothing into a dead pipe."""
        out, self._broken = self._out, True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if out is not None:
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())

    def close(self, complete: bool) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self._out is not None:
                self._out.flush()
        if self._saved is None:
            return
        stdout, kept = self._saved
        self._saved = None
        if kept is not None:
            with contextlib.suppress(OSError, ValueError):
                if self._out is not None:
                    self._out.close()
            if self._broken:  # the reader is gone: exiting must flush nothing into its pipe
                os.dup2(os.open(os.devnull, os.O_WRONLY), kept)
            os.dup2(kept, 1)
            os.close(kept)
        sys.stdout = stdout
        self._out = None
