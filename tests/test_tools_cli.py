"""`agentroll validate / stats / inspect` as a user runs them: exit codes and one-line errors."""

from __future__ import annotations

import json

from . import synthetic
from .conftest import TOKENIZER, run_cli


def test_validate_stats_and_inspect_on_the_command_line(sim, problems, tmp_path):
    out = tmp_path / "out"
    made = run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "2",
        "--reward",
        "exact",
        "--shard-size",
        "12",
    )
    assert made.returncode == 0, made.stderr.decode()
    good = run_cli("validate", str(out))
    assert good.returncode == 0 and b": ok (" in good.stdout

    figures = json.loads(run_cli("stats", str(out), "--json").stdout)
    assert figures["all"]["problems"] == 8 and figures["all"]["executions"] == 16
    assert run_cli("stats", str(out)).returncode == 0

    tree = run_cli("inspect", str(out), "--problem", "p003")
    assert tree.returncode == 0 and b"p003" in tree.stdout and b"solver 0" in tree.stdout
    unknown = run_cli("inspect", str(out), "--problem", "nope")
    assert unknown.returncode == 2 and unknown.stderr.decode().count("\n") == 1

    shard = sorted(out.glob("rollouts-*.jsonl"))[1]
    lines = shard.read_bytes().splitlines(True)
    record = json.loads(lines[2])
    record["response_logprobs"] = record["response_logprobs"][:-1]  # one logprob short of its tokens
    lines[2] = json.dumps(record).encode() + b"\n"
    shard.write_bytes(b"".join(lines))
    bad = run_cli("validate", str(out))
    assert bad.returncode == 6
    first = next(line for line in bad.stdout.decode().splitlines() if line.startswith("first fault"))
    assert f"{shard.name}:3:" in first
    assert run_cli("validate", str(tmp_path / "missing")).returncode == 6


def test_convert_on_the_command_line(sim, problems, tmp_path):
    out = tmp_path / "out"
    made = run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "2",
        "--reward",
        "exact",
    )
    assert made.returncode == 0, made.stderr.decode()
    trl = run_cli("convert", str(out), "--to", "trl", "-o", str(tmp_path / "trl"), "--advantage", "grpo")
    assert trl.returncode == 0, trl.stderr.decode()
    rows = [json.loads(line) for line in (tmp_path / "trl" / "trl.jsonl").read_text().splitlines()]
    records = [
        json.loads(line) for shard in sorted(out.glob("rollouts-*.jsonl")) for line in shard.read_text().splitlines()
    ]
    assert len(rows) == len(records)
    assert sorted((r["prompt_ids"], r["completion_ids"]) for r in rows) == sorted(
        (r["prompt_token_ids"], r["response_token_ids"]) for r in records
    )  # token-exact, every sample once
    wrong = run_cli("convert", str(out), "--to", "dpo", "-o", str(tmp_path / "dpo"), "--advantage", "grpo")
    assert wrong.returncode == 2 and wrong.stderr.decode().count("\n") == 1
    again = run_cli("convert", str(out), "--to", "trl", "-o", str(tmp_path / "trl"))
    assert again.returncode != 0 and b"--overwrite" in again.stderr  # never replaced silently


def test_the_tools_on_another_systems_folder(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr", frozen_critic=True)
    good = run_cli("validate", str(folder))
    assert good.returncode == 0 and b": ok (2 shards, 9 records" in good.stdout
    figures = json.loads(run_cli("stats", str(folder), "--json").stdout)
    assert figures["system"]["stages"] == ["solver", "critic", "reviser"]
    assert figures["all"]["stages"]["critic"]["trainable"] is False
    tree = run_cli("inspect", str(folder), "--problem", "b")
    assert tree.returncode == 0 and b"critic 0" in tree.stdout and b"rewriters" not in tree.stdout
    broken = synthetic.edit(folder, lambda rs: rs[2]["prompt_token_ids"].__setitem__(7, 999))
    bad = run_cli("validate", str(broken))
    assert bad.returncode == 6
    first = next(line for line in bad.stdout.decode().splitlines() if line.startswith("first fault"))
    assert first.startswith("first fault: rollouts-00000.jsonl:3: conversation: prompt_token_ids do not start")
