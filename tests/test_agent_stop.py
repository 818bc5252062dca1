"""Stop sequences through the recording proxy, as ReAct harnesses send them (`stop=["\\nObservation:"]`): vLLM
ends the response at the token that completed a stop string (the record's ids hold it: what the server sampled),
the agent gets the text cut before the string (OpenAI's cut), and a request that goes on after it (the stop string
written back, then the observation) continues the call by ids, chat or completion alike."""

from __future__ import annotations

from typing import Any

from agentroll.render.chat import load_tokenizer

from .conftest import TOKENIZER
from .test_agent_proxy import USER, run, serve  # noqa: F401 (serve: the fixture)

QUESTION = "Question: What is 10 plus 7?\nThought:"


def test_a_react_loop_over_completions_stops_at_the_string_and_goes_on_by_ids(serve):  # noqa: F811
    server = serve()

    async def plan(client: Any, problem: dict) -> list[Any]:
        first = await client.completions.create(model="m", prompt=QUESTION, max_tokens=200, stop=["</think>"])
        text = first.choices[0].text
        going_on = QUESTION + text + "</think>\nObservation: 17\nThought:"
        second = await client.completions.create(model="m", prompt=going_on, max_tokens=200, stop="</think>")
        # a stop string the model's token overshoots (" step" completes " by st"): written back, it is no
        # continuation of what the model sampled, and is a branch
        third = await client.completions.create(model="m", prompt=QUESTION, max_tokens=200, stop=[" by st"])
        over = QUESTION + third.choices[0].text + " by st" + "\nObservation: 17\nThought:"
        await client.completions.create(model="m", prompt=over, max_tokens=4)
        return [first.choices[0], second.choices[0], third.choices[0]]

    (first, second, third), group = run(server, plan)
    records = group.executions[0]
    tokenizer = load_tokenizer(TOKENIZER)
    one = records[0]
    assert first.finish_reason == "stop" and first.model_extra["stop_reason"] == "</think>"
    assert one.stop_reason == "</think>" and one.finish_reason == "stop" and one.response == first.text
    assert "</think>" not in first.text and tokenizer.decode(one.response_token_ids[-1:]) == "</think>"
    assert records[1].continues == 0 and records[1].rerendered is False
    injected = tokenizer.encode("\nObservation: 17\nThought:", add_special_tokens=False)
    assert records[1].prompt_token_ids == one.prompt_token_ids + one.response_token_ids + injected
    assert records[1].history_mask == [0] * len(one.prompt_token_ids) + [1] * len(one.response_token_ids) + [0] * len(
        injected
    )
    assert second.text == records[1].response
    assert third.model_extra["stop_reason"] == " by st" and third.text.endswith("think step")
    assert tokenizer.decode(records[2].response_token_ids).endswith(" by step")  # the token that completed it
    assert records[3].continues is None and records[3].rerendered is True and records[3].branched_from == 2


def test_a_chat_agent_with_stop_sequences_gets_the_cut_content_and_continues_by_ids(serve):  # noqa: F811
    server = serve()

    async def plan(client: Any, problem: dict) -> list[Any]:
        stop = ["\\boxed"]
        first = await client.chat.completions.create(model="m", messages=USER, stop=stop)
        message = first.choices[0].message
        more = [*USER, message, {"role": "user", "content": "Observation: 17. Go on."}]
        streamed = await client.chat.completions.create(model="m", messages=more, stop=stop, stream=True)
        content = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
        return [first.choices[0], content]

    (first, content), group = run(server, plan)
    one, two = group.executions[0]
    assert first.finish_reason == "stop" and first.model_extra["stop_reason"] == "\\boxed"
    assert one.stop_reason == "\\boxed" and "\\boxed" not in one.response
    assert first.message.content and one.response.endswith(first.message.content)
    assert "\\boxed" in load_tokenizer(TOKENIZER).decode(one.response_token_ids)  # the ids hold what completed it
    assert two.continues == 0 and two.rerendered is False
    head = one.prompt_token_ids + one.response_token_ids
    assert two.prompt_token_ids[: len(head)] == head
    assert content and two.response.endswith(content) and "\\boxed" not in content


def test_stop_is_checked_before_it_is_sent(serve):  # noqa: F811
    server = serve()

    async def plan(client: Any, problem: dict) -> list[str]:
        said = []
        for stop in ("", [""], [1], ["x"] * 65, {"a": 1}):
            try:
                await client.chat.completions.create(model="m", messages=USER, stop=stop)
            except Exception as exc:  # the SDK's BadRequestError
                said.append(f"{type(exc).__name__}: {exc}")
        await client.chat.completions.create(model="m", messages=USER, stop=[])
        return said

    said, group = run(server, plan)
    assert len(said) == 5 and all(s.startswith("BadRequestError") and "`stop` must be" in s for s in said), said
    assert group.status == "complete" and len(group.executions[0]) == 1
