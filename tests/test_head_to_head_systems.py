"""A head-to-head run of the systems that keep something for the whole run (the agent system's proxy, tool use's
template check): each policy's executions see and use its own model, never the policy that came first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .test_tool_use import without_tools


async def whoami(client: Any, problem: dict[str, Any]) -> dict[str, Any]:
    """An agent that asks the proxy which model it serves (and how long a context), then asks that model."""
    (card,) = (await client.models.list()).data
    reply = await client.chat.completions.create(
        model=card.id, messages=[{"role": "user", "content": problem["prompt"]}], max_tokens=32
    )
    seen = {"listed": card.id, "length": getattr(card, "max_model_len", None), "answered": reply.model}
    return {"answer": json.dumps(seen)}


def test_each_policys_agents_are_told_their_own_model(tmp_path: Path):
    problems = write_problems(tmp_path / "problems.jsonl", 3)
    script = Script.from_jsonl(problems, Behavior(correct=0.5))
    servers = [
        SimServer(script=script, model="strong", max_model_len=4096),
        SimServer(script=script, model="weak", max_model_len=2048, seed=1),
    ]
    for each in servers:
        each.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate", str(problems), "-o", str(out), "--samples-per-prompt", "2", "--reward", "exact",
            "--policy", f"new={servers[0].url},tokenizer={TOKENIZER}",
            "--policy", f"old={servers[1].url},tokenizer={TOKENIZER}",
            "--system", "agent", "--system-option", f"agent={__name__}:whoami", "-q",
        )  # fmt: skip
    finally:
        for each in servers:
            each.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert {r["policy"] for r in records} == {"new", "old"}
    for r in records:
        model, length = ("strong", 4096) if r["policy"] == "new" else ("weak", 2048)
        assert (r["model"], r["endpoint"]) == (model, servers[r["policy"] == "old"].url)
        assert json.loads(r["agent_answer"]) == {"listed": model, "length": length, "answered": model}


def test_tool_use_refuses_a_policy_whose_template_ignores_tools_whichever_policy_it_is(tmp_path: Path):
    """The check is once per policy, not once per run: the first policy's template offering the tools says
    nothing of the second's."""
    plain = without_tools(tmp_path / "plain-tokenizer")
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    script = Script.from_jsonl(problems, Behavior(correct=0.5))
    servers = [SimServer(script=script, model="strong"), SimServer(script=script, model="weak", seed=1)]
    for each in servers:
        each.start()
    try:
        proc = run_cli(
            "generate", str(problems), "-o", str(tmp_path / "out"), "--samples-per-prompt", "2", "--reward", "exact",
            "--policy", f"new={servers[0].url},tokenizer={TOKENIZER}",
            "--policy", f"old={servers[1].url},tokenizer={plain}",
            "--system", "tool-use", "--chat-render", "local", "-q",
        )  # fmt: skip
    finally:
        for each in servers:
            each.stop()
    said = proc.stderr.decode()
    assert proc.returncode == 2 and "policy old: the chat template renders nothing of the `tools` argument" in said, (
        said
    )
