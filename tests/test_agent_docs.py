"""docs/agents.md's two examples run as written (the program with the `openai` SDK, the function with the OpenAI
Agents SDK), with the commands the page gives, against the simulator; their records are token-exact."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .test_agents import TOOL_CALLING, check_exact, executions
from .test_tool_use import behavior

DOC = (Path(__file__).resolve().parent.parent / "docs" / "agents.md").read_text()


def block(name: str) -> str:
    found = re.search(rf"```python\n(# {re.escape(name)}.*?)```", DOC, re.S)
    assert found is not None, name
    return found.group(1)


def fenced() -> list[str]:
    """The page's code blocks, each as its text."""
    blocks, current = [], None
    for line in DOC.splitlines():
        if line.startswith("```"):
            blocks, current = ([*blocks, current], None) if current is not None else (blocks, "")
        elif current is not None:
            current += line + "\n"
    return blocks


def command(flag: str) -> list[str]:
    """The `--system-option`s of the page's command that holds `flag`, as a shell would split them."""
    blocks = [b for b in fenced() if "agentroll generate" in b and f"--system-option {flag}" in b]
    assert len(blocks) == 1, flag
    options = re.findall(r'--system-option (\w+=(?:"[^"]*"|\S+))', blocks[0])
    return [x for o in options for x in ("--system-option", o.replace('"', ""))]


def run_example(
    name: str, flag: str, how: Behavior, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chat: bool = False
):
    """The page's example `name` run with the page's command against a simulated model that behaves `how`, on two
    problems (the second's prompt as chat messages with `chat`): its records, and the server."""
    (tmp_path / name).write_text(block(name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # `python`: ours
    problems = write_problems(tmp_path / "prompts.jsonl", 2)
    if chat:
        rows = [json.loads(line) for line in problems.read_text().splitlines()]
        rows[1]["prompt"] = [{"role": "user", "content": rows[1]["prompt"]}]
        problems.write_text("".join(json.dumps(row) + "\n" for row in rows))
    server = SimServer(script=Script.from_jsonl(problems, how))
    server.start()
    try:
        done = run_cli(
            "generate", "prompts.jsonl", "-o", "out", "--base-url", server.url, "--tokenizer", TOKENIZER,
            "--system", "agent", *command(flag), "--samples-per-prompt", "2", "--reward", "math", "--seed", "1",
            "--max-tokens", "256",
        )  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr.decode()
    return read_records(tmp_path / "out"), server


@pytest.mark.parametrize(("name", "flag"), [("my_agent.py", "command="), ("my_sdk_agent.py", "agent=")])
def test_the_agent_examples_run_as_written(name, flag, tmp_path, monkeypatch):
    records, server = run_example(name, flag, TOOL_CALLING, tmp_path, monkeypatch)
    assert check_exact(records, server) == 4  # every execution: a tool call, an answer continuing it
    for first, answer in executions(records):
        assert first["tool_calls"][0]["result"] == first["label"] and answer["continues"] == 0
        assert answer["raw_reward"] == 1.0 and answer["agent_answer"] == answer["content"]


@pytest.mark.parametrize(("name", "flag"), [("my_agent.py", "command="), ("my_sdk_agent.py", "agent=")])
def test_the_agent_examples_take_the_models_mistakes_as_its_outcome(name, flag, tmp_path, monkeypatch):
    """The model calls a tool it was not offered, on a row whose prompt is chat messages (README's second form):
    the examples answer it (the program shows the mistake to the model, the function scores it), so every group is
    written; before, both crashed, failing the group on every rerun (a newcomer's trial against `serve-sim`)."""
    how = behavior(tool_call=1.0, tool_unknown=1.0, correct=1.0)
    runs = executions(run_example(name, flag, how, tmp_path, monkeypatch, chat=True)[0])
    assert len(runs) == 4 and all(run[0]["tool_calls"][0]["name"] == "web_search_v2" for run in runs)
    assert {run[-1]["raw_reward"] for run in runs} == ({1.0} if flag == "command=" else {0.0})
