"""Agents the `--system agent` tests run: real clients (the `openai` SDK, the OpenAI Agents SDK, plain urllib), as
programs (their source below, written to a file by a test) and as async functions (`probe`, `sdk_run`,
`agents_run`, importable as `tests.agents_support:NAME`). Each calls the simulator through agentroll's proxy;
the simulated model calls the `python` tool and then answers with what the tool printed, so a right answer
proves the tool results reached the model."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and see what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def run_python(arguments: str) -> str:
    """What the simulated model's code (`print("V")`) prints."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(json.loads(arguments)["code"], {})
    return out.getvalue().strip()


COMMON = f"""
import contextlib, io, json, os, sys
PYTHON = {json.dumps(PYTHON)}

def run_python(arguments):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(json.loads(arguments)["code"], {{}})
    return out.getvalue().strip()

row = json.load(sys.stdin)
assert json.loads(os.environ["AGENTROLL_PROBLEM"]) == row
messages = [{{"role": "system", "content": "Use the python tool."}}, {{"role": "user", "content": row["prompt"]}}]
"""

# the openai SDK, synchronous: the assistant message object goes back as the SDK gives it
SDK_PROGRAM = (
    COMMON
    + """
from openai import OpenAI
client = OpenAI()
for _ in range(6):
    reply = client.chat.completions.create(model="anything", messages=messages, tools=[PYTHON], max_tokens=200)
    message = reply.choices[0].message
    messages.append(message)
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": run_python(call.function.arguments)})
print(message.content)
"""
)

# the openai SDK, streamed: the message is put together from the chunks, reasoning included
STREAM_PROGRAM = (
    COMMON
    + """
from openai import OpenAI
client = OpenAI()
for _ in range(6):
    content, reasoning, calls = "", "", {}
    for chunk in client.chat.completions.create(
        model="anything", messages=messages, tools=[PYTHON], stream=True, stream_options={"include_usage": True}
    ):
        if not chunk.choices:
            assert chunk.usage.completion_tokens > 0
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for part in delta.tool_calls or []:
            empty = {"id": part.id, "type": "function", "function": {"name": "", "arguments": ""}}
            slot = calls.setdefault(part.index, empty)
            slot["function"]["name"] += part.function.name or ""
            slot["function"]["arguments"] += part.function.arguments or ""
    message = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    messages.append(message)
    if not calls:
        break
    for call in message["tool_calls"]:
        printed = run_python(call["function"]["arguments"])
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": printed})
print(content)
"""
)

# plain HTTP (urllib), as a curl script would: it echoes the message it was sent back, keys and all
CURL_PROGRAM = (
    COMMON
    + """
import urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]

def post(path, body):
    request = urllib.request.Request(base + path, json.dumps(body).encode(), method="POST")
    request.add_header("Authorization", "Bearer " + key)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())

listed = urllib.request.Request(base + "/models", headers={"Authorization": "Bearer " + key})
with urllib.request.urlopen(listed) as answer:
    model = json.loads(answer.read())["data"][0]["id"]
assert model == os.environ["AGENTROLL_MODEL"]
for _ in range(6):
    answer = post("/chat/completions", {"model": model, "messages": messages, "tools": [PYTHON]})
    message = answer["choices"][0]["message"]
    messages.append(message)
    if not message.get("tool_calls"):
        break
    for call in message["tool_calls"]:
        printed = run_python(call["function"]["arguments"])
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": printed})
print(json.dumps({"answer": message["content"], "reward": 0.25}))
"""
)

