"""The recording proxy of `--system agent` as an OpenAI client meets it: what is honoured, what is refused (400),
credentials, `n`, logprobs, `/v1/completions` and its continuations, tool-call parsing, failures, and the journal
keyed by what is asked. Each test's agent is an async function (`tests.agents_support:probe` running the test's
own body) with the `openai` SDK's client bound to the proxy, in a `Generator` against the simulator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from agentroll import Generator
from agentroll.render.chat import load_tokenizer
from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import SimServer

from . import agents_support as support
from .conftest import TOKENIZER, generations, write_problems

QUIET = {name: 0 for name in ("truncate", "no_think_close", "empty_after_think", "tool_again", "tool_parallel")}
QUIET |= {name: 0 for name in ("tool_malformed", "tool_unknown", "tool_code_crash", "tool_code_loop")}
ROW = {"id": "p000", "prompt": "What is 10 plus 7?", "label": "17"}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[SimServer] = []

    def start(**behavior: float) -> SimServer:
        problems = write_problems(tmp_path / "p.jsonl", 1)
        server = SimServer(script=Script.from_jsonl(problems, Behavior(**{**QUIET, "correct": 1.0, **behavior})))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def run(server: SimServer, plan: Any, journal: Path | None = None, **options: Any) -> tuple[Any, list[Any]]:
    """One group of the row, the agent running `plan(client, problem)`: (its return value, the group)."""
    seen: list[Any] = []

    async def body(client: Any, problem: dict) -> Any:
        seen.append(await plan(client, problem))
        return "done"

    async def go() -> Any:
        support.PLAN = body
        settings = {"seed": 3, "max_tokens": 256, "reward": "exact", **options}
        settings["system_option"] = ["agent=tests.agents_support:probe", *settings.get("system_option", [])]
        async with Generator(
            base_url=server.url, tokenizer=TOKENIZER, system="agent", journal=journal, **settings
        ) as gen:
            return await gen.run_group(ROW)

    group = asyncio.run(go())
    return (seen[0] if seen else None), group


USER = [{"role": "user", "content": ROW["prompt"]}]


async def raw(client: Any, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    """A request as curl would send it, to the proxy the client is bound to."""
    headers = {"Authorization": f"Bearer {key or client.api_key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{str(client.base_url).rstrip('/')}{path}", json=body, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


# -- refused, honoured ----------------------------------------------------------------------------------------------
REFUSED = [
    ({"stop_token_ids": [5]}, "`stop_token_ids` is not served: stop token ids are not served"),
    ({"stop": ["x"], "include_stop_str_in_output": True}, "`include_stop_str_in_output` is not served"),
    ({"seed": 1}, "`seed` is not served: the run gives each call its own seed"),
    ({"tool_choice": "required"}, "`tool_choice` other than auto or none is not served"),
    ({"response_format": {"type": "json_object"}}, "`response_format` is not served"),
    ({"presence_penalty": 0.5}, "`presence_penalty` is not served: it would change what is sampled"),
    ({"logit_bias": {"12": 3}}, "`logit_bias` is not served"),
    ({"parallel_tool_calls": False}, "`parallel_tool_calls` is not served"),
    ({"frobnicate": 1}, "`frobnicate` is not served: agentroll cannot honour it exactly"),
    ({"logprobs": True, "top_logprobs": 3}, "3 alternatives per token asked, the run keeps 0"),
    ({"chat_template_kwargs": {"enable_thinking": False}}, "set them with generate --chat-template-kwargs"),
    ({"temperature": -1}, "`temperature` must be 0 or more, got -1"),
    ({"n": 0}, "`n` must be a whole number from 1 to 128"),
    ({"messages": []}, "`messages` must be a non-empty list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "agentroll's proxy serves text only"),
    (  # a message given as a content part (a row's chat prompt put in a user message's content): no image
        {"messages": [{"role": "user", "content": [{"role": "user", "content": "hi"}]}]},
        'messages.0: content part 0 is no text part {"type": "text", "text": "..."} (its keys: '
        "['content', 'role'])",
    ),
]


def test_what_cannot_be_served_exactly_is_refused_with_a_400_naming_it(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> list[str]:
        said = []
        for extra, _ in REFUSED:
            body = {"model": "m", "messages": USER, **extra}
            status, answer = await raw(client, "POST", "/chat/completions", body)
            assert status == 400, (extra, answer)
            said.append(answer["error"]["message"])
        neutral = {"presence_penalty": 0, "stop": [], "parallel_tool_calls": True, "user": "u", "store": False}
        reply = await client.chat.completions.create(model="gpt-4o", messages=USER, temperature=0.5, **neutral)
        assert reply.model == server.model  # the run's model, whatever the agent named
        return said

    said, group = run(server, plan)
    for (_, expected), message in zip(REFUSED, said, strict=True):
        assert expected in message
    (only,) = group.executions[0]
    assert group.status == "complete" and only.sampling["temperature"] == 0.5


def test_a_function_agent_runs_with_the_agents_sdk_tracing_off_unless_set(serve, monkeypatch):
    """As a program is started with OPENAI_AGENTS_DISABLE_TRACING=1, so a function runs with it (in agentroll's
    own process, where OPENAI_API_KEY may be the user's real key): the Agents SDK sends no traces to OpenAI."""
    server = serve()
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)

    async def plan(client: Any, problem: dict) -> str | None:
        await client.chat.completions.create(model="m", messages=USER)
        return os.environ.get("OPENAI_AGENTS_DISABLE_TRACING")

    assert run(server, plan)[0] == "1"
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "0")  # the user's own choice stands
    assert run(server, plan)[0] == "0"


