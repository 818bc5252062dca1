"""`agentroll audit` on what a real vLLM recorded: the tiny model's rollouts, generated through agentroll, audited
with that model in transformers (float32 on both sides) pass; a copy with a few logprobs shifted fails, naming
exactly those records. The |Δ| figures go to the run's summary (docs/audit.md quotes them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentroll.cli import app

from .. import synthetic
from .conftest import SUMMARY
from .helpers import generate, manifest, problems

SHAPED = ("--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01")


def audit(folder: Path, model: Path, *flags: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["audit", str(folder), "--model", str(model), "--json", "--device", "cpu", *flags])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def folders(real_vllm, processed_vllm, tmp_path_factory) -> dict[str, Path]:
    """Three runs: three-stage on the default (raw) server at temperature 1; the same with shaped sampling (raw
    logprobs, so compared at temperature 1); critique-revise (multi-turn) with shaped sampling on the processed
    server."""
    inputs = problems(tmp_path_factory.mktemp("in") / "p.jsonl", 4)
    runs = {
        "raw": (real_vllm, ()),
        "raw-shaped": (real_vllm, SHAPED),
        "processed-multiturn": (processed_vllm, (*SHAPED, "--system", "critique-revise")),
    }
    out = {}
    for name, (url, flags) in runs.items():
        path = tmp_path_factory.mktemp(name) / "out"
        made = generate(url, inputs, path, "--samples-per-prompt", "2", *flags, max_tokens=24)
        assert made.returncode == 0, made.stderr.decode()[-2000:]
        out[name] = path
    return out


@pytest.mark.parametrize("name", ["raw", "raw-shaped", "processed-multiturn"])
def test_real_vllm_records_pass_the_audit_with_the_same_model(name, folders, tiny_model):
    path = folders[name]
    code, report = audit(path, tiny_model)
    assert code == 0, report["failed"]
    expected = "processed_logprobs" if name.startswith("processed") else "raw_logprobs"
    assert report["logprobs_mode"] == expected == manifest(path)["servers"][-1]["logprobs_mode"]
    overall = report["overall"]
    assert overall["records"] == manifest(path)["records"] and overall["tokens"] > 100
    assert overall["max_abs"] < 1e-3 and report["faults"] == {}
    first = next(iter(report["templates"].values()))
    assert first["mismatch"] == 0 and first["match"] > 0
    skipped = sum(overall["tokens_skipped"].values())
    SUMMARY.append(
        f"audit {name}: {overall['records']} records, {overall['tokens']} tokens compared ({skipped} "
        f"skipped: {overall['tokens_skipped']}), vLLM CPU float32 vs transformers float32: mean |Δ| "
        f"{overall['mean_abs']:.3g}, max |Δ| {overall['max_abs']:.3g}, KL k3 {overall['kl_k3']:.3g}"
    )


@pytest.mark.parametrize("name", ["raw", "processed-multiturn"])
def test_a_copy_with_a_few_logprobs_shifted_fails_naming_them(name, folders, tiny_model, tmp_path):
    path = tmp_path / "copy"
    shutil.copytree(folders[name], path)
    named = set()

    def shift(records):
        picked = [r for r in records if len(r["response_token_ids"]) > 2][1::9][:3]
        for r in picked:  # every token: one alone might sit at an ambiguous top-k cut, not compared
            r["response_logprobs"] = [x - 0.25 for x in r["response_logprobs"]]
            named.add((r["problem_id"], r["rollout_id"], r["stage"], r["turn"]))

    synthetic.edit(path, shift)
    assert len(named) == 3
    code, report = audit(path, tiny_model)
    assert code == 10 and not report["ok"]
    failed = {(r["problem_id"], r["rollout_id"], r["stage"], r["turn"]) for r in report["failed"]}
    assert failed == named and report["overall"]["records_failed"] == 3
    assert all(r["worst_token"]["delta"] == pytest.approx(-0.25, abs=1e-3) for r in report["failed"])


def test_a_bfloat16_audit_of_float32_records_is_within_the_bfloat16_tolerance(folders, tiny_model):
    """The trainer in bfloat16, the server in float32: the bfloat16 preset (which --dtype bfloat16 picks) holds."""
    code, report = audit(folders["raw"], tiny_model, "--dtype", "bfloat16")
    overall = report["overall"]
    assert report["dtype"] == "bfloat16" and report["precision"] == "bfloat16"
    assert code == 0, report["failed"]
    assert overall["max_abs"] > 1e-5  # bfloat16 arithmetic shows, far beyond float32's agreement
    SUMMARY.append(
        f"audit raw, transformers bfloat16 vs vLLM CPU float32: mean |Δ| {overall['mean_abs']:.3g}, "
        f"max |Δ| {overall['max_abs']:.3g}, KL k3 {overall['kl_k3']:.3g}, share over "
        f"{report['tolerance']['threshold']:g}: {overall['share_over']:.3g}"
    )
