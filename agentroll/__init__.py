"""agentroll: rewarded, token-exact multi-agent rollouts from a vLLM server, for offline RL.

`Generator` is the library a trainer embeds (docs/api.md); `agentroll generate` is built on it. `System` and
`Context` are how a user writes an agent system of their own (docs/systems.md).
"""

from .concurrency import gather_or_cancel
from .context import Context
from .errors import (
    AgentrollError,
    IncompleteRun,
    InputError,
    OutputError,
    RewardError,
    ServerError,
    TooManyFailures,
    UsageError,
)
from .folder import read_groups, read_records
from .generator import Generator
from .group import Group
from .options import GenerateOptions
from .rescoring import rescore
from .schema import Sample
from .systems import System

__version__ = "0.1.0"

__all__ = [
    "AgentrollError",
    "Context",
    "GenerateOptions",
    "Generator",
    "Group",
    "IncompleteRun",
    "InputError",
    "OutputError",
    "RewardError",
    "Sample",
    "ServerError",
    "System",
    "TooManyFailures",
    "UsageError",
    "__version__",
    "gather_or_cancel",
    "read_groups",
    "read_records",
    "rescore",
]