def test_credentials_paths_and_the_model_list(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> tuple:
        models = await client.models.list()
        with pytest.raises(openai.AuthenticationError, match="unknown or expired API key"):
            await client.with_options(api_key="someone-else").chat.completions.create(model="m", messages=USER)
        missing = await raw(client, "POST", "/embeddings", {"model": "m", "input": "hi"})
        await client.chat.completions.create(model="m", messages=USER)
        return [m.id for m in models.data], missing

    (listed, missing), group = run(server, plan)
    assert listed == [server.model]
    assert missing[0] == 404 and "/v1/responses" in missing[1]["error"]["message"]
    assert group.status == "complete"


def test_a_credential_is_refused_once_its_execution_has_ended(serve):
    server = serve()
    kept: list[Any] = []

    async def plan(client: Any, problem: dict) -> None:
        kept.append((str(client.base_url), client.api_key))
        await client.chat.completions.create(model="m", messages=USER)

    async def go() -> tuple[int, int]:
        support.PLAN = lambda client, problem: plan(client, problem)
        async with Generator(
            base_url=server.url, tokenizer=TOKENIZER, system="agent", system_option=["agent=tests.agents_support:probe"]
        ) as gen:
            await gen.run_group(ROW)
            url, key = kept[0]
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"{url.rstrip('/')}/models", headers={"Authorization": f"Bearer {key}"}) as answer,
            ):
                return answer.status, len(kept)

    assert asyncio.run(go()) == (401, 1)


