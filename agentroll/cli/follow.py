"""`agentroll follow DIR`: a live run's groups as JSONL on stdout as they commit, for a reader in any language
(`read_groups(follow=True)` is the Python one), with its consumer position, backpressure and end rules."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from .console import folder_tool
from .folders import FOLDER, opt
from .help import Command


def register(app: typer.Typer) -> None:
    app.command(cls=Command)(follow)


def follow(
    folder: Annotated[Path, FOLDER],
    consumer: Annotated[
        str | None,
        opt(
            "--consumer",
            help="A durable position (.agentroll/consumers/NAME): a rerun starts after the groups it took, and "
            "generate --consumer NAME --max-ahead G waits for it.",
            metavar="NAME",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        opt("--timeout", help="Give up after this many seconds without the run completing (exit 8).", metavar="S"),
    ] = None,
) -> None:
    """Print a live run's groups as JSONL on stdout as they commit, one line each, until the run completes."""
    from ..errors import IncompleteRun, PipeClosed
    from ..folder import read_groups

    stdout = sys.stdout.buffer
    drained = _pipe_drained(stdout) if consumer is not None else None

    def stream() -> bool:
        """True when the reader closed the pipe."""
        try:
            for group in read_groups(folder, follow=True, timeout_s=timeout, consumer=consumer):
                records = b",".join(orjson.dumps(s) for samples in group.executions for s in samples)
                # the write blocks while the reader is behind; the next group is asked for (and, with a consumer,
                # this one counts as taken) once this one is written, and into a pipe once its reader has read it
                stdout.write(b'{"problem_id":%s,"records":[%s]}\n' % (orjson.dumps(group.problem_id), records))
                stdout.flush()
                if drained is not None:
                    drained()
        except TimeoutError:
            raise IncompleteRun(f"{folder}: the run did not complete within --timeout {timeout:g}s") from None
        except BrokenPipeError:  # the reader (head, a loader) is gone: nothing more to say to it, nor to flush
            os.dup2(os.open(os.devnull, os.O_WRONLY), stdout.fileno())
            return True
        return False

    if folder_tool(stream):
        raise typer.Exit(PipeClosed.exit_code)  # as SIGPIPE would end it, and as generate -o - does


def _pipe_drained(stream: Any) -> Callable[[], None] | None:
    """For a pipe: a wait until its reader has read everything written (the bytes still in it, FIONREAD, are 0),
    so a consumer's position never counts a group left unread in the pipe when its reader exits. None for a file
    or a terminal (what is written there is taken)."""
    import fcntl
    import select
    import stat
    import struct
    import termios

    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (OSError, ValueError, AttributeError):
        return None

    gone = select.poll()
    gone.register(fd, select.POLLERR | select.POLLHUP)

    def wait() -> None:
        while True:
            try:
                unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                return
            if unread <= 0:
                return
            if gone.poll(0):  # the reader closed its end with bytes unread: as a write would find it
                raise BrokenPipeError
            time.sleep(0.005)  # the reader's pace: nothing to wake us when it reads

    return wait
