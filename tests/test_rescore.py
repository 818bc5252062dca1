"""agentroll rescore: another reward over the same records, no model called, the system's own pick and shaping."""

from __future__ import annotations

import json

import pytest

from agentroll.folder import Manifest, read_records
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, generations, run_cli

SCORER = "def score(request):\n    return 1.0 if request.content and 'boxed' in request.content else 0.0\n"


def made(sim, problems, tmp_path, *extra: str):
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
        "--reward",
        "exact",
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "2",
        "--seed",
        "4",
        "--correct-reward-weight",
        "2",
        *extra,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return out


@pytest.mark.parametrize("system", ["three-stage", "single", "critique-revise"])
def test_rescore_scores_every_record_again_token_for_token_with_the_systems_own_pick(sim, problems, tmp_path, system):
    src = made(sim, problems, tmp_path, "--system", system)
    calls = len(generations(sim))
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{scorer}:score")
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(generations(sim)) == calls  # no model called
    before, after = list(read_records(src)), list(read_records(out))
    assert len(before) == len(after)
    keep = (
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
        "loss_mask",
        "history_mask",
        "stage",
        "judgment",
        "listed_as",
        "rollout_id",
    )
    assert [{k: r[k] for k in keep} for r in before] == [{k: r[k] for k in keep} for r in after]
    by_rollout: dict[str, list[dict]] = {}
    for r in after:
        by_rollout.setdefault(r["rollout_id"], []).append(r)
        if r["stage"] in ("solver", "rewriter", "reviser"):
            assert r["raw_reward"] == (1.0 if r["content"] and "boxed" in r["content"] else 0.0)
    for rows in by_rollout.values():
        if system == "three-stage":
            selector = next((r for r in rows if r["stage"] == "selector"), None)
            listed = {r["listed_as"]: r for r in rows if r["stage"] == "rewriter" and r["listed_as"]}
            if selector is not None:
                picked = listed.get(selector["judgment"])
                assert selector["raw_reward"] == (picked["raw_reward"] if picked else 0.0)
                outcome = selector["raw_reward"]
            else:
                outcome = 0.0
        elif system == "critique-revise":  # the reviser's, the solver's when no revision was made
            outcome = rows[2]["raw_reward"] if len(rows) == 3 else rows[0]["raw_reward"]
            if len(rows) == 3:
                assert rows[1]["raw_reward"] == rows[2]["raw_reward"]
        else:
            outcome = rows[0]["raw_reward"]
        for r in rows:
            assert r["final_reward"] == outcome
            assert r["reward"] == r["raw_reward"] * (2.0 if outcome == 1 else 1.0)
    manifest = Manifest.load(out)
    assert manifest.complete and manifest.settings["reward"] == f"{scorer}:score"
    assert manifest.settings["derived_from"]["folder_id"] == Manifest.load(src).folder_id
    assert validate(out).ok
    report = manifest.last_run["stats"]["report"]
    assert report["system_accuracy"] == pytest.approx(
        sum(rows[0]["final_reward"] == 1 for rows in by_rollout.values()) / len(by_rollout)
    )


def test_rescore_filters_uniform_groups_and_resumes(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)
    zero = tmp_path / "zero.py"
    zero.write_text("def score(request):\n    return 0.0\n")
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{zero}:score", "--filter-uniform-groups")
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = Manifest.load(out)
    assert manifest.groups == 0 and manifest.filtered_groups == Manifest.load(src).groups  # every group uniform
    again = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{zero}:score", "--filter-uniform-groups")
    assert again.returncode == 0 and b"8 done before" in again.stderr
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_rescore_refuses_its_own_source_and_a_broken_folder(tmp_path):
    (tmp_path / "x").mkdir()
    proc = run_cli("rescore", str(tmp_path / "x"), "-o", str(tmp_path / "y"), "--reward", "exact")
    assert proc.returncode == 6 and b"not an agentroll output folder" in proc.stderr
