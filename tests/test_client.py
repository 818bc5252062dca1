"""Reading vLLM's answers: captured 0.32 responses and both error shapes, then real HTTP to the simulator."""

import asyncio
import itertools
import json
from pathlib import Path

import pytest

from agentroll.client import CallFailed, CompletionClient, FunctionTransport, error_message, normalize_base_url
from agentroll.client.wire import WireError, parse_completions, parse_generate, request_body
from agentroll.errors import ServerError, UsageError

from .conftest import settings

FIXTURES = Path(__file__).parent / "fixtures"


def captured(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text().splitlines()[0])


def test_base_url_with_or_without_v1():
    assert normalize_base_url("http://h:8000/v1/") == normalize_base_url("http://h:8000") == "http://h:8000"
    with pytest.raises(UsageError):  # a flag's value: a usage error (exit 2)
        normalize_base_url("h:8000")


def test_ids_read_from_token_ids_and_from_token_id_strings_agree():
    payload = captured("vllm032_completion_token_ids.json")
    sent = payload["choices"][0]["prompt_token_ids"]
    done = parse_completions(payload, sent)
    assert done.token_ids == payload["choices"][0]["token_ids"] and len(done.token_ids) == 16
    assert done.logprobs == payload["choices"][0]["logprobs"]["token_logprobs"]
    payload["choices"][0]["token_ids"] = None  # a server without return_token_ids
    assert parse_completions(payload, sent).token_ids == done.token_ids


def test_misaligned_or_foreign_answers_are_refused():
    payload = captured("vllm032_completion_token_ids.json")
    sent = payload["choices"][0]["prompt_token_ids"]
    with pytest.raises(WireError, match="differ"):
        parse_completions(payload, [*sent, 5])
    payload["choices"][0]["logprobs"]["token_logprobs"].pop()
    with pytest.raises(WireError, match="16 token ids but 15 logprobs"):
        parse_completions(payload, sent)
    with pytest.raises(WireError, match="logprobs"):
        parse_completions(captured("vllm032_finish_stop_token.json"), [1, 320, 285])


def test_the_native_generate_answer_is_read_as_vllm_sent_it():
    payload = captured("vllm032_generate_tokens.json")
    done = parse_generate(payload, [1, 2, 3, 4])
    content = payload["choices"][0]["logprobs"]["content"]
    assert done.token_ids == [3559, 4065, 2767, 4064] and done.text is None
    assert done.logprobs == [c["logprob"] for c in content] and done.ranks == [2727, 1421, 2315, 3277]
    assert done.weight_versions == [{"version": "default", "start": 0, "end": 4}]
    assert done.finish_reason == "length" and done.routed_experts is None
    content[1]["token_id"] = 7
    with pytest.raises(WireError, match="differ from token_ids"):
        parse_generate(payload, [1, 2, 3, 4])


def test_top_k_from_generate_keeps_ranks_1_to_k_whatever_the_sampled_rank():
    """vLLM's /generate answers the first k entries of [sampled, top 1..k]: with k + 1 asked, ranks 1..k are
    all there. The capture asked for 3 and lost rank 3 to the sampled token (rank 14): asking k=2 keeps 1..2."""
    payload = captured("vllm032_generate_top3.json")
    done = parse_generate(payload, [1, 2, 3, 4, 5], alternatives=2)
    content = payload["choices"][0]["logprobs"]["content"]
    assert done.top_token_ids == [[c["top_logprobs"][1]["token_id"], c["top_logprobs"][2]["token_id"]] for c in content]
    assert all(a >= b for lps in done.top_logprobs for a, b in itertools.pairwise(lps))
    assert done.ranks == [14, 218, 2095, 2755]
    assert request_body("generate", "m", [1], {"max_tokens": 2}, 2)["sampling_params"]["logprobs"] == 3
    assert request_body("completions", "m", [1], {"max_tokens": 2}, 2)["logprobs"] == 2


def test_top_k_from_completions_sorted_by_logprob_with_the_sampled_rank_when_listed():
    payload = {
        "choices": [
            {
                "text": "",
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": [5, 9],
                "logprobs": {
                    "token_logprobs": [-3.0, -0.1],
                    "tokens": ["token_id:5", "token_id:9"],
                    "top_logprobs": [
                        {"token_id:5": -3.0, "token_id:1": -0.5, "token_id:2": -1.0},
                        {"token_id:9": -0.1, "token_id:4": -2.0},
                    ],
                },
            }
        ]
    }
    done = parse_completions(payload, [1], alternatives=2)
    assert done.top_token_ids == [[1, 2], [9, 4]] and done.top_logprobs == [[-0.5, -1.0], [-0.1, -2.0]]
    assert done.ranks == [None, 1]


def test_both_vllm_error_shapes_give_the_servers_message():
    new = b'{"error":{"message":"max_tokens=5000 cannot be greater","type":"BadRequestError","param":null,"code":400}}'
    old = b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}'
    assert error_message(new, 400) == "max_tokens=5000 cannot be greater"
    assert error_message(old, 400) == "too long"
    assert error_message(b"upstream gone", 502) == "upstream gone"


def test_a_completion_over_http_is_what_the_server_sent(sim):
    async def go():
        client = CompletionClient([sim.url + "/v1"], settings(concurrency=4))
        try:
            return await client.complete([1, 87, 85], {"max_tokens": 64}, "agentroll-sim")
        finally:
            await client.aclose()

    done = asyncio.run(go())
    (exchange,) = sim.log
    choice = exchange["response"]["choices"][0]
    assert done.token_ids == choice["token_ids"] and done.logprobs == choice["logprobs"]["token_logprobs"]
    assert done.text == choice["text"] and done.finish_reason == choice["finish_reason"]


def test_a_400_fails_at_once_with_the_servers_message_and_a_404_ends_the_run(sim):
    async def go(ids, model="agentroll-sim"):
        client = CompletionClient([sim.url], settings(concurrency=4, max_retries=3))
        try:
            return await client.complete(ids, {"max_tokens": 64}, model)
        finally:
            await client.aclose()

    with pytest.raises(CallFailed, match="maximum context length is 4096") as info:
        asyncio.run(go([5] * 5000))
    assert info.value.status == 400 and not info.value.retryable
    with pytest.raises(ServerError, match="does not exist"):
        asyncio.run(go([5], model="nope"))


@pytest.mark.parametrize("finish", [["stop"], {"why": "stop"}, 7])
def test_a_finish_reason_that_is_not_a_string_is_a_malformed_answer_retried(finish):
    """Over the transport seam: the first answer's finish_reason is no string, the retry's is."""
    answers = [
        {
            "choices": [
                {
                    "text": "x",
                    "token_ids": [3],
                    "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": finish,
                    "stop_reason": None,
                }
            ]
        },
        {
            "choices": [
                {
                    "text": "x",
                    "token_ids": [3],
                    "logprobs": {"token_logprobs": [-0.5]},
                    "finish_reason": "stop",
                    "stop_reason": None,
                }
            ]
        },
    ]

    def handler(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        return 200, json.dumps(answers.pop(0)).encode()

    async def go():
        client = CompletionClient(
            ["http://127.0.0.1:9"], settings(max_retries=2, backoff_base_s=0.001), transport=FunctionTransport(handler)
        )
        try:
            return await client.complete([1, 2], {"max_tokens": 4}, "m"), client.counters.retries
        finally:
            await client.aclose()

    done, retries = asyncio.run(go())
    assert (done.finish_reason, done.attempts, retries) == ("stop", 2, 1)
