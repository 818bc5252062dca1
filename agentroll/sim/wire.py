"""vLLM 0.32's wire vocabulary: error bodies, request-validation errors, and the odd bodies a broken server sends.

Everything here is copied from what a real vLLM answers (the captures in docs/simulated-server.md), so that a
client tested against the simulator meets the same bytes it will meet in production.
"""

from __future__ import annotations

import re
from typing import Any

VLLM_VERSION = "0.32.0"
DEFAULT_MODEL = "agentroll-sim"
AUTH_GUARDED = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's --api-key middleware guards these prefixes
SCALE_OUT_DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."


def error_body(message: str, kind: str, code: int, param: str | None = None, legacy: bool = False) -> dict[str, Any]:
    """vLLM's error shape: nested since 0.10.1, flat (`"object": "error"`) before."""
    if legacy:
        return {"object": "error", "message": message, "type": kind, "param": param, "code": code}
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class HTTPFailure(Exception):
    """An answer other than 200, raised from deep inside request handling (a script may raise it too)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status, self.body = status, body


def bad_request(message: str, param: str | None = None) -> HTTPFailure:
    return HTTPFailure(400, error_body(message, "BadRequestError", 400, param))


def sanitize(message: str) -> str:
    """vLLM strips file paths from the messages it sends (a model path reads `<path>`)."""
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    return re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message).strip()


def _summary(value: Any) -> Any:
    """How vLLM's validation handler echoes an offending input: containers by size, long strings cut."""
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def validation_failure(errors: list[dict[str, Any]]) -> HTTPFailure:
    """FastAPI's request-validation errors as vLLM reports them: 400, type "Bad Request", one line per error.

    Each error is a pydantic error dict whose `loc` is a tuple; the message renders it joined with dots and the
    `input` summarised, and `param` is the first error's location.
    """
    rendered = []
    for err in errors[:10]:
        shown = {**err, "loc": ".".join(str(p) for p in err["loc"]), "input": _summary(err["input"])}
        rendered.append(f"  {shown}\n")
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(rendered)
    if len(errors) > 10:
        message += f"  ...and {len(errors) - 10} more {label}\n"
    param = ".".join(str(p) for p in errors[0]["loc"])
    return HTTPFailure(400, error_body(sanitize(message), "Bad Request", 400, param))


def json_invalid(exc_msg: str, pos: int) -> HTTPFailure:
    """A body that is not JSON: FastAPI reports the decoder's message and the character position."""
    return validation_failure(
        [
            {
                "type": "json_invalid",
                "loc": ("body", pos),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": exc_msg},
            }
        ]
    )


# What a load balancer, a proxy or a half-dead server answers with status 200: `malformed_rate` cycles these.
MALFORMED_HTML = (
    b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><center><h1>502 Bad "
    b"Gateway</h1></center><hr><center>nginx</center></body></html>\n"
)
MALFORMED_KINDS = ("html", "list", "no_choices")
