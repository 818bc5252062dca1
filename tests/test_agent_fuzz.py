"""No request ends the run: malformed bodies sent to the recording proxy, generated from valid ones by a seeded
mutator (bounded: a fixed number of bodies per seed), are each answered without a 5xx, and the execution goes on
to a valid call and completes. Also the ids cases the issue names, through the CLI (exit 0)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from . import agents_support as support
from .conftest import TOKENIZER, run_cli, write_problems
from .test_agent_proxy import USER, raw, run, serve  # noqa: F401 (serve: the fixture)

ODD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**32,
    2**63,
    2**64,
    10**12,
    10**400,
    -(2**70),
    0.5,
    1e308,
    -1e308,
    "",
    "x",
    "auto",
    "\x00",
    [],
    {},
    [None],
    [1, 2],
    [2**32],
    [-1],
    [[1], [2]],
    [""],
    [{}],
    {"a": 1},
    {"type": "function"},
    {"type": "text", "text": 3},
    [{"role": "user"}],
    [{"role": 3, "content": "x"}],
    [{"role": "user", "content": {"a": 1}}],
    [{"role": "assistant", "tool_calls": [{"function": {"name": 1, "arguments": [1]}}]}],
    [{"role": "assistant", "tool_calls": [{"id": 1, "type": "function", "function": {"name": "f"}}]}],
    [{"role": "tool", "tool_call_id": [1], "content": 3}],
    [{"type": "function", "function": {"name": 3, "parameters": "no"}}],
    [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 1}}}],
]
KEYS = ["messages", "prompt", "tools", "tool_choice", "n", "max_tokens", "max_completion_tokens", "temperature"]
KEYS += ["top_p", "top_k", "min_p", "logprobs", "top_logprobs", "stream", "stream_options", "return_token_ids"]
KEYS += ["stop", "stop_token_ids", "input", "instructions", "previous_response_id", "max_output_tokens", "model"]
CHAT = {"model": "m", "messages": USER, "max_tokens": 8, "tools": [support.PYTHON]}
TEXT = {"model": "m", "prompt": "Question: 1+1?\nAnswer:", "max_tokens": 8}
RESPONSES = {"model": "m", "input": "What is 10 plus 7?", "max_output_tokens": 8}
PATHS = {"/chat/completions": CHAT, "/completions": TEXT, "/responses": RESPONSES}


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """`value` with one part of it replaced, dropped or added to."""
    if isinstance(value, dict) and value and depth < 4 and (depth == 0 or rng.random() < 0.7):
        out = dict(value)
        key = rng.choice(sorted(out))
        move = rng.random()
        if move < 0.15:
            del out[key]
        elif move < 0.3:
            out[rng.choice(KEYS)] = rng.choice(ODD)
        else:
            out[key] = _mutate(rng, out[key], depth + 1)
        return out
    if isinstance(value, list) and value and depth < 4 and rng.random() < 0.7:
        out = list(value)
        at = rng.randrange(len(out))
        move = rng.random()
        if move < 0.2:
            out.append(copy.deepcopy(rng.choice(ODD)))
        else:
            out[at] = _mutate(rng, out[at], depth + 1)
        return out
    return copy.deepcopy(rng.choice(ODD))


def bodies(seed: int, count: int) -> list[tuple[str, Any]]:
    """`count` (path, body) pairs, each a valid body mutated one to three times."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        path = rng.choice(sorted(PATHS))
        body: Any = copy.deepcopy(PATHS[path])
        for _ in range(rng.randint(1, 3)):
            body = _mutate(rng, body)
        out.append((path, body))
    return out


def test_malformed_request_bodies_never_answer_5xx_nor_stop_the_run(serve):  # noqa: F811
    server = serve(tool_call=0.5)
    cases = bodies(45, 400)

    async def plan(client: Any, problem: dict) -> list[tuple[int, str, Any]]:
        bad = []
        for path, body in cases:
            status, answer = await raw(client, "POST", path, body)
            if status >= 500:
                bad.append((status, path, body, answer))
        # ids past the vocabulary and past 32 or 64 bits, each its own 400
        for ids in ([2**32], [10**12], [1, 2**64], [10**6], [-1]):
            status, answer = await raw(client, "POST", "/completions", {"model": "m", "prompt": ids})
            if status != 400:
                bad.append((status, "/completions", ids, answer))
        await client.chat.completions.create(model="m", messages=USER, max_tokens=16)
        return bad

    bad, group = run(server, plan)
    assert bad == []
    assert group.status == "complete"


def test_a_token_id_past_the_vocabulary_costs_only_that_call_and_the_run_exits_0(tmp_path: Path, sim):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import openai\n"
        "from openai import OpenAI\n"
        "client = OpenAI()\n"
        "for ids in ([2**32], [10**12], [99999]):\n"
        "    try:\n"
        "        client.completions.create(model='m', prompt=ids, max_tokens=4)\n"
        "    except openai.BadRequestError as exc:\n"
        "        assert 'vocabulary' in str(exc) or 'token id' in str(exc), exc\n"
        "    else:\n"
        "        raise SystemExit('no 400')\n"
        "print(client.completions.create(model='m', prompt='Answer:', max_tokens=8).choices[0].text)\n"
    )
    problems = write_problems(tmp_path / "p.jsonl", 2)
    out = tmp_path / "out"
    done = run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--system",
        "agent",
        "--system-option",
        f"command=python {agent}",
        "--samples-per-prompt",
        "2",
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rows = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(rows) == 4  # 2 problems x 2 executions, one call each: the refused ones are no record
