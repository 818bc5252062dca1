"""How a tool-use conversation ends and what its tool messages carry, against the simulator: a turn cut at
max_tokens ends it, tool threads all held by hung calls end the run (exit 5), and tool results carry `name` and
a `tool_call_id` a Mistral-style template can require."""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentroll.context.turns import separator
from agentroll.render.chat import load_tokenizer
from agentroll.sim.script import Script, Scripted
from agentroll.sim.server import SimServer
from agentroll.toolcalls import PYTHON, call_id
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, read_records, write_problems
from .test_tool_use import behavior, executions, manifest, tool_use

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)


@pytest.fixture
def serve() -> Iterator:
    servers: list[SimServer] = []

    def start(script: Script) -> SimServer:
        server = SimServer(script=script)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# -- a response cut at max_tokens ends the conversation ------------------------------------------------------------
def test_a_turn_cut_inside_a_tool_call_ends_the_conversation(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(Script.from_jsonl(problems, behavior(tool_call=1.0, reasoning_words=2)))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--samples-per-prompt", "3", "--max-tokens", "45")
    assert code == 0, output
    records = read_records(out)
    cut = [r for r in records if "<tool_call>" in r["response"] and "</tool_call>" not in r["response"]]
    assert len(cut) == 6  # every first turn is cut inside its call
    for turns in executions(records):
        (only,) = turns  # nothing after the cut turn
        assert only["status"] == "truncated" and only["tool_calls"] is None
        assert only["reward_info"].startswith("the response was cut at max_tokens: the conversation ends with it")
        assert only["raw_reward"] == only["final_reward"] == 0.0
    stats = manifest(out)["last_run"]["stats"]
    assert stats["tool_calls"] == stats["tool_calls_malformed"] == 0
    assert validate(out).ok


# -- tool threads held by hung calls end the run ------------------------------------------------------------------
HUNG = '''import threading

GONE = threading.Event()


def lookup(query: str) -> str:
    """Look a fact up (and never come back).

    Args:
        query: what to look up
    """
    GONE.wait(60)
    return query
'''


def test_tool_threads_held_by_hung_calls_end_the_run_and_write_nothing_of_it(serve, tmp_path):
    (tmp_path / "hung_tools.py").write_text(HUNG)
    problems = write_problems(tmp_path / "p.jsonl", 4)
    server = serve(Script.from_jsonl(problems, behavior(tool_call=1.0)))
    out = tmp_path / "out"
    code, output = tool_use(
        problems,
        out,
        server.url,
        "--samples-per-prompt",
        "4",
        "--system-option",
        f"tools={tmp_path / 'hung_tools.py'}:lookup",
        "--system-option",
        "tool_threads=2",
        "--system-option",
        "tool_timeout=0.5",
    )
    assert code == 5, output
    said = [line for line in output.splitlines() if "tool_threads" in line]
    assert len(said) == 1 and "tool 'lookup'" in said[0] and "held by calls past tool_timeout=0.5s" in said[0]
    written = [c for r in read_records(out) for c in r["tool_calls"] or []]
    assert not any("PoolExhausted" in (c["result"] or "") or "threads" in (c["error"] or "") for c in written)


# -- tool messages carry name and tool_call_id -------------------------------------------------------------------
MISTRAL_LIKE = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}"
    "{{ raise_exception('a tool message needs a tool_call_id of 9 characters') }}{% endif %}"
    '[TOOL_RESULTS]{"call_id": "{{ message.tool_call_id }}", "name": "{{ message.name }}", '
    '"content": {{ message.content | tojson }}}[/TOOL_RESULTS]'
    "{%- elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}"
    "{%- else %}[INST]{{ message['content'] }}[/INST]{% endif %}"
    "{%- endfor %}"
)  # written for this test: results are labelled by call id, as the Mistral family's templates do


class MistralModel(Script):
    """Calls the python tool in Mistral's format (with its own id for one problem, none for the other), then
    answers once it has a result."""

    def answer(self, prompt: str, rng: Any, request: dict[str, Any] | None = None) -> Scripted:
        if "[TOOL_RESULTS]" in prompt:
            return Scripted("<think>Read it.</think>\n\nThe answer is \\boxed{17}.")
        call: dict[str, Any] = {"name": "python", "arguments": {"code": "print(17)"}}
        if "10 plus 7" in prompt:
            call["id"] = "abcDEF123"
        return Scripted(f"<think>Compute it.</think>\n\n[TOOL_CALLS]{json.dumps([call])}")


def mistral_tokenizer(tmp_path: Path) -> Path:
    made = tmp_path / "mistral-like"
    shutil.copytree(TOKENIZER, made)
    config = json.loads((made / "tokenizer_config.json").read_text())
    config["chat_template"] = MISTRAL_LIKE
    (made / "tokenizer_config.json").write_text(json.dumps(config))
    return made


def test_the_mistral_parsers_results_carry_the_call_id_its_template_requires(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(MistralModel.from_jsonl(problems))
    tokenizer = mistral_tokenizer(tmp_path)
    runs = []
    for name in ("a", "b"):  # the same seeded run twice: the same ids, the same tokens
        out = tmp_path / name
        code, output = tool_use(
            problems,
            out,
            server.url,
            "--tokenizer",
            str(tokenizer),
            "--chat-render",
            "local",
            "--system-option",
            "parser=mistral",
            "--samples-per-prompt",
            "2",
            "--reward",
            "math",
        )
        assert code == 0, output
        assert validate(out).ok
        runs.append(read_records(out))
    decode = load_tokenizer(str(tokenizer)).decode
    for turns in executions(runs[0]):
        first, second = turns
        assert first["tool_calls"][0]["status"] == "ok" and second["raw_reward"] == first["raw_reward"]
        head = first["prompt_token_ids"] + first["response_token_ids"]
        assert second["prompt_token_ids"][: len(head)] == head  # token-exact through the tool message
        injected = decode(second["prompt_token_ids"][len(head) :], skip_special_tokens=False)
        given = (
            "abcDEF123"
            if first["problem_id"] == "p000"
            else call_id(5, first["problem_id"], first["sample_index"], 0, 0, 0)
        )
        assert injected == f'[TOOL_RESULTS]{{"call_id": "{given}", "name": "python", "content": "17"}}[/TOOL_RESULTS]'
        assert re.fullmatch(r"[A-Za-z0-9]{9}", given)
        assert first["tool_calls"][0]["id"] == given  # the record keeps the id the result went back with

    def ids(records: list[dict]) -> list[list[int]]:
        return [
            r["prompt_token_ids"]
            for r in sorted(records, key=lambda r: (r["problem_id"], r["sample_index"], r["turn"]))
        ]

    assert ids(runs[0]) == ids(runs[1])


def test_templates_that_ignore_name_and_id_render_results_as_before():
    tokenizer = load_tokenizer(TOKENIZER)
    templates = [tokenizer.chat_template]
    qwen3 = importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja"  # Qwen3's published template
    if qwen3.is_file():
        templates.append(qwen3.read_text())
    bare = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "[stderr]\nboom"}]
    named = [{**m, "name": "python", "tool_call_id": f"abcDEF12{i}"} for i, m in enumerate(bare)]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for template in templates:
        tokenizer.chat_template = template
        ids = [asyncio.run(separator(tokenizer, m, {}, end, tools=[PYTHON.schema])) for m in (bare, named)]
        assert ids[0] == ids[1]
    assert len(templates) == 2
