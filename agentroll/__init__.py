"""agentroll: rewarded, token-exact multi-agent rollouts from a vLLM server, for offline RL.

The CLI (`agentroll generate`) is the main surface; the names below are the library under it.
"""

from .errors import (
    AgentrollError,
    InputError,
    OutputError,
    RewardError,
    ServerError,
    TooManyFailures,
    UsageError,
)
from .runner import RunConfig, Runner, RunResult
from .schema import Sample

__version__ = "0.1.0"

__all__ = [
    "AgentrollError",
    "InputError",
    "OutputError",
    "RewardError",
    "RunConfig",
    "RunResult",
    "Runner",
    "Sample",
    "ServerError",
    "TooManyFailures",
    "UsageError",
    "__version__",
]
