"""Reading vLLM's answers: captured 0.32 responses and both error shapes, then real HTTP to the simulator."""

import asyncio
import json
from pathlib import Path

import pytest

from agentroll.client import CallFailed, CompletionClient, error_message, normalize_base_url, parse_choice
from agentroll.errors import ServerError

FIXTURES = Path(__file__).parent / "fixtures"


def captured(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text().splitlines()[0])


def test_base_url_with_or_without_v1():
    assert normalize_base_url("http://h:8000/v1/") == normalize_base_url("http://h:8000") == "http://h:8000"
    with pytest.raises(ServerError):
        normalize_base_url("h:8000")


def test_ids_read_from_token_ids_and_from_token_id_strings_agree():
    payload = captured("vllm032_completion_token_ids.json")
    sent = payload["choices"][0]["prompt_token_ids"]
    ids, logprobs, _ = parse_choice(payload, sent)
    assert ids == payload["choices"][0]["token_ids"] and len(ids) == 16
    assert logprobs == payload["choices"][0]["logprobs"]["token_logprobs"]
    payload["choices"][0]["token_ids"] = None  # a server without return_token_ids
    assert parse_choice(payload, sent)[0] == ids


def test_misaligned_or_foreign_answers_are_refused():
    payload = captured("vllm032_completion_token_ids.json")
    sent = payload["choices"][0]["prompt_token_ids"]
    with pytest.raises(CallFailed, match="differ"):
        parse_choice(payload, [*sent, 5])
    payload["choices"][0]["logprobs"]["token_logprobs"].pop()
    with pytest.raises(CallFailed, match="16 token ids but 15 logprobs"):
        parse_choice(payload, sent)
    with pytest.raises(CallFailed, match="logprobs"):
        parse_choice(captured("vllm032_finish_stop_token.json"), [1, 320, 285])


def test_both_vllm_error_shapes_give_the_servers_message():
    new = b'{"error":{"message":"max_tokens=5000 cannot be greater","type":"BadRequestError","param":null,"code":400}}'
    old = b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}'
    assert error_message(new, 400) == "max_tokens=5000 cannot be greater"
    assert error_message(old, 400) == "too long"
    assert error_message(b"upstream gone", 502) == "upstream gone"


def body(ids, **extra):
    return {"model": "agentroll-sim", "prompt": ids, "max_tokens": 64, "logprobs": 0, "return_token_ids": True,
            "return_tokens_as_token_ids": True, **extra}


def test_a_completion_over_http_is_what_the_server_sent(sim):
    async def go():
        client = CompletionClient([sim.url + "/v1"], concurrency=4)
        try:
            return await client.complete(body([1, 87, 85]))
        finally:
            await client.aclose()

    done = asyncio.run(go())
    (exchange,) = sim.log
    choice = exchange["response"]["choices"][0]
    assert done.token_ids == choice["token_ids"] and done.logprobs == choice["logprobs"]["token_logprobs"]
    assert done.text == choice["text"] and done.finish_reason == choice["finish_reason"]


def test_a_400_fails_at_once_with_the_servers_message_and_a_404_ends_the_run(sim):
    async def go(request):
        client = CompletionClient([sim.url], concurrency=4, max_retries=3)
        try:
            return await client.complete(request)
        finally:
            await client.aclose()

    with pytest.raises(CallFailed, match="maximum context length is 4096") as info:
        asyncio.run(go(body([5] * 5000)))
    assert info.value.status == 400 and not info.value.retryable
    with pytest.raises(ServerError, match="does not exist"):
        asyncio.run(go(body([5], model="nope")))
