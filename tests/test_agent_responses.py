"""The Responses API on the recording proxy, as the OpenAI Agents SDK speaks it with its defaults: input items
(messages, reasoning, function calls and their outputs), function tools, `previous_response_id`, output items in
OpenAI's wire format, whole and streamed; a turn given back as it was answered continues the call by ids."""

from __future__ import annotations

import json
from typing import Any

from . import agents_support as support
from .conftest import read_records
from .test_agent_proxy import USER, raw, run, serve  # noqa: F401 (serve: the fixture)
from .test_agents import check_exact, executions, generate, problems, program, report, server  # noqa: F401


def test_an_unmodified_agents_sdk_program_runs_over_the_responses_api_token_exact(problems, server, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    code, output = generate(problems, out, server.url, "--system-option", program(tmp_path, support.AGENTS_SDK_PROGRAM))
    assert code == 0, output
    records = read_records(out)
    assert check_exact(records, server) == 2  # the answer continues the tool call by ids, reasoning and all
    for first, answer in executions(records):
        assert first["tool_calls"][0]["status"] == "ok" and first["tool_calls"][0]["result"] == first["label"]
        assert answer["continues"] == 0 and answer["raw_reward"] == 1.0
    assert report(out)["branches_per_execution"] == 0.0


def test_the_agents_sdk_over_responses_streamed_or_not_continues_by_ids(problems, server, tmp_path):  # noqa: F811
    for stream in (False, True):
        rows = tmp_path / f"rows{stream}.jsonl"
        lines = [json.loads(line) for line in problems.read_text().splitlines()]
        rows.write_text("".join(json.dumps({**row, "stream": stream}) + "\n" for row in lines))
        out = tmp_path / f"out{stream}"
        code, output = generate(rows, out, server.url, "--system-option", "agent=tests.agents_support:responses_run")
        assert code == 0, output
        records = read_records(out)
        assert check_exact(records, server) == 2, stream
        assert all(r["raw_reward"] == 1.0 for r in records)


def test_responses_items_previous_response_id_and_refusals(serve):  # noqa: F811
    sim = serve(tool_call=1.0)

    async def plan(client: Any, problem: dict) -> list[Any]:
        tool = {"type": "function", "name": "python", "parameters": support.PYTHON["function"]["parameters"]}
        first = await client.responses.create(model="m", input=problem["prompt"], tools=[tool], instructions="Hi.")
        kinds = [item.type for item in first.output]
        (call,) = [item for item in first.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "17"}
        second = await client.responses.create(
            model="m", previous_response_id=first.id, input=[output], tools=[tool], instructions="Hi."
        )
        refused = []
        for extra in (
            {"tools": [{"type": "web_search"}]},
            {"previous_response_id": "resp_nope"},
            {"text": {"format": {"type": "json_object"}}},
            {"tool_choice": "required"},
            {"input": [{"type": "image_generation_call", "id": "x"}]},
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            {"frobnicate": 1},
        ):
            status, answer = await raw(client, "POST", "/responses", {"model": "m", "input": "hi", **extra})
            refused.append((status, answer["error"]["message"]))
        return [first, kinds, second, refused]

    (first, kinds, second, refused), group = run(sim, plan)
    one, two = group.executions[0]
    assert kinds == ["reasoning", "function_call"] and first.status == "completed"
    assert first.usage.input_tokens == len(one.prompt_token_ids)
    assert first.usage.output_tokens == len(one.response_token_ids)
    assert first.output[0].content[0].text in one.response  # the reasoning, as the model wrote it
    assert two.continues == 0 and two.rerendered is False  # previous_response_id: the held turn, by ids
    assert two.prompt.count("Hi.") == 1  # the instructions given anew, not carried over from the first
    assert second.output_text and second.output_text in two.response
    assert [s for s, _ in refused] == [400] * 7, refused
    said = " ".join(m for _, m in refused)
    for name in (
        "'web_search' tool",
        "resp_nope",
        "`text`",
        "`tool_choice`",
        "'image_generation_call' item",
        "input_image",
        "`frobnicate`",
    ):
        assert name in said, (name, said)