# a harness that rewrites what it sends back: a proper continuation, then the same turn with the thinking
# stripped, with the question edited, and with the tool result dropped; each request is logged (REQUESTS)
REWRITER_PROGRAM = (
    CURL_PROGRAM.split("for _ in range(6):")[0]
    + """
log = open(os.environ["REQUESTS"], "a")

def chat(sent):
    log.write(json.dumps(sent) + "\\n")
    log.flush()
    return post("/chat/completions", {"model": model, "messages": sent, "tools": [PYTHON]})["choices"][0]["message"]

first = chat(messages)
calls = first.get("tool_calls") or []
follow = [{"role": "tool", "tool_call_id": c["id"], "content": run_python(c["function"]["arguments"])} for c in calls]
follow = follow or [{"role": "user", "content": "Are you sure?"}]
chat(messages + [first] + follow)  # continues the first call
bare = {k: v for k, v in first.items() if k not in ("reasoning", "reasoning_content")}
chat(messages + [bare] + follow)  # thinking stripped
edited = [messages[0], {"role": "user", "content": messages[1]["content"] + " Be brief."}]
chat(edited + [first] + follow)  # the question edited
last = chat(messages + [first])  # the tool result dropped: continues the first call with no new message
print(last["content"])
"""
)

CRASH_PROGRAM = """
import sys
print("starting", file=sys.stderr)
print("Traceback (most recent call last):", file=sys.stderr)
print("RuntimeError: the harness fell over", file=sys.stderr)
sys.exit(3)
"""

# a program that leaves a child behind and never ends: its group is killed at the timeout
HANG_PROGRAM = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["CHILD_PID"], "w").write(str(child.pid))
time.sleep(600)
"""

# the OpenAI Agents SDK with every default: the Responses API, the SDK's own client from OPENAI_BASE_URL / _API_KEY
AGENTS_SDK_PROGRAM = """
import json, sys
from agents import Agent, Runner, function_tool

@function_tool
def python(code: str) -> str:
    \"\"\"Run Python code and see what it prints.

    Args:
        code: the program
    \"\"\"
    import contextlib, io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    return out.getvalue().strip()

row = json.load(sys.stdin)
agent = Agent(name="solver", instructions="Use the python tool.", tools=[python])
print(Runner.run_sync(agent, row["prompt"]).final_output)
"""

# -- functions ------------------------------------------------------------------------------------------------------
PLAN: Callable[[Any, dict[str, Any]], Awaitable[Any]] | None = None  # a test's own body for `probe`


async def probe(client: Any, problem: dict[str, Any]) -> Any:
    """Runs the test's `PLAN` with the proxy-bound client."""
    assert PLAN is not None
    return await PLAN(client, problem)


async def sdk_run(client: Any, problem: dict[str, Any]) -> str:
    """The openai SDK, asynchronous, the message objects sent back as they are."""
    messages: list[Any] = [{"role": "user", "content": problem["prompt"]}]
    for _ in range(6):
        reply = await client.chat.completions.create(model="m", messages=messages, tools=[PYTHON])
        message = reply.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_python(call.function.arguments)})
    return str(message.content)


async def agents_run(client: Any, problem: dict[str, Any]) -> str:
    """The OpenAI Agents SDK: one agent, a function tool, over chat completions, tracing off."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def python(code: str) -> str:
        """Run Python code and see what it prints.

        Args:
            code: the program
        """
        return run_python(json.dumps({"code": code}))

    agent = Agent(
        name="solver",
        instructions="Use the python tool.",
        tools=[python],
        model=OpenAIChatCompletionsModel(model="m", openai_client=client),
    )
    result = await Runner.run(agent, problem["prompt"])
    return str(result.final_output)


async def responses_run(client: Any, problem: dict[str, Any]) -> str:
    """The OpenAI Agents SDK over its default Responses API (`OpenAIResponsesModel`), streamed when the row says."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def python(code: str) -> str:
        """Run Python code and see what it prints.

        Args:
            code: the program
        """
        return run_python(json.dumps({"code": code}))

    model = OpenAIResponsesModel(model="m", openai_client=client)
    agent = Agent(name="solver", instructions="Use the python tool.", tools=[python], model=model)
    if problem.get("stream"):
        streamed = Runner.run_streamed(agent, problem["prompt"])
        async for _ in streamed.stream_events():
            pass
        return str(streamed.final_output)
    result = await Runner.run(agent, problem["prompt"])
    return str(result.final_output)
