"""The simulated server answers in vLLM 0.32's shape: compared field by field with responses captured from a
real vLLM 0.32 (tests/fixtures/vllm032_*.json, raw bodies as the server sent them)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def captured(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text().splitlines()[0])


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
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
    for fixture, extra in (
        ("vllm032_completion_token_ids.json", {"return_token_ids": True}),
        ("vllm032_completion_no_token_ids.json", {}),
    ):
        status, ours = post(
            f"{sim.url}/v1/completions",
            {"prompt": [1, 320, 285], "max_tokens": 16, "logprobs": 1, "return_tokens_as_token_ids": True, **extra},
        )
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
    assert ours["error"]["message"].startswith(
        "This model's maximum context length is 4096 tokens. However, your prompt contains 5000 input tokens"
    )
    models = json.loads(urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10).read())
    assert shape(models) == shape(captured("vllm032_models.json"))
    status, tokens = post(
        f"{sim.url}/tokenize", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
    )
    assert status == 200 and set(tokens) == set(captured("vllm032_tokenize_messages.json"))


def test_near_the_context_limit_max_tokens_is_cut_silently_as_vllm_does(sim):
    status, ours = post(
        f"{sim.url}/v1/completions", {"prompt": [5] * 4090, "max_tokens": 16, "logprobs": 0, "return_token_ids": True}
    )
    assert status == 200 and ours["choices"][0]["finish_reason"] == "length"
    assert len(ours["choices"][0]["token_ids"]) == 6 and ours["usage"]["total_tokens"] == 4096


def test_models_root_is_the_tokenizer_folder_a_client_can_load(sim):
    """vLLM names the model's path in `root`; clients load the tokenizer from there."""
    from agentroll.process.resources import sim_tokenizer_dir
    from agentroll.render.chat import load_tokenizer

    (model,) = json.loads(urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10).read())["data"]
    assert model["id"] == sim.model and Path(model["root"]).is_absolute()
    assert Path(model["root"]) == sim_tokenizer_dir().resolve()
    tokenizer = load_tokenizer(model["root"])
    assert tokenizer.encode("hello world", add_special_tokens=False) == sim.tokenizer.encode("hello world").ids


# vLLM 0.32's /metrics lines for these series (vllm-wire/metrics.txt), values aside: HELP, TYPE, label sets.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="M"}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="M"}
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="M",reason="capacity"}
vllm:num_requests_waiting_by_reason{engine="0",model_name="M",reason="deferred"}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="M"}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="M"}
vllm:request_success_total{engine="0",finished_reason="length",model_name="M"}
vllm:request_success_total{engine="0",finished_reason="abort",model_name="M"}
vllm:request_success_total{engine="0",finished_reason="error",model_name="M"}
vllm:request_success_total{engine="0",finished_reason="repetition",model_name="M"}
# TYPE vllm:request_success_created gauge
# TYPE agentroll_sim_first_request_unix gauge
"""


def test_metrics_are_vllms_series_in_prometheus_text_format(sim):
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=10) as answer:
        assert answer.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
        text = answer.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = value
    for expected in VLLM_METRICS.replace('model_name="M"', f'model_name="{sim.model}"').splitlines():
        if expected.startswith("#"):
            assert expected in text.splitlines(), expected
        else:
            assert samples[expected] == "0.0", expected  # floats as prometheus_client writes them
    assert float(samples["agentroll_sim_first_request_unix"]) == 0.0
    status, _ = post(f"{sim.url}/v1/completions", {"prompt": [1, 320, 285], "max_tokens": 16})
    assert status == 200
    after = urllib.request.urlopen(f"{sim.url}/metrics", timeout=10).read().decode()
    first = float(
        next(line for line in after.splitlines() if line.startswith("agentroll_sim_first_request_unix")).split()[1]
    )
    assert abs(first - sim.first_request_at) < 1e-3 and re.search(
        r"e\+09$", after.split("first_request_unix ")[-1].strip()
    )


def test_native_generate_matches_vllm_shape_errors_and_the_403_without_scale_out(sim, problems):
    from agentroll.sim.script import Script
    from agentroll.sim.server import SimServer

    status, body = post(f"{sim.url}/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {}})
    assert status == 403 and "--enable-scale-out" in body["error"]["message"]
    server = SimServer(script=Script.from_jsonl(problems), enable_scale_out=True, max_model_len=2048)
    server.start()
    try:
        url = f"{server.url}/inference/v1/generate"
        for fixture, k in (("vllm032_generate_tokens.json", 0), ("vllm032_generate_top3.json", 3)):
            status, ours = post(url, {"token_ids": [1, 2, 3, 4], "sampling_params": {"max_tokens": 4, "logprobs": k}})
            theirs = captured(fixture)
            assert status == 200 and shape(ours) == shape(theirs) | {"prompt_token_ids": "NoneType"}
            content = ours["choices"][0]["logprobs"]["content"]
            assert all(
                len(c["top_logprobs"]) == max(k, 1) and c["top_logprobs"][0]["token_id"] == c["token_id"]
                for c in content
            )
        status, ours = post(url, {"token_ids": [1, 2]})
        theirs = captured("vllm032_generate_missing_sampling_params.json")
        assert status == 400 and ours == theirs
        status, ours = post(url, {"token_ids": [5] * 2100, "sampling_params": {"max_tokens": 4}})
        assert status == 400 and ours == captured("vllm032_generate_too_long.json")
    finally:
        server.stop()
