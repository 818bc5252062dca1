"""The lean decoder of `/v1/completions` answers (wire.reader): only what is read is built, and every answer gives
exactly what decoding it whole gives (the same Completion, value for value and type for type, or the same error)."""

from __future__ import annotations

import json
import random
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentroll.client.wire import WireError, parse, reader

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURED = [
    "vllm032_completion_token_ids.json",
    "vllm032_completion_no_token_ids.json",
    "vllm032_finish_stop_token.json",
]


def body_of(name: str) -> bytes:
    return (FIXTURES / name).read_bytes().splitlines()[0]


def outcome(data_of: Any, body: bytes, sent: list[int]) -> tuple[str, Any]:
    """What the client makes of a body: the Completion's fields as JSON bytes (so 1 and 1.0 differ), or the
    error's type and message."""
    try:
        done = parse("completions", data_of(body), sent, 0)
    except (WireError, orjson.JSONDecodeError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", orjson.dumps({name: getattr(done, name) for name in done.__slots__}, default=repr)


def same_as_whole(body: bytes, sent: list[int]) -> tuple[str, Any]:
    lean, whole = outcome(reader("completions", 0), body, sent), outcome(orjson.loads, body, sent)
    assert lean == whole, body[:300]
    return lean


def test_an_answer_is_decoded_without_the_per_token_fields_nobody_reads():
    data = reader("completions", 0)(body_of("vllm032_completion_token_ids.json"))
    choice = data["choices"][0]
    assert choice["logprobs"] == {
        "token_logprobs": json.loads(body_of(CAPTURED[0]))["choices"][0]["logprobs"]["token_logprobs"]
    }
    assert "tokens" not in choice["logprobs"] and "top_logprobs" not in choice["logprobs"]
    # with alternatives, or on the native API, the answer is decoded whole: top_logprobs are read
    assert reader("completions", 2) is orjson.loads and reader("generate", 0) is orjson.loads


@pytest.mark.parametrize("name", CAPTURED)
def test_vllm_answers_give_the_same_completion(name):
    body = body_of(name)
    sent = json.loads(body)["choices"][0].get("prompt_token_ids") or [1, 320, 285]
    same_as_whole(body, sent)


def mutate(body: bytes, change) -> bytes:
    data = json.loads(body)
    change(data, data["choices"][0])
    return json.dumps(data).encode()


def _set(where: str, key: str, value: Any):
    def change(data: dict, choice: dict) -> None:
        target = {"data": data, "choice": choice, "logprobs": choice.get("logprobs")}[where]
        target[key] = value

    return change


MUTATIONS = [
    _set("choice", "token_ids", None),  # ids only in logprobs.tokens
    _set("choice", "token_ids", [1.0] * 16),
    _set("choice", "token_ids", [True] * 16),
    _set("choice", "token_ids", [1 << 63] * 16),  # integers past 63 bits: orjson's own reading
    _set("choice", "token_ids", [1 << 64] * 16),
    _set("choice", "token_ids", "123"),
    _set("logprobs", "token_logprobs", [None] * 16),
    _set("logprobs", "token_logprobs", [0] * 16),  # integers stay integers
    _set("logprobs", "token_logprobs", [-(1 << 70)] * 16),
    _set("logprobs", "token_logprobs", [False] * 16),
    _set("logprobs", "token_logprobs", None),
    _set("logprobs", "token_logprobs", [-0.0, 1e-310, -1.7976931348623157e308, 5e-324] * 4),
    _set("choice", "logprobs", None),
    _set("choice", "logprobs", [1, 2]),
    _set("choice", "text", 5),
    _set("choice", "text", None),
    _set("choice", "text", "caf\u00e9 \U0001f600 \\n\t"),
    _set("choice", "finish_reason", 3),
    _set("choice", "stop_reason", True),
    _set("choice", "stop_reason", 151645),
    _set("choice", "prompt_token_ids", [9, 9]),
    _set("choice", "weight_versions", [{"version": "v1", "start": 0, "end": 16}]),
    _set("choice", "weight_versions", {"start": 0}),
    _set("choice", "routed_experts", "not base64!"),
    _set("choice", "extra_unknown", {"deep": [1, {"x": None}]}),
    _set("data", "choices", []),
    _set("data", "choices", {"0": 1}),
    _set("data", "choices", [5]),
]


@pytest.mark.parametrize("index", range(len(MUTATIONS)))
def test_odd_answers_give_what_decoding_them_whole_gives(index):
    body = mutate(body_of(CAPTURED[0]), MUTATIONS[index])
    same_as_whole(body, json.loads(body_of(CAPTURED[0]))["choices"][0]["prompt_token_ids"])


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"null",
        b'{"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [NaN]}}]}',
        b'{"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [-0.5]}}]} trailing',
        b'{"choices": [{"token_ids": [1], "text": "\\ud800", "logprobs": {"token_logprobs": [-0.5]}}]}',
        b'{"choices": [{"token_ids": [1], "text": "\xff", "logprobs": {"token_logprobs": [-0.5]}}]}',
        b'{"choices": [{"token_ids": [1], "token_ids": [2], "logprobs": {"token_logprobs": [-0.5]}}]}',
        b"<html><body>502 Bad Gateway</body></html>",
    ],
)
def test_malformed_bodies_fail_as_they_did(body):
    same_as_whole(body, [1])


def test_logprobs_read_to_the_last_bit():
    """Random doubles, written as Python and vLLM write them and with six places, read back bit for bit equal."""
    rng = random.Random(7)
    values = [rng.gauss(-2.0, 3.0) for _ in range(2000)] + [rng.uniform(-1e-300, 0) for _ in range(500)]
    for text in (json.dumps(values), json.dumps([round(v, 6) for v in values])):
        body = b'{"choices": [{"token_ids": %s, "logprobs": {"token_logprobs": %s}, "text": "x"}]}' % (
            json.dumps(list(range(len(values)))).encode(),
            text.encode(),
        )
        assert same_as_whole(body, [1])[0] == "ok"


def test_the_simulators_answers_give_the_same_completion(sim):
    for prompt in ([5, 6, 7], list(range(5, 300)), [9] * 40):
        request = urllib.request.Request(
            f"{sim.url}/v1/completions",
            data=json.dumps(
                {
                    "model": "agentroll-sim",
                    "prompt": prompt,
                    "max_tokens": 400,
                    "logprobs": 0,
                    "return_token_ids": True,
                    "return_tokens_as_token_ids": True,
                }
            ).encode(),
            headers={"content-type": "application/json"},
        )
        body = urllib.request.urlopen(request, timeout=30).read()
        assert same_as_whole(body, prompt)[0] == "ok"
