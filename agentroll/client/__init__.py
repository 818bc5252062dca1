"""The vLLM client: token-exact calls over a transport, with priority slots, retries and endpoint health."""

from .adaptive import follow_metrics
from .core import FATAL_STATUS, RETRYABLE_STATUS, CallFailed, CompletionClient, error_message
from .endpoints import Endpoint, normalize_base_url
from .probes import detect_api, detect_priority
from .settings import ClientSettings, Concurrency, Health, Retries, Timeouts
from .slots import FIRST, Budget, ClientCounters, Priority
from .transport import AiohttpTransport, FunctionTransport, Transport, TransportFailure

__all__ = [
    "FATAL_STATUS",
    "FIRST",
    "RETRYABLE_STATUS",
    "AiohttpTransport",
    "Budget",
    "CallFailed",
    "ClientCounters",
    "ClientSettings",
    "CompletionClient",
    "Concurrency",
    "Endpoint",
    "FunctionTransport",
    "Health",
    "Priority",
    "Retries",
    "Timeouts",
    "Transport",
    "TransportFailure",
    "detect_api",
    "detect_priority",
    "error_message",
    "follow_metrics",
    "normalize_base_url",
]
