"""docs/agents.md's two examples run as written (the program with the `openai` SDK, the function with the OpenAI
Agents SDK), with the commands the page gives, against the simulator; their records are token-exact."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .test_agents import TOOL_CALLING, check_exact, executions

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


@pytest.mark.parametrize(("name", "flag"), [("my_agent.py", "command="), ("my_sdk_agent.py", "agent=")])
def test_the_agent_examples_run_as_written(name, flag, tmp_path, monkeypatch):
    (tmp_path / name).write_text(block(name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # `python`: ours
    problems = write_problems(tmp_path / "prompts.jsonl", 2)
    server = SimServer(script=Script.from_jsonl(problems, TOOL_CALLING))
    server.start()
    try:
        done = run_cli(
            "generate", "prompts.jsonl", "-o", "out", "--base-url", server.url, "--tokenizer", TOKENIZER,
            "--system", "agent", *command(flag), "--samples-per-prompt", "2", "--reward", "math", "--seed", "1",
            "--max-tokens", "256",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        records = read_records(tmp_path / "out")
        assert check_exact(records, server) == 4  # every execution: a tool call, an answer continuing it
    finally:
        server.stop()
    for first, answer in executions(records):
        assert first["tool_calls"][0]["result"] == first["label"] and answer["continues"] == 0
        assert answer["raw_reward"] == 1.0 and answer["agent_answer"] == answer["content"]
