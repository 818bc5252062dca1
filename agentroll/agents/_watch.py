"""The agents' watchdog: kills what agent programs left running when agentroll ends, however it ends. Run by path,
never imported by agentroll (only the standard library, so it starts in milliseconds):

    python -I -S -B _watch.py

`launch.Watchdog` starts one per run, in a session of its own, and tells it on its standard input, a line each,
`+PGID` when an agent program's process group starts and `-PGID` once agentroll has killed and reaped it. When
that input ends (agentroll exited, or was killed outright: the kernel closes its end of the pipe even on kill -9)
or a SIGTERM comes (PR_SET_PDEATHSIG, set when it starts), it kills every group still listed, then exits. An
agent's own process dies with agentroll by PR_SET_PDEATHSIG; what it started does not, and would otherwise
outlive the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> None:
    groups: set[int] = set()

    def end(*_: object) -> None:
        for group in list(groups):
            with contextlib.suppress(OSError):  # already gone
                os.killpg(group, signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is agentroll's to handle: it stops its agents itself
    for line in sys.stdin.buffer:
        sign, group = line[:1], line[1:].strip()
        if not group.isdigit() or int(group) <= 1:
            continue
        if sign == b"+":
            groups.add(int(group))
        elif sign == b"-":
            groups.discard(int(group))
    end()


if __name__ == "__main__":
    main()
