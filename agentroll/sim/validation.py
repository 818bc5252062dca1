"""Request validation as vLLM's FastAPI/pydantic layer does it, down to the error list a malformed body earns.

vLLM validates each body against pydantic models before any handler runs; a body that fails gets a 400 whose
message lists pydantic's errors (type, dotted location, message, summarised input). A client's error handling
is only tested if the simulator fails the same requests the same way, so this module re-derives those error
lists for the fields the simulator reads: pydantic's lax coercions (`"7"` is an int, `1` is a bool) included.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

from .wire import HTTPFailure, json_invalid, validation_failure

Loc = tuple[Any, ...]
Errors = list[dict[str, Any]]
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "f", "false", "n", "no", "off"}
# The members of vLLM's ChatCompletionMessageParam union, in order: a message that is not an object fails each.
_MESSAGE_KINDS = (
    "ChatCompletionDeveloperMessageParam",
    "ChatCompletionSystemMessageParam",
    "ChatCompletionUserMessageParam",
    "ChatCompletionAssistantMessageParam",
    "ChatCompletionToolMessageParam",
    "ChatCompletionFunctionMessageParam",
    "CustomChatCompletionMessageParam",
)


def _error(kind: str, loc: Loc, msg: str, value: Any, **ctx: Any) -> dict[str, Any]:
    error = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        error["ctx"] = ctx
    return error


def as_int(value: Any, loc: Loc, errors: Errors, ge: int | None = None) -> int | None:
    if isinstance(value, bool):
        out = int(value)
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float):
        if not value.is_integer():
            errors.append(
                _error(
                    "int_from_float", loc, "Input should be a valid integer, got a number with a fractional part", value
                )
            )
            return None
        out = int(value)
    elif isinstance(value, str):
        try:
            out = int(value.strip())
        except ValueError:
            errors.append(
                _error(
                    "int_parsing", loc, "Input should be a valid integer, unable to parse string as an integer", value
                )
            )
            return None
    else:
        errors.append(_error("int_type", loc, "Input should be a valid integer", value))
        return None
    if ge is not None and out < ge:
        errors.append(_error("greater_than_equal", loc, f"Input should be greater than or equal to {ge}", value, ge=ge))
        return None
    return out


def as_bool(value: Any, loc: Loc, errors: Errors) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, (int, float, str)):
        errors.append(_error("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value))
    else:
        errors.append(_error("bool_type", loc, "Input should be a valid boolean", value))
    return None


def as_str(value: Any, loc: Loc, errors: Errors) -> str | None:
    if isinstance(value, str):
        return value
    errors.append(_error("string_type", loc, "Input should be a valid string", value))
    return None


def as_dict(value: Any, loc: Loc, errors: Errors) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    errors.append(_error("dict_type", loc, "Input should be a valid dictionary", value))
    return None


def as_list(value: Any, loc: Loc, errors: Errors, item: Callable[[Any, Loc, Errors], Any] | None = None) -> Any:
    if not isinstance(value, list):
        errors.append(_error("list_type", loc, "Input should be a valid list", value))
        return None
    if item is None:
        return value
    before = len(errors)
    out = [item(v, (*loc, i), errors) for i, v in enumerate(value)]
    return out if len(errors) == before else None


def _message(value: Any, loc: Loc, errors: Errors) -> Any:
    if isinstance(value, dict):
        return value  # the simulator renders whatever an object holds; vLLM's deeper checks are not mirrored
    errors.extend(
        _error("dict_type", (*loc, kind), "Input should be a valid dictionary", value) for kind in _MESSAGE_KINDS
    )
    errors.append(
        _error(
            "model_attributes_type",
            (*loc, "Message"),
            "Input should be a valid dictionary or object to extract fields from",
            value,
        )
    )
    return None


def _token_id(value: Any, loc: Loc, errors: Errors) -> int | None:
    return as_int(value, loc, errors, ge=0)


def _optional(check: Callable[[Any, Loc, Errors], Any]) -> Callable[[Any, Loc, Errors], Any]:
    return lambda value, loc, errors: None if value is None else check(value, loc, errors)


def _messages(value: Any, loc: Loc, errors: Errors) -> Any:
    return as_list(value, loc, errors, _message)


def _token_ids(value: Any, loc: Loc, errors: Errors) -> Any:
    return as_list(value, loc, errors, _token_id)


Spec = dict[str, tuple[Callable[[Any, Loc, Errors], Any], bool]]  # field -> (check, required), in model order
_OPT_STR, _OPT_BOOL, _OPT_DICT = _optional(as_str), _optional(as_bool), _optional(as_dict)
_OPT_LIST = _optional(as_list)
TOKENIZE_PROMPT: Spec = {
    "model": (_OPT_STR, False),
    "prompt": (as_str, True),
    "add_special_tokens": (as_bool, False),
    "return_token_strs": (_OPT_BOOL, False),
}
TOKENIZE_CHAT: Spec = {
    "model": (_OPT_STR, False),
    "messages": (_messages, True),
    "add_generation_prompt": (as_bool, False),
    "return_token_strs": (_OPT_BOOL, False),
    "continue_final_message": (as_bool, False),
    "add_special_tokens": (as_bool, False),
    "chat_template": (_OPT_STR, False),
    "chat_template_kwargs": (_OPT_DICT, False),
    "media_io_kwargs": (_OPT_DICT, False),
    "mm_processor_kwargs": (_OPT_DICT, False),
    "tools": (_OPT_LIST, False),
}
DETOKENIZE: Spec = {"model": (_OPT_STR, False), "tokens": (_token_ids, True)}
COMPLETION: Spec = {  # the fields of vLLM's CompletionRequest that the simulator reads (prompt is checked apart)
    "model": (_OPT_STR, False),
    "max_tokens": (_optional(as_int), False),
    "n": (_optional(as_int), False),
    "logprobs": (_optional(as_int), False),
    "seed": (_optional(as_int), False),
    "stream": (_OPT_BOOL, False),
    "stop_token_ids": (_optional(lambda v, loc, e: as_list(v, loc, e, as_int)), False),
    "return_token_ids": (_OPT_BOOL, False),
    "return_tokens_as_token_ids": (_OPT_BOOL, False),
    "skip_special_tokens": (as_bool, False),
    "ignore_eos": (as_bool, False),
    "priority": (as_int, False),
}


_NUMBER = _optional(
    lambda v, loc, e: (
        v
        if isinstance(v, int | float) and not isinstance(v, bool)
        else e.append(_error("float_type", loc, "Input should be a valid number", v))
    )
)
GENERATE: Spec = {
    "token_ids": (_token_ids, True),
    "sampling_params": (as_dict, True),
    "model": (_OPT_STR, False),
    "return_token_ids": (_OPT_BOOL, False),
    "stream": (_OPT_BOOL, False),
    "priority": (as_int, False),
}
SAMPLING_PARAMS: Spec = {  # the SamplingParams fields the simulator reads, inside /generate's `sampling_params`
    "max_tokens": (_optional(as_int), False),
    "n": (_optional(as_int), False),
    "logprobs": (_optional(as_int), False),
    "seed": (_optional(as_int), False),
    "temperature": (_NUMBER, False),
    "top_p": (_NUMBER, False),
    "top_k": (_optional(as_int), False),
    "min_p": (_NUMBER, False),
    "stop_token_ids": (_optional(lambda v, loc, e: as_list(v, loc, e, as_int)), False),
    "skip_special_tokens": (as_bool, False),
    "ignore_eos": (as_bool, False),
}


def _against(data: Any, spec: Spec, errors: Errors, root: Loc = ("body",)) -> dict[str, Any] | None:
    if not isinstance(data, dict):
        errors.append(
            _error(
                "model_attributes_type",
                ("body",),
                "Input should be a valid dictionary or object to extract fields from",
                data,
            )
        )
        return None
    before = len(errors)
    out: dict[str, Any] = {}
    for name, (check, required) in spec.items():
        if name not in data:
            if required:
                errors.append(_error("missing", (*root, name), "Field required", data))
            continue
        out[name] = check(data[name], (*root, name), errors)
    if spec is GENERATE and out.get("token_ids") == []:
        errors.append(
            _error(
                "too_short",
                ("body", "token_ids"),
                "List should have at least 1 item after validation, not 0",
                [],
                field_type="List",
                min_length=1,
                actual_length=0,
            )
        )
    return out if len(errors) == before else None


def parse_body(raw: bytes) -> Any:
    """JSON as FastAPI reads it: an empty body is a missing body, a broken one a `json_invalid` at its offset."""
    if not raw.strip():
        raise validation_failure([_error("missing", ("body",), "Field required", None)])
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # FastAPI decodes with the standard library: its message and offset (and its leniency, NaN and all)
        return json.loads(raw)
    except ValueError as exc:
        raise json_invalid(getattr(exc, "msg", str(exc)), getattr(exc, "pos", 0)) from None


def validate(data: Any, *specs: Spec) -> tuple[int, dict[str, Any]]:
    """The first model (of a union, in order) the body satisfies and its coerced fields, or the 400 vLLM sends."""
    errors: Errors = []
    for i, spec in enumerate(specs):
        fields = _against(data, spec, errors)
        if fields is not None:
            return i, {**data, **fields}
    raise validation_failure(errors)


def validate_params(data: Any) -> tuple[int, dict[str, Any]]:
    """/generate's `sampling_params`, checked where the body puts them."""
    errors: Errors = []
    fields = _against(data, SAMPLING_PARAMS, errors, ("body", "sampling_params"))
    if fields is None:
        raise validation_failure(errors)
    return 0, {**data, **fields}


def completion_prompt(value: Any) -> list[str] | list[list[int]]:
    """CompletionRequest.prompt: `list[int] | list[list[int]] | str | list[str]`, as a batch of prompts."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(type(v) is int for v in value):  # token ids: the common case, kept fast
        return [value] if value else []
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, list) and all(isinstance(v, list) for v in value) and value:
        errors: Errors = []
        batch = [as_list(v, ("body", "prompt", i), errors, as_int) for i, v in enumerate(value)]
        if not errors:
            return batch
    errors = []
    ids = as_list(value, ("body", "prompt"), errors, as_int)
    if ids is not None:
        return [ids] if ids else []
    as_list(value, ("body", "prompt"), errors, lambda v, loc, e: as_list(v, loc, e, as_int))
    as_str(value, ("body", "prompt"), errors)
    as_list(value, ("body", "prompt"), errors, as_str)
    raise validation_failure(errors)


__all__ = [
    "COMPLETION",
    "DETOKENIZE",
    "GENERATE",
    "TOKENIZE_CHAT",
    "TOKENIZE_PROMPT",
    "HTTPFailure",
    "completion_prompt",
    "parse_body",
    "validate",
    "validate_params",
]
