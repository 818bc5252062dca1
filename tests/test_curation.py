"""Curating the data as it is made: --target-groups (informative groups, as many prompts as it takes) and
length shaping (DAPO's soft overlong punishment and overlong filter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentroll.folder import Manifest, read_groups, read_records
from agentroll.settings.shaping import LengthShaping
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, generations, run_cli
from .test_groups import Outcomes, write


def test_target_groups_stops_at_n_informative_groups_and_a_rerun_goes_on(tmp_path):
    names = [f"{kind}-{i}" for i in range(12) for kind in ("right", "mixed", "wrong")]
    problems = write(tmp_path / "p.jsonl", names)
    server = SimServer(script=Outcomes())  # type: ignore[arg-type]
    server.start()
    out = tmp_path / "out"

    def run(target: int):
        return run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--reward",
            "exact",
            "--concurrency",
            "4",
            "--filter-uniform-groups",
            "--target-groups",
            str(target),
        )

    try:
        first = run(3)
        assert first.returncode == 0, first.stderr.decode()
        manifest = Manifest.load(out)
        assert manifest.complete and manifest.groups == 3
        assert {r["problem_id"].split("-")[0] for r in read_records(out)} == {"mixed"}
        read_first = manifest.last_run["stats"]["problems"]
        assert read_first < len(names)  # only as many prompts as it took
        second = run(5)
        assert second.returncode == 0, second.stderr.decode()
        assert Manifest.load(out).groups == 5
        calls = len(generations(server))
        rows = problems.read_text().splitlines(True)  # a first row that now clashes with its done id: with the
        problems.write_text(rows[0].replace('"label": "3"', '"label": "4"') + "".join(rows[1:]))  # target met,
        third = run(5)  # no row is read, so none is refused
        assert third.returncode == 0 and b"nothing to do" in third.stderr, third.stderr.decode()
        assert len(generations(server)) == calls  # not one call more
    finally:
        server.stop()


@pytest.mark.parametrize("overlong_filter", ["none", "mask", "drop"])
def test_length_shaping_punishes_long_answers_softly_and_filters_truncated_ones(problems, tmp_path, overlong_filter):
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--num-parallel",
            "2",
            "--max-tokens",
            "20",
            "--overlong-buffer",
            "12",
            "--overlong-penalty",
            "0.5",
            "--overlong-filter",
            overlong_filter,
        )
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    records = list(read_records(tmp_path / "out"))
    budgets = {r["sampling"]["max_tokens"] for r in records}
    assert all(b <= 20 for b in budgets)
    shaped = 0
    for r in records:
        length, budget = len(r["response_token_ids"]), r["sampling"]["max_tokens"]
        start = budget - 12
        expected = 0.0 if length <= start else -0.5 * min(1.0, (length - start) / 12)
        assert r["reward"] == pytest.approx(r["raw_reward"] + expected), r
        shaped += expected != 0
        if expected:
            assert "overlong" in (r["reward_info"] or "")
        truncated = r["status"] == "truncated"
        assert (not any(r["loss_mask"])) == (truncated and overlong_filter != "none")
        assert r["trainable"] == (not (truncated and overlong_filter == "drop"))
    assert shaped and any(r["status"] == "truncated" for r in records)
    settings = Manifest.load(tmp_path / "out").settings["length_shaping"]
    assert settings == {"buffer": 12, "penalty": 0.5, "filter": overlong_filter}


def test_length_shaping_values_are_checked(problems, tmp_path, sim):
    for flag, value, message in (
        ("--overlong-buffer", "-1", b"--overlong-buffer must be"),
        ("--overlong-filter", "cut", b"--overlong-filter must be one of none, mask, drop"),
    ):
        proc = run_cli("generate", str(problems), "-o", str(tmp_path / "o"), "--base-url", sim.url, flag, value)
        assert proc.returncode == 2 and message in proc.stderr


def rows(path, prefix: str, count: int):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"{prefix}{i}",
                    "prompt": f"What is {i} plus {i + 1}?",
                    "label": str(2 * i + 1),
                    "source": "kept",
                }
            )
            + "\n"
            for i in range(count)
        )
    )
    return path


def test_mixing_interleaves_by_weight_deterministically_names_each_source_and_resumes(sim, tmp_path):
    import asyncio

    from agentroll.inputs.mix import amix, parse_mix

    math_rows, code_rows = rows(tmp_path / "math.jsonl", "m", 40), rows(tmp_path / "code.jsonl", "c", 40)
    sources = parse_mix([f"{math_rows}=0.75", f"code:{code_rows}=0.25"])

    async def order() -> list[str]:
        return [p.metadata["source"] async for p in amix(sources)]

    first, again = asyncio.run(order()), asyncio.run(order())
    assert first == again and len(first) == 80  # deterministic, every row once
    assert first[:8].count("math.jsonl") == 6 and first[:8].count("code") == 2  # each prefix in its share
    assert first[-1] == "code"  # math ran out first: code takes what is left
    out = tmp_path / "out"
    args = [
        "generate",
        "--mix",
        f"{math_rows}=0.75",
        "--mix",
        f"code:{code_rows}=0.25",
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        "exact",
        "--num-parallel",
        "1",
    ]
    proc = run_cli(*args, "--limit", "8")
    assert proc.returncode == 0, proc.stderr.decode()
    records = list(read_records(out))
    assert {r["problem_id"] for r in records} == {"m0", "m1", "m2", "m3", "m4", "m5", "c0", "c1"}
    assert all(
        r["metadata"]["source"] in ("math.jsonl", "code") and r["metadata"]["row_source"] == "kept" for r in records
    )
    calls = len(generations(sim))
    proc = run_cli(*args, "--limit", "12")  # a rerun walks the same order: 8 done, 4 more
    assert proc.returncode == 0 and len({r["problem_id"] for r in read_records(out)}) == 12
    assert len(generations(sim)) > calls
    split = run_cli("stats", str(out), "--by", "source", "--json")
    assert split.returncode == 0
    assert set(json.loads(split.stdout)["split"]) == {"math.jsonl", "code"}


def test_a_bad_mix_is_one_line(sim, tmp_path):
    good = rows(tmp_path / "a.jsonl", "a", 2)
    for spec, message in (
        (f"{good}=0", b"with a weight above 0"),
        (f"{good}", b"expected PATH=WEIGHT"),
        (f"{tmp_path / 'none.jsonl'}=1", b"no such file"),
    ):
        proc = run_cli("generate", "--mix", spec, "-o", str(tmp_path / "o"), "--base-url", sim.url)
        assert proc.returncode in (2, 3) and message in proc.stderr, proc.stderr
    twice = rows(tmp_path / "b.jsonl", "a", 2)  # the same ids as a.jsonl
    proc = run_cli(
        "generate",
        "--mix",
        f"{good}=1",
        "--mix",
        f"{twice}=1",
        "-o",
        str(tmp_path / "o2"),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        "exact",
    )
    assert proc.returncode == 3 and b"duplicate id 'a0' (first in" in proc.stderr
    proc = run_cli("generate", "-o", str(tmp_path / "o3"), "--base-url", sim.url)
    assert proc.returncode == 2 and b"give INPUT" in proc.stderr


def test_an_input_that_runs_out_before_the_target_says_so_once_and_in_the_summary(tmp_path):
    problems = write(tmp_path / "p.jsonl", ["right-0", "mixed-0", "wrong-0", "mixed-1", "mixed-2", "mixed-3"])
    server = SimServer(script=Outcomes())  # type: ignore[arg-type]
    server.start()
    try:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--reward",
            "exact",
            "--filter-uniform-groups",
            "--limit",
            "4",
            "--target-groups",
            "10",
        )
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    assert Manifest.load(tmp_path / "out").groups == 2
    said = [line for line in proc.stderr.decode().splitlines() if "ran out" in line]
    assert len(said) == 2, proc.stderr.decode()  # the warning, and the summary's line
    assert "WARNING" in said[0] and all("--target-groups 10: the input ran out at 2 of 10 groups" in s for s in said)


def test_the_mix_is_recorded_in_the_settings_and_a_rerun_with_other_weights_is_refused(sim, tmp_path):
    math_rows, code_rows = rows(tmp_path / "math.jsonl", "m", 6), rows(tmp_path / "code.jsonl", "c", 6)

    def run(math: float, code: float, *extra: str):
        return run_cli(
            "generate",
            "--mix",
            f"{math_rows}={math}",
            "--mix",
            f"code:{code_rows}={code}",
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            sim.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--num-parallel",
            "1",
            "--limit",
            "4",
            *extra,
        )

    assert run(0.75, 0.25).returncode == 0
    settings = Manifest.load(tmp_path / "out").settings
    assert settings["mix"] == [{"name": "math.jsonl", "weight": 0.75}, {"name": "code", "weight": 0.25}]
    assert run(0.75, 0.25).returncode == 0  # the same mix resumes
    other = run(0.5, 0.5)
    assert other.returncode == 6, other.stderr.decode()
    errors = [line for line in other.stderr.decode().splitlines() if line.startswith("error:")]
    said = "mix.math.jsonl.weight: 0.75 -> 0.5, mix.code.weight: 0.25 -> 0.5"
    assert len(errors) == 1 and said in errors[0] and "--overwrite to start over" in errors[0], errors
    assert run(0.5, 0.5, "--overwrite").returncode == 0


def test_target_groups_with_ordered_and_a_consumer_bound(tmp_path):
    """--ordered: the N groups are the first N informative ones in input order; --consumer/--max-ahead: the run
    waits for its reader, and ends at N with the reader given each of them once."""
    names = ["mixed-0", "mixed-1", "right-0", "wrong-0", "mixed-2", "mixed-3", "right-1", "mixed-4", "mixed-5"]
    problems = write(tmp_path / "p.jsonl", names)
    server = SimServer(script=Outcomes())  # type: ignore[arg-type]
    server.start()
    out = tmp_path / "out"
    args = [
        *("generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER),
        *("--num-parallel", "2", "--samples-per-prompt", "2", "--reward", "exact", "--concurrency", "1"),
        *("--filter-uniform-groups", "--target-groups", "3", "--ordered", "--consumer", "trainer", "--max-ahead", "1"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stderr=subprocess.PIPE, env=env)
    try:
        assert run.stderr is not None
        for line in run.stderr:  # the run says when it stops taking prompts for the consumer
            if b"waiting for consumer trainer" in line:
                break
        else:
            raise AssertionError("the run never waited for its consumer")
        assert run.poll() is None
        taken = [g.problem_id for g in read_groups(out, follow=True, poll_s=0.05, timeout_s=120, consumer="trainer")]
        assert run.wait(120) == 0
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stderr.close()
        server.stop()
    assert taken == ["mixed-0", "mixed-1", "mixed-2"]  # in input order, each once, N of them
    assert [g.problem_id for g in read_groups(out)] == taken
    assert json.loads((out / ".agentroll" / "consumers" / "trainer").read_text())["groups"] == 3


@pytest.mark.parametrize("overlong_filter", ["mask", "drop"])
def test_a_filtered_turn_is_not_trained_through_the_history_of_the_turns_that_continue_it(
    problems, tmp_path, overlong_filter
):
    """critique-revise repeats the solver's response in the reviser's prompt: where the filter zeroed the solver's
    loss mask, the reviser's history_mask is 0 over it too (a whole-conversation converter reads that mask)."""
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    out = tmp_path / "out"
    try:
        proc = run_cli(
            "generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER,
            "--system", "critique-revise", "--samples-per-prompt", "4", "--max-tokens", "24", "--seed", "3",
            "--overlong-filter", overlong_filter,
        )  # fmt: skip
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    checked = 0
    for group in read_groups(out):
        for execution in group.executions:
            for sample in execution:
                if sample.continues is None:
                    continue
                earlier = execution[sample.continues]
                p, n = len(earlier.prompt_token_ids), len(earlier.response_token_ids)
                over = sample.history_mask[p : p + n]
                assert over == earlier.loss_mask
                if earlier.status == "truncated":
                    assert not any(over) and not any(sample.history_logprobs[p : p + n])
                    checked += 1
    assert checked, "no continued turn after a truncated one: the test saw nothing"
    assert run_cli("validate", str(out)).returncode == 0


def test_a_buffer_longer_than_the_budget_is_the_whole_budget_as_the_docs_say():
    dapo = LengthShaping(buffer=40, penalty=1.0)
    assert dapo.punishment(60, 100) == 0.0 and dapo.punishment(80, 100) == -0.5 and dapo.punishment(100, 100) == -1.0
    past = LengthShaping(buffer=200, penalty=1.0)  # B > L: -P * l / L
    assert past.punishment(0, 100) == 0.0 and past.punishment(56, 100) == -0.56 and past.punishment(100, 100) == -1.0
