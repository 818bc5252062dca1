"""agentroll: rewarded, token-exact multi-agent rollouts from a vLLM server, for offline RL.

`Generator` is the library a trainer embeds (docs/api.md); `agentroll generate` is built on it.
"""

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
from .generator import Generator
from .group import Group
from .options import GenerateOptions
from .readers import read_groups, read_records
from .schema import Sample

__version__ = "0.1.0"

__all__ = [
    "AgentrollError",
    "GenerateOptions",
    "Generator",
    "Group",
    "IncompleteRun",
    "InputError",
    "OutputError",
    "RewardError",
    "Sample",
    "ServerError",
    "TooManyFailures",
    "UsageError",
    "__version__",
    "read_groups",
    "read_records",
]
