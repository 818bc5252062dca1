"""The simulated server answers in vLLM 0.32's shape: compared field by field with responses captured from a
real vLLM 0.32 (tests/fixtures/vllm032_*.json, raw bodies as the server sent them)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def captured(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text().splitlines()[0])


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def shape(value):
    """Keys all the way down (lists by their first element), types of the leaves: what a client relies on."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_completion_fields_match_vllm_with_and_without_return_token_ids(sim):
    for fixture, extra in (("vllm032_completion_token_ids.json", {"return_token_ids": True}),
                           ("vllm032_completion_no_token_ids.json", {})):
        status, ours = post(f"{sim.url}/v1/completions", {"prompt": [1, 320, 285], "max_tokens": 16, "logprobs": 1,
                                                           "return_tokens_as_token_ids": True, **extra})
        theirs = captured(fixture)
        assert status == 200
        assert set(ours) == set(theirs)
        assert set(ours["choices"][0]) == set(theirs["choices"][0])
        assert set(ours["choices"][0]["logprobs"]) == set(theirs["choices"][0]["logprobs"])
        assert (ours["choices"][0]["token_ids"] is None) == (theirs["choices"][0]["token_ids"] is None)
        tokens = ours["choices"][0]["logprobs"]["tokens"]
        assert all(t.startswith("token_id:") for t in tokens)
        assert ours["choices"][0]["logprobs"]["text_offset"][1] == len(tokens[0])  # counts the token_id strings
        assert set(ours["usage"]) == set(theirs["usage"])


def test_errors_models_and_tokenize_match_vllm(sim):
    status, ours = post(f"{sim.url}/v1/completions", {"prompt": [5] * 5000, "max_tokens": 4})
    theirs = captured("vllm032_too_long.json")
    assert status == 400 and shape(ours) == shape(theirs)
    assert ours["error"]["message"].startswith("This model's maximum context length is 4096 tokens. However, your "
                                               "prompt contains 5000 input tokens")
    models = json.loads(urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10).read())
    assert shape(models) == shape(captured("vllm032_models.json"))
    status, tokens = post(f"{sim.url}/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                                                  "add_generation_prompt": True})
    assert status == 200 and set(tokens) == set(captured("vllm032_tokenize_messages.json"))


def test_near_the_context_limit_max_tokens_is_cut_silently_as_vllm_does(sim):
    status, ours = post(f"{sim.url}/v1/completions", {"prompt": [5] * 4090, "max_tokens": 16, "logprobs": 0,
                                                       "return_token_ids": True})
    assert status == 200 and ours["choices"][0]["finish_reason"] == "length"
    assert len(ours["choices"][0]["token_ids"]) == 6 and ours["usage"]["total_tokens"] == 4096
