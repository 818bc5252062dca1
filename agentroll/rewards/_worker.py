"""A math-check worker process: reads one check a line on stdin, answers one line on stdout.

Run by path (`python .../_worker.py PARENT_PID`), not with `-m`, so it does not import the agentroll package
(the whole client, half a second) to check two numbers. It dies with the process that started it, whatever
killed that: `PR_SET_PDEATHSIG` on Linux (a watcher thread elsewhere), and it also exits at the end of its input.

Protocol, one line each way, one check at a time:
  parent -> worker  `["label", "answer", inner_timeout_s]` (JSON)
  worker -> parent  `R` once ready (or `E"why"` and exit 1 if it cannot set up), then per check `1` (equal),
                    `0` (not equal) or `E"why"` (it raised)

`AGENTROLL_MATH_CHECK=module:function` puts another check in math-verify's place; tests use it to hang or crash
a worker on purpose.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


_GOLD: dict[str, list[object]] = {}  # labels parsed once per worker: a problem's many answers share one label


def math_equal(label: str, answer: str, timeout_s: int) -> bool:
    """math-verify's verdict on two LaTeX values. It runs in the worker's main thread, where math-verify's own
    signal-based timeouts work."""
    from math_verify import parse, verify

    gold = _GOLD.get(label)
    if gold is None:
        gold = parse(f"${label}$", parsing_timeout=timeout_s)
        if gold:  # an empty parse may be a timeout under load: tried again next time
            if len(_GOLD) >= 4096:
                _GOLD.clear()
            _GOLD[label] = gold
    pred = parse(f"${answer}$", parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` when the parent goes, then make sure it has not gone already (the parent may
    have died before the prctl call, and then no signal comes). Elsewhere than Linux, a thread polls."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            _watch_parent(parent_pid)
    else:
        _watch_parent(parent_pid)
    if os.getppid() != parent_pid:
        os._exit(0)


def _watch_parent(parent_pid: int) -> None:
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def load_check() -> Callable[[str, str, int], bool]:
    spec = os.environ.get("AGENTROLL_MATH_CHECK")
    if not spec:
        math_equal("1", "1", 1)  # warm up: math-verify builds its parsers on first use, not on import
        return math_equal
    import importlib

    module, _, name = spec.partition(":")
    check: Callable[[str, str, int], bool] = getattr(importlib.import_module(module), name)
    return check


def main() -> None:
    die_with_parent(int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole process group; the parent decides
    # Replies go to a private copy of stdout; fd 1 becomes stderr, so a library's print cannot corrupt them.
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    checks = sys.stdin.buffer
    import orjson

    try:
        check = load_check()
    except BaseException as exc:  # the parent says why in one line: no traceback of ours before it
        replies.write(b"E" + orjson.dumps(f"{type(exc).__name__}: {exc}"[:300]) + b"\n")
        sys.exit(1)
    replies.write(b"R\n")
    for line in checks:  # ends at EOF: the parent closed the pipe or is gone
        label, answer, timeout_s = orjson.loads(line)
        try:
            reply = b"1\n" if check(label, answer, timeout_s) else b"0\n"
        except Exception as exc:
            reply = b"E" + orjson.dumps(f"{type(exc).__name__}: {exc}"[:300]) + b"\n"
        replies.write(reply)


if __name__ == "__main__":
    # Run by path, Python put this folder first on sys.path; its modules (base, remote, ...) must not shadow others.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    main()
