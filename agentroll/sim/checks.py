"""What vLLM checks before it schedules a request, with its own messages: the model's name, a completion's
`stop`, each prompt's ids, logprobs, max_tokens and the context; and `tools` as it hands them to a chat template
(`agentroll.render.chat.vllm_tools`, which the recording proxy of `--system agent` shares).

Apart from the engine because these are vLLM's refusals (a client is tested against each, message for message),
while the engine is what an accepted request makes.
"""

from __future__ import annotations

from typing import Any

from ..render.chat import vllm_tools
from .wire import HTTPFailure, bad_request, error_body, sanitize, validation_failure

__all__ = ["check_model", "check_prompt", "check_stop", "vllm_tools"]

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


def check_model(served: str, model: Any) -> None:
    """A request that names a model must name the served one (no name: the served one)."""
    if model and model != served:
        raise HTTPFailure(
            404,
            error_body(
                sanitize(f"The model `{model}` does not exist. Valid aliases: {served}."),
                "NotFoundError",
                404,
                "model",
            ),
        )


def check_stop(stop: Any) -> None:
    """A completion's `stop`: a string or a list of strings, refused as pydantic words it; an empty string as
    vLLM's SamplingParams refuses it (it would match everywhere)."""
    if stop is None or isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        if stop == "" or (isinstance(stop, list) and "" in stop):
            raise bad_request("stop cannot contain an empty string.")
        return
    errors = [{"type": "string_type", "loc": ("body", "stop"), "msg": "Input should be a valid string", "input": stop}]
    if not isinstance(stop, list):
        errors.append(
            {"type": "list_type", "loc": ("body", "stop"), "msg": "Input should be a valid list", "input": stop}
        )
    raise validation_failure(errors)


def check_prompt(
    ids: list[int], request: dict[str, Any], vocab_size: int, max_model_len: int, generate: bool = False
) -> None:
    """The checks vLLM makes before scheduling: ids in the vocabulary, logprobs, max_tokens and the context."""
    for t in ids:
        if not 0 <= t < vocab_size:
            raise bad_request(f"Token id {t} is out of vocabulary")
    k = request.get("logprobs")
    if k is not None and k > MAX_LOGPROBS:
        raise bad_request(
            f"Requested sample logprobs of {k}, which is greater than max allowed: {MAX_LOGPROBS} "
            f"(parameter=logprobs, value={k})",
            "logprobs",
        )
    limit = max_model_len
    max_tokens = request.get("max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
    if generate and len(ids) > limit:
        raise bad_request(
            f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of "
            f"{limit}. Make sure that `max_model_len` is no smaller than the number of text tokens."
        )
    if len(ids) >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{len(ids)} input tokens, which exceeds this limit even without any output tokens. Please "
            f"reduce the length of the input prompt. (parameter=input_tokens, value={len(ids)})",
            "input_tokens",
        )
    if max_tokens is not None and max_tokens > limit:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request "
            f"fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            "max_tokens",
        )
