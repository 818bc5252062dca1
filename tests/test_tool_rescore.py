"""`agentroll rescore` over tool-use folders: only final turns are scored, every turn carries the outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentroll.folder import read_records
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, generations, run_cli, write_problems
from .test_tool_use import behavior

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

KEEP = ("prompt_token_ids", "response_token_ids", "history_mask", "loss_mask", "tool_calls", "turn", "continues")


@pytest.fixture
def server(tmp_path: Path):
    problems = write_problems(tmp_path / "p.jsonl", 4)
    made = SimServer(script=Script.from_jsonl(problems, behavior(tool_call=0.8, tool_again=0.5, correct=0.6)))
    made.start()
    yield made, problems
    made.stop()


def tool_use_folder(server, tmp_path: Path, *extra: str) -> Path:
    sim, problems = server
    out = tmp_path / "src"
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--system",
        "tool-use",
        "--samples-per-prompt",
        "4",
        "--reward",
        "math",
        "--seed",
        "7",
        "--correct-reward-weight",
        "2",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return out


def by_rollout(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["rollout_id"], []).append(r)
    return out


def test_rescoring_a_tool_use_folder_with_the_same_reward_changes_no_reward(server, tmp_path):
    src = tool_use_folder(server, tmp_path, "--system-option", "max_turns=2")
    calls = len(generations(server[0]))
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", "math")
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(generations(server[0])) == calls  # no model called
    before, after = list(read_records(src)), list(read_records(out))
    assert len(before) == len(after) and len(by_rollout(before)) == 16
    assert any(len(turns) > 1 for turns in by_rollout(before).values())  # there are earlier turns to carry it
    assert any("max_turns (2) reached" in (r["reward_info"] or "") for r in before)
    for old, new in zip(before, after, strict=True):
        for key in (*KEEP, "raw_reward", "reward", "final_reward", "reward_info"):
            assert old[key] == new[key], (key, old[key], new[key])
    assert validate(out).ok


def test_rescoring_a_tool_use_folder_scores_only_final_turns(server, tmp_path):
    src = tool_use_folder(server, tmp_path)
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        "def score(request):\n"
        "    assert '<tool_call>' not in request.response, 'a turn that called a tool was scored'\n"
        "    return 1.0\n"
    )
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{scorer}:score")
    assert proc.returncode == 0, proc.stderr.decode()
    after = list(read_records(out))
    for turns in by_rollout(after).values():
        assert {t["raw_reward"] for t in turns} == {1.0} and {t["reward"] for t in turns} == {2.0}
        assert {t["final_reward"] for t in turns} == {1.0}
        for i, t in enumerate(turns[:-1]):
            assert t["reward_info"] == f"turn {i + 1} of {len(turns)}: the final answer scored 1"
    assert validate(out).ok
    assert json.loads((out / "manifest.json").read_text())["settings"]["system"]["name"] == "tool-use"
