"""The pieces of `--system agent` on their own: how messages compare whatever a client's serializer did to them,
which call a request continues, how an answer is read for the agent, and how an agent's output becomes its
answer and reward."""

from __future__ import annotations

import asyncio

import pytest

from agentroll import Generator
from agentroll.agents.history import Chat, History, Text
from agentroll.agents.launch import AgentFailed, Outcome, outcome_of, tail_line
from agentroll.agents.messages import BadRequest, canonical, for_server, for_template
from agentroll.agents.replies import answer_of
from agentroll.agents.requests import chat_request
from agentroll.record.schema import Sample
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.toolcalls import parser_for

from . import agents_support as support
from .conftest import TOKENIZER, write_problems

CALL = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(1)"}'}}
ANSWER = {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "think"}


def test_a_message_compares_equal_however_a_client_serialized_it():
    spaced = {**CALL, "function": {"name": "python", "arguments": '{ "code" : "print(1)" }'}}
    variants = [
        ANSWER,
        {**ANSWER, "refusal": None, "audio": None, "function_call": None, "annotations": None},
        {"role": "assistant", "content": "", "tool_calls": [spaced], "reasoning": "think"},
        {"role": "assistant", "content": [], "tool_calls": [CALL], "reasoning": "think", "reasoning_content": None},
    ]
    assert len({str(canonical(v)) for v in variants}) == 1
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert canonical(parts) == {"role": "user", "content": "a\nb"}  # joined as vLLM joins text parts
    assert canonical({**ANSWER, "reasoning_content": None}) != canonical(ANSWER)  # the thinking was stripped


def test_the_template_gets_messages_as_vllm_hands_them_over_and_the_server_as_openai_sends_them():
    shown = for_template(ANSWER)
    assert shown["content"] == "" and shown["reasoning"] == shown["reasoning_content"] == "think"
    assert shown["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "python", "arguments": {"code": "print(1)"}}}
    ]
    broken = {**CALL, "function": {"name": "python", "arguments": "{not json"}}
    assert for_template({**ANSWER, "tool_calls": [broken]})["tool_calls"][0]["function"]["arguments"] == {}
    assert for_server(ANSWER)["tool_calls"][0]["function"]["arguments"] == '{"code": "print(1)"}'
    with pytest.raises(BadRequest, match=r"messages\.0: a message is an object with a string `role`"):
        canonical({"content": "no role"})


def chat(position: int, messages: list[dict], answer: dict) -> Chat:
    return Chat(position, "key", [canonical(m) for m in messages], canonical(answer))


