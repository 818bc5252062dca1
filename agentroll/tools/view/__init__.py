"""`agentroll view DIR`: every rollout of a folder on a page, token by token (docs/view.md).

`index` lists the folder's groups (a follower: new groups appear while a run writes them), `rows` and
`detail` say what the page shows of a group in its system's words, `tokens` decodes ids with the run's
tokenizer, `audit` reads what `agentroll audit --json` found, `server` serves the page on loopback, `static`
writes it as one file, `page` is the page itself (its script `view*.js` and style `view.css`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...errors import OutputError, UsageError
from .audit import Audit
from .index import Index
from .tokens import Decoder

log = logging.getLogger("agentroll")


def open_folder(
    folder: str | os.PathLike[str],
    tokenizer: str | None = None,
    audit: str | os.PathLike[str] | None = None,
    follow: bool = True,
) -> Index:
    """The index of a folder (not started), with the tokenizer (`--tokenizer`, else the run's) and the audit."""
    from ...folder import load_manifest
    from ...folder.layout import MANIFEST

    path = Path(folder)
    if path.is_file():
        raise OutputError(f"{path} is a file, not a folder: give the output folder that holds {MANIFEST}")
    if not path.is_dir():
        raise OutputError(f"{path}: no such folder")
    named = tokenizer
    if named is None:
        try:
            named = load_manifest(path).settings.get("tokenizer")
        except OutputError:
            named = None  # no manifest yet (a run about to start): the index waits for it
    found = Audit(Path(audit)) if audit is not None else None
    return Index(path, Decoder(str(named) if named else None), found, follow=follow)


def serve(index: Index, host: str, port: int, ready: Callable[[str], Any]) -> None:
    """Serve the page until Ctrl-C or SIGTERM (then return: the viewer's normal end)."""
    from .server import ViewServer, loopback

    if not loopback(host):
        log.warning("serving on %s: anyone who can reach this machine's port can read the folder", host)
    server = ViewServer(index, host, port)
    index.start()
    index.decoder.start()
    url = server.start()
    stop = threading.Event()
    before = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        ready(url)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, before)
        server.stop()


def write(index: Index, output: str | os.PathLike[str], sample: int | None = None, seed: int = 0) -> dict[str, Any]:
    from .static import write_page

    if index.follow:
        raise UsageError("a page written once reads the folder once: open the folder without follow")
    return write_page(index, output, sample, seed)


__all__ = ["Index", "open_folder", "serve", "write"]
