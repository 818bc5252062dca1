"""Errors that end a run, each with its exit code.

    AgentrollError            exit 1
    ├── UsageError            exit 2  bad flags or settings
    ├── InputError            exit 3  a bad prompt row (names file, line and field)
    ├── ServerError           exit 4  the server is unreachable, rejects the key or the model
    ├── RewardError           exit 5  the reward function cannot be set up
    ├── OutputError           exit 6  the output folder cannot be written or does not match
    ├── TooManyFailures       exit 7  more failed calls than --max-failures allows
    └── PipeClosed            exit 0  `-o -` and the reader closed the pipe: stop quietly

A failure of a single request is not an exception of this tree: it is counted in the
stats and the execution goes on, as the agent-system semantics say.
"""

from __future__ import annotations


class AgentrollError(Exception):
    exit_code = 1


class UsageError(AgentrollError):
    exit_code = 2


class InputError(AgentrollError):
    exit_code = 3

    def __init__(self, source: str, line: int, field: str | None, reason: str) -> None:
        self.source, self.line, self.field, self.reason = source, line, field, reason
        what = f", field '{field}'" if field else ""
        super().__init__(f"{source}:{line}: line {line}{what}: {reason}" if line > 0 else f"{source}: {reason}")


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


class PipeClosed(AgentrollError):
    exit_code = 0