def test_n_choices_are_calls_of_their_own_and_a_request_continues_the_one_it_extends(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> list[Any]:
        first = await client.chat.completions.create(model="m", messages=USER, n=3)
        picked = first.choices[2].message
        more = [*USER, picked, {"role": "user", "content": "Check it once more."}]
        await client.chat.completions.create(model="m", messages=more)
        return [(c.message.reasoning_content, c.message.content) for c in first.choices]

    said, group = run(server, plan)
    records = group.executions[0]
    assert len(records) == 4 and len({r.sampling["seed"] for r in records}) == 4
    assert len({r.worker for r in records}) == 4
    reasoning, content = said[2]
    picked = records[3].continues
    assert picked in (0, 1, 2) and records[3].turn == 1 and records[3].rerendered is False
    assert records[picked].response.endswith(content) and reasoning in records[picked].response
    head = records[picked].prompt_token_ids + records[picked].response_token_ids
    assert records[3].prompt_token_ids[: len(head)] == head


def test_logprobs_and_token_ids_are_the_records_own(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> Any:
        return await client.chat.completions.create(
            model="m", messages=USER, logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True}
        )

    reply, group = run(server, plan, logprobs=2)
    (record,) = group.executions[0]
    choice = reply.choices[0]
    assert choice.model_extra["token_ids"] == record.response_token_ids
    assert reply.model_extra["prompt_token_ids"] == record.prompt_token_ids
    assert [t.logprob for t in choice.logprobs.content] == record.response_logprobs
    assert [[a.logprob for a in t.top_logprobs] for t in choice.logprobs.content] == record.top_logprobs
    tokenizer = load_tokenizer(TOKENIZER)
    assert "".join(t.token for t in choice.logprobs.content) == tokenizer.decode(record.response_token_ids)
    assert reply.usage.prompt_tokens == len(record.prompt_token_ids)
    assert reply.usage.completion_tokens == len(record.response_token_ids)


# -- tool calls -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("behavior", "choice", "status"),
    [
        ({"tool_call": 1.0}, "auto", "ok"),
        ({"tool_call": 1.0}, "none", None),
        ({"tool_call": 1.0, "tool_malformed": 1.0}, "auto", "malformed"),
        ({"tool_call": 1.0, "tool_unknown": 1.0}, "auto", "unknown"),
    ],
)
def test_tool_calls_are_read_as_vllm_reads_them(behavior, choice, status, serve):
    server = serve(**behavior)

    async def plan(client: Any, problem: dict) -> Any:
        return await client.chat.completions.create(
            model="m", messages=USER, tools=[support.PYTHON], tool_choice=choice
        )

    reply, group = run(server, plan)
    (record,) = group.executions[0]
    message, finish = reply.choices[0].message, reply.choices[0].finish_reason
    assert message.reasoning_content and message.reasoning_content in record.response
    if status in ("ok", "unknown"):
        (call,) = message.tool_calls
        assert finish == "tool_calls" and message.content is None
        assert record.tool_calls == [
            {
                "id": call.id,
                "name": call.function.name,
                "arguments": json.loads(call.function.arguments),
                "result": None,
                "duration_s": None,
                "error": None if status == "ok" else "not among the request's tools",
                "status": status,
            }
        ]
    else:  # not read (tool_choice none), or unreadable: the text goes back as it is
        assert finish == "stop" and not message.tool_calls and "<tool_call>" in message.content
        assert (record.tool_calls or [{}])[0].get("status") == status


