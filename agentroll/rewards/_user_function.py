"""A worker process for a user's sync reward function: loads it, then scores one request (or one batch) a line.

Run by path (`python .../_user_function.py SPEC SYS_PATH_JSON PARENT_PID`) with agentroll's own `sys.path`, so
the function is imported as agentroll imported it: a file by its path, a module by its name. A call that hangs
costs only this process, which agentroll kills at `--reward-timeout` and replaces (`_pool.py`). It dies with
agentroll, whatever killed that (`_worker.die_with_parent`).

Protocol, one line each way:
  parent -> worker  the request's fields as a JSON object, a list of them for a batched function, or `null`
                    (are you ready)
  worker -> parent  `R` once the function is loaded (or `E"why"` and exit 1), then per line `["ok", RESULT]` with
                    RESULT `[value, info, failed]` or a list of them, `["raised", "Type: message"]` (the function
                    raised: that sample scores 0) or `["stop", "message"]` (it returned something that is not a
                    reward: the run stops, as in agentroll's own process); `["ready"]` for `null`
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    spec, path, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    del sys.path[0]  # this folder, put first as the script's: its modules (code, base...) must shadow nothing
    import orjson

    sys.path[:] = orjson.loads(path)
    from agentroll.rewards._worker import die_with_parent

    die_with_parent(parent)
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole process group; the parent decides
    replies = os.fdopen(os.dup(1), "wb", buffering=0)  # the function's prints go to stderr, not into the replies
    os.dup2(2, 1)
    try:
        from agentroll.errors import RewardError
        from agentroll.rewards.base import RewardRequest
        from agentroll.rewards.function import as_result, load_function

        function = load_function(spec)
    except BaseException as exc:
        replies.write(b"E" + orjson.dumps(f"{type(exc).__name__}: {exc}"[:500]) + b"\n")
        sys.exit(1)
    replies.write(b"R\n")
    for line in sys.stdin.buffer:  # ends at EOF: the parent closed the pipe or is gone
        given = orjson.loads(line)
        if given is None:
            replies.write(b'["ready"]\n')
            continue
        try:
            if isinstance(given, list):
                values = function([RewardRequest(**fields) for fields in given])
                if not isinstance(values, list | tuple) or len(values) != len(given):
                    raise RewardError(f"batched reward {spec!r} must return one value per request")
                results = [as_result(v, spec) for v in values]
                reply: list[object] = ["ok", [[r.value, r.info, r.failed] for r in results]]
            else:
                result = as_result(function(RewardRequest(**given)), spec)
                reply = ["ok", [result.value, result.info, result.failed]]
        except RewardError as exc:
            reply = ["stop", str(exc)]
        except BaseException as exc:  # SystemExit too: a function that exits has failed this call
            reply = ["raised", f"{type(exc).__name__}: {exc}"[:300]]
        replies.write(orjson.dumps(reply) + b"\n")


if __name__ == "__main__":
    # Run by path, Python put this folder first on sys.path; it is replaced by agentroll's own in `main`.
    main()
