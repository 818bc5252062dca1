"""A folder made by `--system agent` through the folder tools: every trainer format converts a conversation with
branches (each branch its own trajectory, its re-rendered history never trained), `rescore` scores the agent's
recorded answer again, `stats`, `report`, `inspect` and `validate` speak of calls and branches, and a run
resumes where it stopped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from agentroll.convert import convert
from agentroll.convert.formats import SPECS
from agentroll.convert.trajectory import executions, trajectories
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from . import agents_support as support
from .conftest import TOKENIZER, generations, read_records, run_cli, write_problems
from .test_agents import TOOL_CALLING


@pytest.fixture(scope="module")
def branchy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two problems, two executions each, of the harness that rewrites its history: five calls an execution,
    two of them branches."""
    tmp = tmp_path_factory.mktemp("branchy")
    problems = write_problems(tmp / "problems.jsonl", 2)
    agent = tmp / "agent.py"
    agent.write_text(support.REWRITER_PROGRAM)
    server = SimServer(script=Script.from_jsonl(problems, TOOL_CALLING))
    server.start()
    os.environ["REQUESTS"] = str(tmp / "requests.jsonl")
    try:
        done = run_cli(
            "generate", str(problems), "-o", str(tmp / "out"), "--base-url", server.url, "--tokenizer", TOKENIZER,
            "--system", "agent", "--system-option", f"command={sys.executable} {agent}", "--samples-per-prompt", "2",
            "--max-tokens", "256", "--reward", "exact", "-q",
        )  # fmt: skip
    finally:
        del os.environ["REQUESTS"]
        server.stop()
    assert done.returncode == 0, done.stderr.decode()
    return tmp / "out"


def test_each_branch_is_a_trajectory_of_its_own_whose_rewritten_history_is_never_trained(branchy):
    for execution in executions(read_records(branchy)):
        found = {t.position: t for t in trajectories(execution)}
        assert sorted(found) == [1, 2, 3, 4]  # the first call lives on inside the two calls continuing it
        for at in (1, 4):  # continuations: the first call's response is trained where it sits in the prompt
            first, record = execution[0], execution[at]
            begin = len(first["prompt_token_ids"])
            mask = found[at].mask
            assert mask[:begin] == [0] * begin and mask[begin : begin + len(first["response_token_ids"])] == [1] * len(
                first["response_token_ids"]
            )
            assert (
                found[at].turns == 2 and found[at].tokens == record["prompt_token_ids"] + record["response_token_ids"]
            )
        for at in (2, 3):  # branches: their history, rendered from text, is prompt (mask 0) throughout
            record = execution[at]
            assert found[at].turns == 1 and found[at].mask == [0] * len(record["prompt_token_ids"]) + [1] * len(
                record["response_token_ids"]
            )


@pytest.mark.parametrize("to", sorted(name for name, spec in SPECS.items() if not spec.chat))
def test_every_trainer_format_converts_an_agent_folder_with_branches(to, branchy, tmp_path):
    summary = convert(branchy, to, tmp_path / to)
    whole = SPECS[to].whole
    assert summary["records"] == 20
    if whole:  # 4 trajectories in each of the 4 executions; the first calls are folded into their continuations
        assert summary["folded_turns"] == 4
    written = summary.get("rows", summary.get("samples"))
    if to != "megatron":  # Megatron pads its groups with placeholders
        assert written == (16 if whole else 20), summary


def test_rescore_scores_the_agents_recorded_answer_again(branchy, tmp_path):
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        "def score(request):\n    return 1.0 if request.content and '\\\\boxed{' in request.content else 0.25\n"
    )
    done = run_cli("rescore", str(branchy), "-o", str(tmp_path / "new"), "--reward", f"{scorer}:score")
    assert done.returncode == 0, done.stderr.decode()
    before, after = read_records(branchy), read_records(tmp_path / "new")
    assert [r["response_token_ids"] for r in after] == [r["response_token_ids"] for r in before]
    for r in after:
        assert r["raw_reward"] == (1.0 if "\\boxed{" in r["agent_answer"] else 0.25) == r["final_reward"]
        assert r["reward_info"].startswith("the agent's answer scored")
    refused = run_cli("rescore", str(branchy), "-o", str(tmp_path / "own"), "--reward", "agent")
    assert refused.returncode != 0 and "the agent reported no reward" in refused.stderr.decode()


def test_stats_report_inspect_and_validate_speak_of_calls_and_branches(branchy, tmp_path):
    shown = run_cli("stats", str(branchy), "--json")
    assert shown.returncode == 0, shown.stderr.decode()
    whole = json.loads(shown.stdout)
    figures = whole["all"]
    assert set(whole["system"]["units"]) == {
        "calls_per_execution",
        "tool_calls_per_execution",
        "branches_per_execution",
    }
    assert figures["report"]["calls_per_execution"] == 5.0 and figures["report"]["branches_per_execution"] == 2.0
    assert figures["counters"]["branches"] == 8 and figures["counters"]["continued"] == 8
    page = run_cli("report", str(branchy), "-o", str(tmp_path / "report.html"))
    assert page.returncode == 0, page.stderr.decode()
    html = (tmp_path / "report.html").read_text()
    # counts per execution on a scale of their own, the shares with the accuracies (never past the top of 1)
    assert "The system's figures that count something (per execution)" in html and "branches per execution" in html
    tree = run_cli("inspect", str(branchy))
    text = tree.stdout.decode()
    assert tree.returncode == 0 and "call 2 of 5 · continues call 1" in text and "a branch off call" in text
    checked = run_cli("validate", str(branchy))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def test_an_agent_run_resumes_where_it_stopped(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", 3)
    agent = tmp_path / "agent.py"
    agent.write_text(support.SDK_PROGRAM)
    server = SimServer(script=Script.from_jsonl(problems, TOOL_CALLING))
    server.start()
    args = ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url, "--tokenizer", TOKENIZER]
    args += ["--system", "agent", "--system-option", f"command={sys.executable} {agent}", "--max-tokens", "256", "-q"]
    try:
        assert run_cli(*args, "--limit", "1").returncode == 0
        asked = len(generations(server))
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr.decode()
    finally:
        server.stop()
    records = read_records(tmp_path / "out")
    assert sorted({r["problem_id"] for r in records}) == ["p000", "p001", "p002"]
    assert len(generations(server)) - asked == sum(r["problem_id"] != "p000" for r in records)