# -- /v1/completions ------------------------------------------------------------------------------------------------
def test_completions_continue_by_ids_when_the_prompt_extends_a_call_whole(serve):
    server = serve()
    prompt, other = "Question: What is 10 plus 7?\nAnswer:", "Question: what is 10 plus 7? Think first.\nAnswer:"

    async def plan(client: Any, problem: dict) -> list[Any]:
        cut = await client.completions.create(model="m", prompt=prompt, max_tokens=6)
        text = prompt + cut.choices[0].text + " So"
        more = await client.completions.create(model="m", prompt=text, max_tokens=6)
        done = await client.completions.create(
            model="m", prompt=other, max_tokens=200, extra_body={"return_token_ids": True}
        )
        whole = done.choices[0].model_extra["prompt_token_ids"] + done.choices[0].model_extra["token_ids"]
        by_ids = await client.completions.create(model="m", prompt=[*whole, 13], max_tokens=4)
        again = other + done.choices[0].text + " And"
        stream = await client.completions.create(
            model="m", prompt=again, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        assert by_ids.usage.prompt_tokens == len(whole) + 1 and more.choices[0].text
        return [cut, done, chunks]

    (cut, done, chunks), group = run(server, plan)
    records = group.executions[0]
    assert [r.continues for r in records] == [None, 0, None, 2, None]
    assert cut.choices[0].finish_reason == "length" and done.choices[0].finish_reason == "stop"
    tokenizer = load_tokenizer(TOKENIZER)
    first, second = records[0], records[1]
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids == head + tokenizer.encode(" So", add_special_tokens=False)
    assert second.history_mask == [0] * len(first.prompt_token_ids) + [1] * len(first.response_token_ids) + [0]
    assert records[3].prompt_token_ids[-1] == 13 and records[3].history_mask[-1] == 0
    # the answer ended on its stop token, which its text does not hold: the text cannot go on by ids
    assert records[4].rerendered is True and records[4].branched_from is not None
    assert chunks[-1].usage.completion_tokens == len(records[4].response_token_ids)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == records[4].response


# -- failures, the journal ------------------------------------------------------------------------------------------
def test_a_call_that_fails_for_good_fails_the_execution_even_if_the_agent_goes_on(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> str:
        await client.chat.completions.create(model="m", messages=USER)
        server.faults.error_rate = 1.0
        with pytest.raises(openai.InternalServerError, match="the call failed for good"):
            await client.chat.completions.create(model="m", messages=[*USER, {"role": "user", "content": "Again?"}])
        return "caught"

    said, group = run(server, plan, max_retries=0)
    assert said == "caught" and group.status == "failed" and "agent call failed" in group.error


def test_the_journal_replays_by_what_is_asked_whatever_the_order(serve, tmp_path):
    """Three conversations at once, each a tool call and its result; after a stop the agent asks them again in
    another order, and each call is answered from the journal with what the server said the first time (the tool
    calls' ids with it, so the requests that send the results back are the same again)."""
    server = serve(tool_call=1.0)
    questions = [[{"role": "user", "content": f"What is 10 plus {n}?"}] for n in (7, 8, 9)]

    async def conversation(client: Any, asked: list[dict]) -> str:
        first = (await client.chat.completions.create(model="m", messages=asked, tools=[support.PYTHON])).choices[0]
        results = [{"role": "tool", "tool_call_id": c.id, "content": "17"} for c in first.message.tool_calls]
        more = [*asked, first.message, *results]
        second = await client.chat.completions.create(model="m", messages=more, tools=[support.PYTHON])
        return str(second.choices[0].message.content)

    def asking(order: list[int]) -> Any:
        async def plan(client: Any, problem: dict) -> dict[int, str]:
            replies = await asyncio.gather(*(conversation(client, questions[i]) for i in order))
            return dict(zip(order, replies, strict=True))

        return plan

    journal = tmp_path / "journal"
    first, _ = run(server, asking([0, 1, 2]), journal=journal, samples_per_prompt=1, filter_uniform_groups=False)
    asked = len(generations(server))
    # the group was not settled (nothing stored it): its calls stay in the journal
    again, group = run(server, asking([2, 0, 1]), journal=journal)
    assert again == first and len(generations(server)) == asked and group.status == "complete"
    assert [r.continues is not None for r in group.executions[0]].count(True) == 3


def test_a_function_that_calls_sys_exit_fails_its_execution_not_the_run(serve):
    """A harness turned into a function may still end with sys.exit on an error: that fails its execution (an
    agent that crashed), it does not end agentroll with the agent's exit code."""
    server = serve()

    async def plan(client: Any, problem: dict) -> None:
        await client.chat.completions.create(model="m", messages=USER)
        sys.exit(3)

    _, group = run(server, plan, system_option=["on_error=fail"])
    assert group.status == "failed" and "the agent raised SystemExit(3)" in group.error
    _, group = run(server, plan)  # the default: the execution kept, scored as the model's failure
    (record,) = group.executions[0]
    assert group.status == "complete" and record.agent_error.startswith("the agent raised SystemExit(3)")


def test_max_agents_bounds_the_agents_running_at_once(serve):
    server = serve()
    running, peak = [0], [0]

    async def plan(client: Any, problem: dict) -> None:
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await client.chat.completions.create(model="m", messages=USER)
        finally:
            running[0] -= 1

    _, group = run(server, plan, samples_per_prompt=5, system_option=["max_agents=2"])
    assert group.status == "complete" and len(group.executions) == 5 and peak[0] == 2


def test_a_prompt_that_leaves_no_room_is_a_400_as_vllms_context_length_error(serve):
    server = serve()

    async def plan(client: Any, problem: dict) -> str:
        long = [{"role": "user", "content": "seven " * 5000}]
        with pytest.raises(openai.BadRequestError, match=f"maximum context length is {server.max_model_len} tokens"):
            await client.chat.completions.create(model="m", messages=long)
        await client.chat.completions.create(model="m", messages=USER)
        return "went on"

    said, group = run(server, plan)
    assert said == "went on" and group.status == "complete" and len(group.executions[0]) == 1