def test_a_request_continues_the_longest_call_it_extends_and_branches_otherwise():
    user, tool = {"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "c1", "content": "1"}
    final = {"role": "assistant", "content": "done", "reasoning": "ok"}
    history = History()
    history.add_chat(chat(0, [user], ANSWER))
    history.add_chat(chat(1, [user, ANSWER, tool], final))
    found = history.find_chat("key", [canonical(m) for m in [user, ANSWER, tool, final, user]])
    assert (found.parent, found.tail, found.rerendered) == (1, [canonical(user)], False)
    assert history.find_chat("other key", [canonical(user), canonical(ANSWER)]).parent is None  # tools changed
    stripped = {**ANSWER, "reasoning_content": None}
    found = history.find_chat("key", [canonical(m) for m in [user, stripped, tool]])
    assert (found.parent, found.rerendered, found.branched_from) == (None, True, 1)  # shares [user] with call 1
    lenient = History(thinking="continue")
    lenient.add_chat(chat(0, [user], ANSWER))
    found = lenient.find_chat("key", [canonical(m) for m in [user, stripped, tool]])
    assert (found.parent, found.stripped) == (0, True)
    fresh = history.find_chat("key", [canonical({"role": "user", "content": "another question"})])
    assert (fresh.parent, fresh.rerendered, fresh.branched_from) == (None, False, None)


def test_a_completion_continues_by_ids_and_by_text_only_where_the_text_holds_every_token():
    history = History()
    history.add_text(Text(0, "Q:", [1, 2], [3, 4], " A", whole=True))
    history.add_text(Text(1, "R:", [5], [6, 7], " B", whole=False))  # ended on a stop token its text omits
    assert history.find_text("Q: A and").parent == 0 and history.find_text("Q: A and").tail == " and"
    assert history.find_text([1, 2, 3, 4, 9]).tail == [9]
    assert history.find_text([5, 6, 7]).parent == 1  # ids hold the stop token: they go on
    branch = history.find_text("R: B more")
    assert (branch.parent, branch.branched_from, branch.rerendered) == (None, 1, True)


def sample(response: str, finish: str = "stop") -> Sample:
    fields = {name: None for name in Sample.__dataclass_fields__ if name not in ("response", "finish_reason")}
    return Sample(**{**fields, "response": response, "finish_reason": finish})  # type: ignore[arg-type]


TOOLS = chat_request(
    {
        "messages": [{"role": "user", "content": "q"}],
        "tools": [{"type": "function", "function": {"name": "python", "parameters": {}}}],
    },
    0,
    {},
).tools


@pytest.mark.parametrize(
    ("parser", "text", "content"),
    [
        (
            "hermes",
            'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>',
            "Let me run it.",
        ),
        ("llama3_json", '{"name": "python", "parameters": {"code": "1"}}', None),
        ("mistral", 'Sure. [TOOL_CALLS] [{"name": "python", "arguments": {"code": "1"}, "id": "abcdefghi"}]', "Sure."),
    ],
)
def test_an_answer_is_read_for_the_agent_with_each_parser(parser, text, content):
    found = answer_of(
        sample("<think>\nhmm\n</think>\n\n" + text),
        think=True,
        parse=parser_for(parser),
        tools=TOOLS,
        tool_choice="auto",
        where=(1, "p", 0, 0, 0),
    )
    assert (found.reasoning, found.content, found.finish_reason) == ("hmm", content, "tool_calls")
    (call,) = found.tool_calls
    assert call["function"] == {"name": "python", "arguments": '{"code": "1"}'}
    assert call["id"] == ("abcdefghi" if parser == "mistral" else found.recorded[0]["id"]) and len(call["id"]) == 9
    cut = answer_of(
        sample("<think>never closed", "length"),
        think=True,
        parse=parser_for(parser),
        tools=TOOLS,
        tool_choice="auto",
        where=(),
    )
    assert (cut.reasoning, cut.content, cut.finish_reason, cut.tool_calls) == (
        None,
        "<think>never closed",
        "length",
        [],
    )


@pytest.mark.parametrize(
    ("output", "outcome"),
    [
        (b"working...\n42\n", Outcome("42")),
        (b'log line\n{"answer": "\\\\boxed{7}", "reward": 1}\n', Outcome("\\boxed{7}", 1.0)),
        (b'{\n  "answer": 7,\n  "reward": 0.5\n}\n', Outcome("7", 0.5)),
        (b"", Outcome(None)),
    ],
)
def test_a_programs_output_is_its_answer_and_reward(output, outcome):
    assert outcome_of(output) == outcome


def test_a_function_returns_its_answer_and_a_bad_reward_fails_it():
    assert outcome_of({"answer": "x", "reward": 0}) == Outcome("x", 0.0)
    assert outcome_of(7) == Outcome("7")
    with pytest.raises(AgentFailed, match="its reward must be a finite number, got 'high'"):
        outcome_of({"answer": "x", "reward": "high"})
    with pytest.raises(AgentFailed, match='without "answer"'):
        outcome_of({"result": "x"})
    assert tail_line(b"a\n\nb\nc\nd\ne\n") == "b | c | d | e"


def test_an_agent_gets_the_rows_prompt_as_messages_whichever_form_it_came_in(tmp_path):
    """`row["messages"]`: a text prompt as one user message, a row of chat messages as given, so an agent sends
    them as they are; `prompt` stays the row's own."""
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 plus 2?"}]
    rows = [{"id": "text", "prompt": "What is 10 plus 7?", "label": "17"}, {"id": "chat", "prompt": chat, "label": "4"}]
    seen: dict[str, dict] = {}

    async def plan(client, problem):
        seen[problem["id"]] = problem
        reply = await client.chat.completions.create(model="m", messages=problem["messages"])
        return reply.choices[0].message.content

    server = SimServer(script=Script.from_jsonl(write_problems(tmp_path / "p.jsonl", 1)))
    server.start()

    async def go():
        support.PLAN = plan
        options = {"seed": 3, "max_tokens": 64, "reward": "exact", "samples_per_prompt": 1}
        async with Generator(base_url=server.url, tokenizer=TOKENIZER, system="agent",
                             system_option=["agent=tests.agents_support:probe"], **options) as gen:  # fmt: skip
            return [await gen.run_group(row) for row in rows]

    try:
        groups = asyncio.run(go())
    finally:
        server.stop()
    assert [g.status for g in groups] == ["complete", "complete"]
    assert seen["text"]["messages"] == [{"role": "user", "content": "What is 10 plus 7?"}]
    assert seen["text"]["prompt"] == "What is 10 plus 7?"
    assert seen["chat"]["messages"] == chat and seen["chat"]["prompt"] == chat


def test_generate_help_lists_each_built_in_systems_options():
    """`--system-option` keys were nowhere in `generate --help` (a newcomer's trial): each built-in's are."""
    from agentroll.systems import BUILTINS, builtin

    from .conftest import run_cli

    shown = run_cli("generate", "--help").stdout.decode()
    said = " ".join(shown.replace("│", " ").split())
    for name in BUILTINS:
        assert f"{name}: " in said or f"{name}," in said, name
        for key in builtin(name).options or {}:
            assert key in said, (name, key)
