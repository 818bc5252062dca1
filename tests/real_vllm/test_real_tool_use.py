"""Tool use against a real vLLM: Qwen3's published chat template with `tools` renders to the ids vLLM's /tokenize
gives, and a tool-use run stays token-exact through a `tool` turn.

Qwen3's template is read from the installed `trl` package (a test dependency: `trl/chat_templates/qwen3.jinja`,
kept there as the original template), never copied into this repository; without it the tiny model's own
template (the simulator's ChatML with a tools section we wrote) stands in, and the summary says so. The tiny
model is random, so a tool call is asked of it through vLLM's structured outputs: a proxy adds a regex to each
completion request (the call on the first turn, an answer after a tool result). The ids and logprobs are still
vLLM's own, sampled under that constraint; the records are checked against what vLLM sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import aiohttp
import pytest
from aiohttp import web

from agentroll.context.turns import separator
from agentroll.render.chat import ChatEncoder, load_first
from agentroll.toolcalls import PYTHON

from ..conftest import read_records, run_cli
from .conftest import SUMMARY
from .helpers import COMPLETIONS, RecordingProxy
from .test_real_vllm import check_exact

CALL = (
    "<think>\nI will compute it.\n</think>\n\n"
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
)
ANSWER = "<think>\nThe tool printed 42.\n</think>\n\nThe answer is \\boxed{42}."
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer", "description": "how many results"},
            },
            "required": ["query"],
        },
    },
}


@pytest.fixture(scope="module")
def tool_vllm(tools_vllm: tuple[object, str]) -> str:
    """The session's server of the tiny model with Qwen3's chat template (conftest's `tools_vllm`)."""
    return tools_vllm[1]


def server_ids(url: str, messages: list[dict], tools: list[dict] | None) -> list[int]:
    body = {"model": "tiny", "messages": messages, "add_generation_prompt": True, **({"tools": tools} if tools else {})}
    request = urllib.request.Request(f"{url}/tokenize", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["tokens"]


CONVERSATIONS = [
    [{"role": "user", "content": "What is 6 times 7?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 6 times 7?"}],
    [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": "42"},
    ],
    [
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": "Two lookups."},
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second <&> ünïcode"},
    ],
]


def test_the_template_with_tools_renders_the_ids_vllm_renders(tool_vllm, tool_model):
    folder, which = tool_model
    for by_class in (True, False):  # by the class its config names (no torch import), and by AutoTokenizer
        _, tokenizer = load_first([str(folder)], by_class=by_class)
        encoder = ChatEncoder(tokenizer)
        for tools in ([PYTHON.schema], [PYTHON.schema, SEARCH]):
            for messages in CONVERSATIONS:
                ours = encoder.encode(messages, tools)[1]
                assert ours == server_ids(tool_vllm, messages, tools), (by_class, messages)
                assert ours != encoder.encode(messages)[1]  # the tools are in it
    # the turn after a tool call: our separator is the template's, as the server renders it
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    results = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "[stderr]\nboom"}]

    async def server_render(messages, tools=None):
        return server_ids(tool_vllm, messages, tools)

    local = asyncio.run(separator(tokenizer, results, {}, end, tools=[PYTHON.schema]))
    served = asyncio.run(separator(tokenizer, results, {}, end, server_render, tools=[PYTHON.schema]))
    assert local == served
    SUMMARY.append(
        f"real vLLM, tool rendering: {which}: 2 x 2 x {len(CONVERSATIONS)} prompts with tools and the "
        f"tool-turn separator render to vLLM's own /tokenize ids"
    )


class ForcingProxy(RecordingProxy):
    """A recording proxy that asks vLLM, through structured outputs, for a tool call on a first turn and for an
    answer after a tool result (agentroll's one-token start-up probes are left alone). It logs the request as
    sent on, and vLLM's answer as it came."""

    def __init__(self, upstream: str, tokenizer) -> None:
        super().__init__(upstream)
        self.tokenizer = tokenizer

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == COMPLETIONS:
            sent = json.loads(body)
            if sent.get("max_tokens", 16) > 1:
                prompt = self.tokenizer.decode(sent["prompt"])
                after_tool = "<tool_response>" in prompt or "<|im_start|>tool" in prompt
                sent["structured_outputs"] = {"regex": re.escape(ANSWER if after_tool else CALL)}
            body = json.dumps(sent).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method,
                self.upstream + request.path_qs,
                data=body or None,
                headers={"content-type": "application/json"},
            ) as answer,
        ):
            raw, status = await answer.read(), answer.status
        if request.path == COMPLETIONS and status == 200:
            self.log.append({"path": request.path, "request": json.loads(body), "response": json.loads(raw)})
        return web.Response(body=raw, status=status, content_type="application/json")


@pytest.mark.bwrap  # its python turn runs in the local sandbox
def test_a_tool_use_run_on_real_vllm_is_token_exact_through_a_tool_turn(tool_vllm, tool_model, tmp_path):
    folder, which = tool_model
    _, tokenizer = load_first([str(folder)])
    inputs = tmp_path / "p.jsonl"
    inputs.write_text(json.dumps({"id": "mul", "prompt": "What is 6 times 7?", "label": "42"}) + "\n")
    out = tmp_path / "out"
    with ForcingProxy(tool_vllm, tokenizer) as proxy:
        proc = run_cli(
            "generate",
            str(inputs),
            "-o",
            str(out),
            "--base-url",
            proxy.url,
            "--system",
            "tool-use",
            "--api",
            "completions",
            "--samples-per-prompt",
            "2",
            "--max-tokens",
            "200",
            "--seed",
            "4",
            "--reward",
            "math",
            timeout=900,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert check_exact(records, proxy.log, "completions", tokenizer) == len(records) == 4
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def server_render(messages, tools=None):
        return server_ids(tool_vllm, messages, tools)

    for first, second in zip(records[::2], records[1::2], strict=True):
        assert (first["turn"], second["turn"], second["continues"]) == (0, 1, 0)
        assert first["response"] == CALL and first["finish_reason"] == "stop" and first["response_token_ids"][-1] == end
        (call,) = first["tool_calls"]
        assert (call["name"], call["status"], call["result"]) == ("python", "ok", "42")
        head = first["prompt_token_ids"] + first["response_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head
        injected = second["prompt_token_ids"][len(head) :]
        assert injected == asyncio.run(
            separator(tokenizer, [{"role": "tool", "content": "42"}], {}, end, server_render, tools=[PYTHON.schema])
        )  # as vLLM renders it
        assert second["history_mask"] == [0] * len(first["prompt_token_ids"]) + [1] * len(
            first["response_token_ids"]
        ) + [0] * len(injected)
        assert second["response"] == ANSWER and second["raw_reward"] == 1.0 == first["raw_reward"]
    SUMMARY.append(
        f"real vLLM, tool-use with {which}: 2 conversations through a python tool turn, 4 records "
        f"token-exact (ids and logprobs vLLM's own), tool results injected as vLLM renders them"
    )
