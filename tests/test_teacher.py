"""`generate --teacher`: a teacher scores the exact ids every call saw and sampled, per stage, checked for its
vocabulary before the run starts, with a client and a journal of its own."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

import agentroll
from agentroll.sim.server import Faults

from .conftest import read_records, run_cli
from .teacher_support import expected, other_vocabulary, teacher_fields, teacher_server


@pytest.fixture
def teacher(problems):
    server = teacher_server(problems)
    yield server
    server.stop()


def generate(problems: Path, out: Path, url: str, *extra: str):
    return run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", url, "--samples-per-prompt", "2",
        "--num-parallel", "2", "--seed", "3", *extra,
    )  # fmt: skip


def test_every_record_carries_its_teachers_scores_of_its_own_ids(sim, teacher, problems, tmp_path):
    proc = generate(problems, tmp_path / "out", sim.url, "--teacher", teacher.url, "--teacher-logprobs", "3")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert {r["stage"] for r in records} == {"solver", "rewriter", "selector"}
    for record in records:
        assert teacher_fields(record) == expected(teacher, record, 3)
        assert len(record["teacher_logprobs"]) == len(record["response_token_ids"])
    scored = [e["request"] for e in teacher.log if e["request"].get("prompt_logprobs") is not None]
    sent = Counter(
        tuple(p) for r in scored for p in (r["prompt"] if isinstance(r["prompt"][0], list) else [r["prompt"]])
    )
    sequences = Counter(tuple(r["prompt_token_ids"] + r["response_token_ids"]) for r in records)
    assert sum((sent - sequences).values()) == 1 and not sequences - sent  # every record, and the start-up probe
    assert len(scored) == len({r["rollout_id"] for r in records}) + 1  # an execution's records in one request
    assert all(r["max_tokens"] == 1 and r["prompt_logprobs"] == 3 and r["model"] == "big" for r in scored)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["settings"]["teacher"]["stages"]["solver"] == {"model": "big", "logprobs": 3}
    assert manifest["settings"]["max_context_len"] == 4095  # cut to what the teacher can score, plus its one token
    figures = manifest["last_run"]["stats"]["teacher"]["solver"]
    assert figures["tokens"] == sum(len(r["response_token_ids"]) for r in records if r["stage"] == "solver")
    assert manifest["last_run"]["teachers"][0]["scored"] == len(records)
    assert b"KL(student || teacher), k3" in proc.stderr and b"teacher big" in proc.stderr
    assert run_cli("validate", str(tmp_path / "out")).returncode == 0


def test_the_figures_are_the_records_own(sim, teacher, problems, tmp_path):
    assert generate(problems, tmp_path / "out", sim.url, "--teacher", teacher.url).returncode == 0
    records = [r for r in read_records(tmp_path / "out") if r["stage"] == "rewriter"]
    gaps = [s - t for r in records for s, t in zip(r["response_logprobs"], r["teacher_logprobs"], strict=True)]
    ranks = [k for r in records for k in r["teacher_ranks"]]
    from math import exp

    data = json.loads(run_cli("stats", str(tmp_path / "out"), "--json").stdout)["all"]["teacher"]["rewriter"]
    assert data["tokens"] == len(gaps) and data["max_gap"] == max(gaps)
    assert data["mean_gap"] == pytest.approx(sum(gaps) / len(gaps))
    assert data["kl_k3"] == pytest.approx(sum(exp(-g) - 1 + g for g in gaps) / len(gaps))
    assert data["other_top_share"] == pytest.approx(sum(k != 1 for k in ranks) / len(ranks))
    assert records[0]["teacher_top_ids"] is None  # no --teacher-logprobs: the teacher's own token alone


def test_a_stage_is_scored_by_its_own_teacher_by_none_and_a_frozen_one_only_on_request(
    sim, teacher, problems, tmp_path
):
    proc = generate(
        problems, tmp_path / "out", sim.url, "--teacher", teacher.url, "--stage", "rewriter.teacher=none",
        "--stage", "selector.trainable=false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    by_stage = {r["stage"]: r for r in read_records(tmp_path / "out")}
    assert by_stage["solver"]["teacher_logprobs"] is not None
    assert by_stage["rewriter"]["teacher_logprobs"] is None and by_stage["selector"]["teacher_logprobs"] is None
    settings = json.loads((tmp_path / "out" / "manifest.json").read_text())["settings"]
    assert settings["teacher"]["stages"] == {
        "solver": {"model": "big", "logprobs": 0},
        "rewriter": None,
        "selector": None,
    }
    asked = generate(
        problems, tmp_path / "out2", sim.url, "--stage", "selector.trainable=false",
        "--stage", f"selector.teacher={teacher.url}",
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr.decode()
    by_stage = {r["stage"]: r for r in read_records(tmp_path / "out2")}
    assert by_stage["selector"]["teacher_logprobs"] == expected(teacher, by_stage["selector"], 0)["teacher_logprobs"]
    assert by_stage["solver"]["teacher_logprobs"] is None


@pytest.mark.parametrize("how", ["larger", "swapped"])
def test_a_teacher_with_another_vocabulary_is_refused_before_anything_runs(sim, problems, tmp_path, how):
    server = teacher_server(problems, other_vocabulary(tmp_path / "tok", how))
    try:
        out = tmp_path / "out"
        proc = generate(problems, out, sim.url, "--teacher", server.url)
        generated = [e for e in sim.log if (e["request"].get("max_tokens") or 0) > 1]
    finally:
        server.stop()
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.decode().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "does not share the student's vocabulary" in lines[0]
    assert ("more tokens than" in lines[0]) == (how == "larger")
    assert not generated and not out.exists()


def test_a_teacher_that_fails_for_good_fails_its_group_and_a_rerun_redoes_it(sim, teacher, problems):
    row = {"id": "q", "prompt": "What is 10 plus 7?", "label": "17"}

    async def run() -> tuple[str, str | None, str]:
        async with agentroll.Generator(base_url=sim.url, teacher=teacher.url, max_retries=1, num_parallel=2) as gen:
            teacher.faults.error_rate = 1.0  # down after the start: every scoring call answers 500 or 503
            failed = await gen.run_group(row)
            teacher.faults.error_rate = 0.0
            again = await gen.run_group(row)
            return failed.status, failed.error, again.status

    status, error, again = asyncio.run(run())
    assert status == "failed" and error is not None and error.startswith("teacher call failed")
    assert again == "complete"


def test_a_teacher_down_at_the_start_ends_the_run_in_one_line(sim, problems, tmp_path):
    broken = teacher_server(problems, faults=Faults(error_rate=1.0))
    try:
        proc = generate(problems, tmp_path / "out", sim.url, "--teacher", broken.url, "--max-retries", "0")
    finally:
        broken.stop()
    assert proc.returncode == 4 and b"cannot score" in proc.stderr, proc.stderr.decode()
    assert not (tmp_path / "out").exists()


def test_teacher_calls_are_journaled_and_replayed_after_a_stop(sim, teacher, problems, tmp_path):
    async def run(journal: Path) -> list[dict]:
        async with agentroll.Generator(
            base_url=sim.url,
            teacher=teacher.url,
            teacher_logprobs=2,
            samples_per_prompt=2,
            num_parallel=2,
            seed=1,
            journal=journal,
        ) as gen:
            group = await gen.run_group({"id": "q", "prompt": "What is 10 plus 7?", "label": "17"})
            return group.records()  # not settled: its calls stay in the journal, as after a stop

    first = asyncio.run(run(tmp_path / "journal"))
    scored = len(teacher.log)
    again = asyncio.run(run(tmp_path / "journal"))
    assert [teacher_fields(r) for r in again] == [teacher_fields(r) for r in first]
    assert all(r["teacher_top_ids"] and len(r["teacher_top_ids"][0]) == 2 for r in again if r["response_token_ids"])
    assert len(teacher.log) == scored + 1  # only the start-up probe: every score replayed


def test_a_rerun_with_another_teacher_or_none_is_refused(sim, teacher, problems, tmp_path):
    assert generate(problems, tmp_path / "out", sim.url, "--teacher", teacher.url, "--limit", "2").returncode == 0
    without = generate(problems, tmp_path / "out", sim.url)
    assert without.returncode == 6 and b"teacher" in without.stderr
    wider = generate(problems, tmp_path / "out", sim.url, "--teacher", teacher.url, "--teacher-logprobs", "2")
    assert wider.returncode == 6
    resumed = generate(problems, tmp_path / "out", sim.url, "--teacher", teacher.url)
    assert resumed.returncode == 0 and len({r["problem_id"] for r in read_records(tmp_path / "out")}) == 8


def test_teacher_options_are_checked(sim, problems, tmp_path):
    for extra, message in (
        (["--teacher-logprobs", "2"], "go with --teacher URL"),
        (["--teacher", "ftp://x"], "http:// or https://"),
        (["--teacher", "http://127.0.0.1:9", "--teacher-concurrency", "many"], "whole number or auto"),
        (["--stage", "solver.teacher=nowhere"], "an http:// or https:// URL, or none"),
        (["--stage", "solver.teacher_model=big"], "--stage solver.teacher_model goes with --teacher"),
        (["--stage", "solver.teacher=none", "--stage", "solver.teacher_model=big"], "not with solver.teacher=none"),
    ):
        proc = generate(problems, tmp_path / "out", sim.url, *extra)
        assert proc.returncode == 2 and message in proc.stderr.decode(), (extra, proc.stderr.decode())


def test_the_teachers_own_slots_keep_no_trace_of_settled_groups(sim, teacher):
    async def run() -> tuple[dict, dict, int]:
        async with agentroll.Generator(base_url=sim.url, teacher=teacher.url, num_parallel=2) as gen:
            for i in range(3):
                group = await gen.run_group({"id": f"q{i}", "prompt": f"What is {i} plus 7?", "label": str(i + 7)})
                assert group.status == "complete"
            budget = gen.teachers[0].client.budget
            return budget.width, budget.active, gen.teachers[0].scored

    width, active, scored = asyncio.run(run())
    assert scored > 0 and width == {} and active == {}  # a long run's bookkeeping stays flat


def test_teacher_figures_add_up_across_runs_and_survive_the_manifest():
    from agentroll.record.schema import Sample
    from agentroll.record.stats import RunStats

    def run(gaps: list[tuple[float, float, int]]) -> RunStats:
        stats = RunStats()
        n = len(gaps)
        fields = dict(problem_id="p", problem_hash="h", rollout_id="r", sample_index=0, group_size=1, worker=0)
        fields.update(prompt="", prompt_token_ids=[1], response="", response_token_ids=[5] * n, loss_mask=[1] * n)
        fields.update(status="completed", finish_reason="stop", stop_reason=None, content=None, raw_reward=0.0)
        fields.update(reward=0.0, label="", model="m", endpoint="", latency_s=0.0, attempts=1)
        sample = Sample(
            stage="solver",
            response_logprobs=[s for s, _, _ in gaps],
            teacher_logprobs=[t for _, t, _ in gaps],
            teacher_ranks=[k for _, _, k in gaps],
            **fields,
        )
        stats.add_execution([sample])
        return stats

    a, b = run([(-1.0, -2.0, 3), (-0.5, -0.5, 1)]), run([(-3.0, -0.25, 1)])
    total = a + b
    figures = total.teacher["solver"].figures()
    assert total.teacher["solver"].tokens == 3 and figures["max_gap"] == 1.0
    assert figures["mean_gap"] == pytest.approx((1.0 + 0.0 - 2.75) / 3)
    from math import exp

    assert figures["kl_k3"] == pytest.approx(sum(exp(-g) - 1 + g for g in (1.0, 0.0, -2.75)) / 3)
    assert figures["other_top_share"] == pytest.approx(1 / 3)
    again = RunStats.from_dict(json.loads(json.dumps(total.to_dict())))
    assert again.teacher == total.teacher and "teacher" not in RunStats().to_dict()


def test_a_record_whose_sequence_begins_anothers_is_read_from_that_ones_scores(teacher):
    """A conversation's earlier turn (continued by ids) and a call made twice are not prefilled again: one sequence
    sent for each that no other begins, every record's scores the same as if it had been sent alone."""
    from agentroll.client.transport import AiohttpTransport
    from agentroll.record.schema import Sample
    from agentroll.teacher.scorer import Teacher
    from agentroll.teacher.settings import TeacherSettings

    sent: list[list[list[int]]] = []

    class Recording(AiohttpTransport):
        async def request(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
            if body is not None and b"prompt_logprobs" in body:
                sent.append(json.loads(body)["prompt"])
            return await super().request(method, url, body, timeout_s)

    def sample(prompt: list[int], response: list[int]) -> Sample:
        fields: dict = {name: None for name in Sample.__dataclass_fields__}
        fields.update(prompt_token_ids=prompt, response_token_ids=response, response_logprobs=[-1.0] * len(response))
        return Sample(**fields)

    first = sample([11, 12, 13, 14], [21, 22, 23])
    later = sample([11, 12, 13, 14, 21, 22, 23, 31, 32], [41, 42])  # the first turn, a tool result, then more
    again = sample([11, 12, 13, 14], [21, 22, 23])
    other = sample([11, 12, 15], [21])  # shares a prefix only: its own sequence
    records = [first, later, again, other]

    async def main() -> None:
        settings = TeacherSettings(urls=(teacher.url,), logprobs=2)
        scorer = Teacher(settings, Recording(8, 5.0))
        try:
            await scorer.start("big", None)
            await scorer.score(records)
        finally:
            await scorer.aclose()

    asyncio.run(main())
    assert sorted(len(s) for request in sent for s in request) == [4, 11]
    for record in records:
        fields = {"prompt_token_ids": record.prompt_token_ids, "response_token_ids": record.response_token_ids}
        got = {k: getattr(record, k) for k in ("teacher_logprobs", "teacher_ranks", "teacher_top_ids")}
        want = expected(teacher, fields, 2)
        assert got == {k: want[k] for k in got} and len(got["teacher_logprobs"]) == len(record.response_token_ids)
        assert record.teacher_top_logprobs == want["teacher_top_logprobs"]
