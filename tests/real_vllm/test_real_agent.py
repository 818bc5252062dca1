"""`--system agent` against a real vLLM (the tiny model with Qwen3's chat template): the proxy renders an agent's
OpenAI messages (tool calls, reasoning, content parts, tool results) to the ids vLLM's own chat endpoint renders,
and an agent program written for the `openai` SDK is recorded token-exact end to end through a tool turn.

The tiny model is random, so, as in test_real_tool_use.py, structured outputs ask it for a tool call on the
first turn and an answer after the tool's result; the ids and logprobs are vLLM's own."""

from __future__ import annotations

import asyncio
import sys

import pytest

from agentroll.agents.messages import for_template
from agentroll.context.turns import separator
from agentroll.render.chat import ChatEncoder, load_first, vllm_tools

from .. import agents_support as support
from ..conftest import read_records, run_cli
from .conftest import SUMMARY
from .test_real_tool_use import ANSWER, CALL, ForcingProxy, server_ids
from .test_real_vllm import check_exact

ASKED = [
    {"role": "system", "content": "Use the python tool."},
    {"role": "user", "content": "What is 6 times 7?"},
]
CALLED = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "I will compute it.",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(6 * 7)"}'}}
    ],
}
OPENAI_CONVERSATIONS = [
    [*ASKED, CALLED, {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    [*ASKED, {"role": "assistant", "content": "It is 42.", "reasoning": "Easy."}, {"role": "user", "content": "Sure?"}],
    [{"role": "user", "content": [{"type": "text", "text": "What is"}, {"type": "text", "text": "6 times 7?"}]}],
    [
        *ASKED,
        {
            "role": "assistant",
            "content": "Two runs.",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "python", "arguments": '{ "code" : "print(1)" }'}},
                {"id": "b", "type": "function", "function": {"name": "python", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "name": "python", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "name": "python", "content": "error: no code"},
    ],
]


def chat_endpoint(message: dict) -> dict:
    """A message as vLLM's /v1/chat/completions reads it before rendering: `reasoning_content` renamed
    `reasoning` (its request model does that; /tokenize's does not, and would drop the reasoning)."""
    out = dict(message)
    if "reasoning_content" in out:
        out["reasoning"] = out.pop("reasoning_content")
    return out


@pytest.fixture(scope="module")
def qwen3_vllm(tools_vllm: tuple[object, str]) -> str:
    return tools_vllm[1]


def test_the_proxy_renders_an_agents_openai_messages_as_vllm_does(qwen3_vllm, tool_model):
    folder, which = tool_model
    _, tokenizer = load_first([str(folder)])
    encoder = ChatEncoder(tokenizer)
    tools = vllm_tools([support.PYTHON])
    for messages in OPENAI_CONVERSATIONS:
        ours = encoder.encode([for_template(m, i) for i, m in enumerate(messages)], tools)[1]
        assert ours == server_ids(qwen3_vllm, [chat_endpoint(m) for m in messages], [support.PYTHON]), messages
    SUMMARY.append(
        f"real vLLM, agent messages with {which}: {len(OPENAI_CONVERSATIONS)} OpenAI conversations render alike"
    )


def test_an_agent_program_on_real_vllm_is_recorded_token_exact_through_a_tool_turn(qwen3_vllm, tool_model, tmp_path):
    folder, which = tool_model
    _, tokenizer = load_first([str(folder)])
    inputs = tmp_path / "p.jsonl"
    inputs.write_text('{"id": "mul", "prompt": "What is 6 times 7?", "label": "42"}\n')
    agent = tmp_path / "agent.py"
    agent.write_text(support.SDK_PROGRAM)
    out = tmp_path / "out"
    with ForcingProxy(qwen3_vllm, tokenizer) as proxy:
        proc = run_cli(
            "generate", str(inputs), "-o", str(out), "--base-url", proxy.url, "--system", "agent",
            "--system-option", f"command={sys.executable} {agent}", "--api", "completions",
            "--samples-per-prompt", "2", "--seed", "4", "--reward", "math", timeout=900,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert check_exact(records, proxy.log, "completions", tokenizer) == len(records) == 4
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def server_render(messages, tools=None):
        return server_ids(qwen3_vllm, messages, tools)

    for first, second in zip(records[::2], records[1::2], strict=True):
        assert first["response"] == CALL and second["response"] == ANSWER
        (call,) = first["tool_calls"]
        assert (call["name"], call["status"], call["result"]) == ("python", "ok", "42")  # the agent ran it
        assert (second["continues"], second["turn"], second["rerendered"]) == (0, 1, False)
        head = first["prompt_token_ids"] + first["response_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head
        result = {"role": "tool", "tool_call_id": call["id"], "content": "42"}
        injected = asyncio.run(separator(tokenizer, [result], {}, end, server_render, tools=[support.PYTHON]))
        assert second["prompt_token_ids"][len(head) :] == injected  # as vLLM renders the tool's turn
        assert second["raw_reward"] == 1.0 == first["raw_reward"] and "\\boxed{42}" in second["agent_answer"]
    SUMMARY.append(
        f"real vLLM, an openai-SDK agent program with {which}: 2 executions through a tool turn, 4 records "
        "token-exact, the second call continuing the first by vLLM's own ids"
    )
