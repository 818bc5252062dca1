"""Errors that end a run, each with its exit code.

    AgentrollError            exit 1
    ├── UsageError            exit 2  bad flags or settings
    ├── InputError            exit 3  a bad prompt row (names file, line and field)
    ├── ServerError           exit 4  the server is unreachable, rejects the key or the model
    ├── RewardError           exit 5  the reward function cannot be set up
    ├── OutputError           exit 6  the output folder cannot be written or does not match
    ├── TooManyFailures       exit 7  more failed calls than --max-failures allows
    ├── IncompleteRun         exit 8  the input was read to its end, but some groups could not be produced
    ├── ClusterError          exit 9  --ray: the cluster is out of reach, or a partition's task was lost for good
    ├── AuditFailed           exit 10 `agentroll audit`: records out of tolerance, or with a fault (docs/audit.md)
    ├── PipeClosed            exit 141  `-o -` and the reader closed the pipe (as SIGPIPE would)
    └── RunEnded              a follower's (`read_groups(follow=True)`): the run it follows ended for good
                              without completing; `exit_code` is that run's

Signals: 130 (SIGINT), 143 (SIGTERM). Exit 0 means every problem read has its whole group on disk, or was
filtered or skipped as asked.

A failure of a single request is not an exception of this tree: its execution fails, its group is counted as
failed and left for a rerun, and the run goes on (ending with IncompleteRun).
"""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """An exception as one line: its message's first line, or its type when it says nothing."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words (a user wrote JSON, not Python): "an array", not "list"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


class AgentrollError(Exception):
    exit_code = 1


class UsageError(AgentrollError):
    exit_code = 2


class InputError(AgentrollError):
    exit_code = 3

    def __init__(self, source: str, line: int, field: str | None, reason: str) -> None:
        self.source, self.line, self.field, self.reason = source, line, field, reason
        what = f"field '{field}': " if field else ""
        where = f"{source}:{line}" if line > 0 else source  # FILE:LINE, as compilers and editors read it
        super().__init__(f"{where}: {what}{reason}")


class ServerError(AgentrollError):
    exit_code = 4

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status that caused it, when there was one


class RewardError(AgentrollError):
    exit_code = 5


class OutputError(AgentrollError):
    exit_code = 6


class TooManyFailures(AgentrollError):
    exit_code = 7


class IncompleteRun(AgentrollError):
    exit_code = 8


class ClusterError(AgentrollError):
    exit_code = 9


class AuditFailed(AgentrollError):
    exit_code = 10


class PipeClosed(AgentrollError):
    exit_code = 141


class RunEnded(AgentrollError):
    """`read_groups(follow=True)`: the run that writes the folder ended without completing (exit 8, 4, 7...), and
    no process is writing it now; `exit_code` is that run's exit code. A run stopped by a signal (130, 143) or
    killed is waited for: it is resumed, as a supervisor or a requeued job does."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
