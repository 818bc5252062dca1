"""`agentroll audit --against teacher --model TEACHER`: a teacher's recorded scores recomputed with the teacher's
weights, compared as the sampled logprobs are with the trainer's. A model that is its own teacher scores exactly
what it sampled with (raw logprobs), so those records pass; a shifted score fails by name; the sampled logprobs
are not what is compared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from . import synthetic
from .test_audit_cli import audit, names, raw_folder, tiny  # noqa: F401 - fixtures

pytest.importorskip("torch")


def taught(source: Path, out: Path) -> Path:
    """`source` as if the model had been its own teacher (raw logprobs: the scores equal the sampled logprobs),
    the selectors left unscored (their stage had no teacher)."""
    shutil.copytree(source, out)

    def score(records: list[dict]) -> None:
        for r in records:
            if r["stage"] != "selector":
                r["teacher_logprobs"] = list(r["response_logprobs"])
                r["teacher_ranks"] = [1] * len(r["response_logprobs"])

    synthetic.edit(out, score)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["settings"]["teacher"] = {"default": {"model": "tiny", "logprobs": 0}, "stages": {}}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_teachers_scores_are_audited_with_the_teachers_model(raw_folder, tiny, tmp_path):  # noqa: F811
    folder = taught(raw_folder, tmp_path / "taught")
    code, report = audit(folder, tiny, "--against", "teacher")
    assert code == 0, report["failed"]
    assert report["against"] == "teacher" and report["logprobs_mode"] == "raw_logprobs"
    assert report["overall"]["records"] == 18 and report["overall"]["max_abs"] < 1e-4
    assert report["skipped_records"]["selector"] == {"not scored by a teacher": 6}
    assert report["templates"] == {}  # the student's prompts are what the teacher scored: not re-rendered

    def damage(records: list[dict]) -> None:
        for r in records:
            if r["stage"] == "solver":
                r["response_logprobs"][0] += 1.0  # the sampled logprobs: not compared here
        r = next(r for r in records if (r["problem_id"], r["sample_index"], r["stage"]) == ("q1", 0, "rewriter"))
        r["teacher_logprobs"][1] -= 0.5
        named.append((r["problem_id"], r["rollout_id"], r["stage"], r["turn"]))

    named: list[tuple] = []
    synthetic.edit(folder, damage)
    code, report = audit(folder, tiny, "--against", "teacher")
    assert code == 10 and names(report) == set(named)
    assert report["failed"][0]["max_abs"] == pytest.approx(0.5, abs=1e-3)
    code, report = audit(folder, tiny)  # the policy's audit sees the sampled logprobs' damage instead
    assert code == 10 and {n[2] for n in names(report)} == {"solver"}


def test_a_folder_no_teacher_scored_is_refused(raw_folder, tiny):  # noqa: F811
    code, _ = audit_plain(raw_folder, tiny)
    assert code == 2


def audit_plain(folder: Path, model: Path) -> tuple[int, str]:
    from typer.testing import CliRunner

    from agentroll.cli import app

    result = CliRunner().invoke(app, ["audit", str(folder), "--model", str(model), "--against", "teacher"])
    assert "no teacher scored this folder" in result.output
    return result.exit_code, result.output
