"""`agentroll distill DIR -o NEW --teacher URL`: a teacher's scores added to a finished folder, no student server,
the same as a run with that teacher gives; checked, resumable, killed at any moment."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from agentroll.folder import Manifest
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from . import synthetic
from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .teacher_support import expected, other_vocabulary, teacher_fields, teacher_server
from .test_reliability import popen

KEY = ("problem_id", "sample_index", "stage", "worker", "turn")


@pytest.fixture
def teacher(problems):
    server = teacher_server(problems, max_model_len=8192)  # room for the student's longest records
    yield server
    server.stop()


def generate(problems: Path, out: Path, url: str, *extra: str):
    args = ["generate", str(problems), "-o", str(out), "--base-url", url, "--samples-per-prompt", "2"]
    return run_cli(*args, "--num-parallel", "2", "--seed", "11", "-q", *extra)


def by_key(folder: Path) -> dict[tuple, dict]:
    return {tuple(r[k] for k in KEY): r for r in read_records(folder)}


def test_distill_gives_the_records_of_a_run_with_that_teacher(sim, teacher, problems, tmp_path):
    assert (
        generate(problems, tmp_path / "taught", sim.url, "--teacher", teacher.url, "--teacher-logprobs", "2").returncode
        == 0
    )
    assert generate(problems, tmp_path / "plain", sim.url).returncode == 0
    proc = run_cli("distill", str(tmp_path / "plain"), "-o", str(tmp_path / "new"), "--teacher", teacher.url,
                   "--teacher-logprobs", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    taught, plain, new = by_key(tmp_path / "taught"), by_key(tmp_path / "plain"), by_key(tmp_path / "new")
    assert set(taught) == set(new) == set(plain) and len(new) > 20
    for key, record in new.items():
        assert record["response_token_ids"] == taught[key]["response_token_ids"]  # one seed, the same samples
        assert teacher_fields(record) == teacher_fields(taught[key]) == expected(teacher, record, 2)
        untouched = {k: v for k, v in record.items() if not k.startswith("teacher_")}
        assert untouched == {k: v for k, v in plain[key].items() if not k.startswith("teacher_")}
    manifest = json.loads((tmp_path / "new" / "manifest.json").read_text())
    source = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    settings = manifest["settings"]
    assert settings["derived_from"] == {
        "folder": str((tmp_path / "plain").resolve()),
        "folder_id": source["folder_id"],
        "command": "distill",
    }
    assert settings["teacher"]["stages"]["solver"] == {"model": "big", "logprobs": 2}
    assert manifest["complete"] and manifest["last_run"]["stats"]["teacher"]["solver"]["tokens"] > 0
    stats = json.loads(run_cli("stats", str(tmp_path / "new"), "--json").stdout)["all"]["teacher"]
    theirs = json.loads(run_cli("stats", str(tmp_path / "taught"), "--json").stdout)["all"]["teacher"]
    assert stats.keys() == theirs.keys()  # the same figures, summed in another order (groups commit as they end)
    assert all(stats[s] == pytest.approx(theirs[s], rel=1e-12) for s in stats)
    assert run_cli("validate", str(tmp_path / "new")).returncode == 0
    again = run_cli("distill", str(tmp_path / "taught"), "-o", str(tmp_path / "again"), "--teacher", teacher.url,
                    "--stage", "rewriter.teacher=none")  # fmt: skip
    assert again.returncode == 0, again.stderr.decode()
    for key, record in by_key(tmp_path / "again").items():  # scored anew: no top k now, no rewriter scores
        if key[2] == "rewriter":
            assert teacher_fields(record) == dict.fromkeys(teacher_fields(record))
        else:
            assert record["teacher_logprobs"] == taught[key]["teacher_logprobs"] and record["teacher_top_ids"] is None


def test_distill_refuses_another_vocabulary_and_records_the_teacher_cannot_hold_before_writing(sim, problems, tmp_path):
    assert generate(problems, tmp_path / "src", sim.url).returncode == 0
    other = teacher_server(problems, other_vocabulary(tmp_path / "tok", "swapped"), max_model_len=8192)
    short = teacher_server(problems)  # the student's context, 4096: its longest records leave no room
    try:
        refused = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "a"), "--teacher", other.url)
        too_long = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "b"), "--teacher", short.url,
                           "--teacher-all-or-nothing")  # fmt: skip
    finally:
        other.stop()
        short.stop()
    assert refused.returncode == 2 and b"does not share the student's vocabulary" in refused.stderr
    assert too_long.returncode == 2 and b"--max-model-len 4097 or more" in too_long.stderr, too_long.stderr
    assert b"--max-context-len" not in too_long.stderr  # nothing the student can do now
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    nothing = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "c"))
    assert nothing.returncode == 2 and b"no stage has a teacher" in nothing.stderr


def test_groups_a_teacher_failed_are_left_for_a_rerun_which_scores_only_them(sim, problems, tmp_path):
    assert generate(problems, tmp_path / "src", sim.url).returncode == 0
    flaky = teacher_server(problems, max_model_len=8192, faults=Faults(error_rate=0.3))
    try:
        first = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", flaky.url,
                        "--max-retries", "0")  # fmt: skip
        flaky.faults.error_rate = 0.0
        second = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", flaky.url)
    finally:
        flaky.stop()
    assert first.returncode == 8 and b"run the same command again" in first.stderr, first.stderr.decode()
    assert second.returncode == 0, second.stderr.decode()
    records = read_records(tmp_path / "new")
    assert len(records) == len(read_records(tmp_path / "src"))
    rerun = json.loads((tmp_path / "new" / "manifest.json").read_text())["last_run"]
    written = len(records) - rerun["stats"]["records_written"]  # by the first run
    assert 0 < written < len(records) and rerun["teachers"][0]["scored"] == len(records) - written
    assert all(teacher_fields(r) == expected(flaky, r, 0) for r in records)


def test_distill_killed_mid_run_resumes_to_the_records_of_a_clean_run(sim, tmp_path):
    problems = write_problems(tmp_path / "many.jsonl", 24)
    assert generate(problems, tmp_path / "src", sim.url, "--samples-per-prompt", "1").returncode == 0
    slow = teacher_server(problems, max_model_len=8192, faults=Faults(latency_s=0.02), max_running=4)
    try:
        args = ["distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", slow.url,
                "--teacher-concurrency", "4"]  # fmt: skip
        proc = popen(*args)
        assert slow.wait_for_completions(12, timeout=60)  # some of the 24 groups are committed, others in flight
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert not Manifest.load(tmp_path / "new").complete
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr.decode()
        teachers = json.loads((tmp_path / "new" / "manifest.json").read_text())["last_run"]["teachers"]
        rerun = teachers[0]["scored"] + teachers[0]["replayed"]
        clean = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "clean"), "--teacher", slow.url)
        assert clean.returncode == 0
    finally:
        slow.stop()
    new, whole = by_key(tmp_path / "new"), by_key(tmp_path / "clean")
    assert new == whole and len(new) == len(read_records(tmp_path / "src"))
    assert 0 < rerun < len(new)  # the rerun scored only the records not on disk (or replayed them)


def test_distill_checks_the_teacher_against_every_policys_tokenizer(sim, teacher, problems, tmp_path):
    """A head-to-head folder whose second policy has another vocabulary (one token more): `generate --teacher`
    refuses that teacher for it, and so must `distill` over the same samples; before, distill checked only the
    folder's `settings.tokenizer` (the first policy's) and scored the other policy's ids with a teacher that gives
    them no meaning."""
    larger = teacher_server(problems, other_vocabulary(tmp_path / "tok", "larger"))
    try:
        policies = ["--policy", f"old={sim.url},tokenizer={TOKENIZER}",
                    "--policy", f"new={larger.url},tokenizer={tmp_path / 'tok'}"]  # fmt: skip
        args = ["generate", str(problems), "-o", str(tmp_path / "src"), *policies, "--samples-per-prompt", "1", "-q"]
        assert run_cli(*args).returncode == 0
        taught = run_cli(*args[:3], str(tmp_path / "taught"), *args[4:], "--teacher", teacher.url)
        refused = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", teacher.url)
    finally:
        larger.stop()
    assert taught.returncode == 2 and b"does not share the student's vocabulary" in taught.stderr
    lines = refused.stderr.decode().strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr.decode()
    assert "does not share the student's vocabulary" in lines[0]
    assert lines[0] == taught.stderr.decode().strip().splitlines()[-1]  # the very line generate refuses it with
    assert not (tmp_path / "new").exists()


def test_distill_refuses_a_record_longer_than_the_teacher_holds_in_any_policys_context(
    sim, teacher, problems, tmp_path
):
    """The check of lengths before writing reads each policy's context, not only the folder's `max_context_len`
    (the first policy's): a head-to-head folder's second policy, served with a longer context, may hold a record
    the teacher cannot score. Before, the check was skipped, the teacher refused that record's call (400) and its
    group failed on every rerun (exit 8) instead of one line before anything was written."""
    longer = SimServer(script=Script.from_jsonl(problems), max_model_len=16384, model="long")
    longer.start()
    try:
        policies = ["--policy", f"old={sim.url},tokenizer={TOKENIZER}",
                    "--policy", f"new={longer.url},tokenizer={TOKENIZER}"]  # fmt: skip
        made = run_cli("generate", str(problems), "-o", str(tmp_path / "src"), *policies, "--samples-per-prompt", "1")
    finally:
        longer.stop()
    assert made.returncode == 0, made.stderr.decode()

    def lengthen(records: list[dict]) -> None:  # a record of the long policy, as its 16,384 tokens allowed
        record = next(r for r in records if r["policy"] == "new")
        record["prompt_token_ids"] = record["prompt_token_ids"] * (9000 // len(record["prompt_token_ids"]) + 1)

    synthetic.edit(tmp_path / "src", lengthen)
    refused = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", teacher.url,
                      "--teacher-all-or-nothing")  # fmt: skip
    assert refused.returncode == 2, refused.stderr.decode()
    assert "serve the teacher with --max-model-len" in refused.stderr.decode().strip().splitlines()[-1]
    assert not (tmp_path / "new").exists()
    kept = run_cli("distill", str(tmp_path / "src"), "-o", str(tmp_path / "new"), "--teacher", teacher.url, "-q")
    assert kept.returncode == 0, kept.stderr.decode()  # by default the rest is scored, that record kept unscored
    unscored = [r for r in read_records(tmp_path / "new") if r["teacher_logprobs"] is None]
    assert [len(r["prompt_token_ids"]) >= 8192 and r["policy"] for r in unscored] == ["new"]
    (report,) = Manifest.load(tmp_path / "new").last_run["teachers"]
    assert report["unscored"] == 1 and report["unscored_records"] == [
        f"{unscored[0]['problem_id']}/{unscored[0]['sample_index']} solver"
    ]


def test_a_head_to_head_run_with_a_teacher_says_each_policys_figures_against_it(sim, teacher, problems, tmp_path):
    """With --policy, the teacher's figures per stage mix both policies' tokens: the summary's line of each policy
    and `stats`' table of each policy say that policy's own (k3 and the share of tokens whose teacher's top token
    is another), as `stats --json` holds them."""
    out = tmp_path / "duel"
    policies = ["--policy", f"old={sim.url}", "--policy", f"new={sim.url}"]
    args = ["generate", str(problems), "-o", str(out), *policies, "--samples-per-prompt", "1", "--seed", "3"]
    proc = run_cli(*args, "--teacher", teacher.url, "--limit", "4")
    assert proc.returncode == 0, proc.stderr.decode()
    data = json.loads(run_cli("stats", str(out), "--json").stdout)
    said = " ".join(proc.stderr.decode().split())
    table = run_cli("stats", str(out)).stdout.decode()
    for name in ("old", "new"):
        figures = data["all"]["policies"][name]["teacher"]
        assert set(figures) == {"solver", "rewriter", "selector"}
        k3 = ", ".join(f"{stage} {f['kl_k3']:.3f}" for stage, f in figures.items())
        top = ", ".join(f"{stage} {f['other_top_share']:.3f}" for stage, f in figures.items())
        line = said[said.index(f"policy {name}: ") :]
        assert line.index(f"KL(student || teacher) k3 {k3}") < line.index(f"top token another {top}"), said
    per_policy = table[table.index("each policy") :].splitlines()
    row = next(line for line in per_policy if "solver KL(student || teacher), k3" in line)
    shown = [cell.strip() for cell in row.split("│")[2:-1]]
    assert shown == [f"{data['all']['policies'][n]['teacher']['solver']['kl_k3']:.3f}" for n in ("old", "new")]


def test_the_simulator_scoring_a_folder_it_wrote_differs_from_it_by_nothing(sim, problems, tmp_path):
    """A model as its own teacher: the scores of its samples are its sampling logprobs (KL 0, every teacher's top
    list the student's own), as a real vLLM's prompt_logprobs of its own samples are (raw logprobs)."""
    assert generate(problems, tmp_path / "own", sim.url, "--logprobs", "3").returncode == 0
    proc = run_cli("distill", str(tmp_path / "own"), "-o", str(tmp_path / "self"), "--teacher", sim.url,
                   "--teacher-logprobs", "3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "self")
    full = [r for r in records if len(r["prompt_token_ids"]) + len(r["response_token_ids"]) >= 4096]
    assert len(records) > 20 and full  # the simulator's rambling answers fill its context: kept, not scored
    assert all(teacher_fields(r) == dict.fromkeys(teacher_fields(r)) for r in full)
    ranks = []
    for record in (r for r in records if r not in full):
        assert record["teacher_logprobs"] == record["response_logprobs"]
        assert record["teacher_top_ids"] == record["top_token_ids"]  # the top token the same at every position
        assert record["teacher_top_logprobs"] == record["top_logprobs"]
        # the completions API says a rank where the sampled token is in the top list: the teacher's the same
        pairs = zip(record["response_ranks"], record["teacher_ranks"], strict=True)
        assert all(own == theirs for own, theirs in pairs if own is not None)
        ranks += record["teacher_ranks"]
    assert 0 < ranks.count(1) < len(ranks)  # the samples are not all the top token: the check sees ranks
    figures = json.loads(run_cli("stats", str(tmp_path / "self"), "--json").stdout)["all"]["teacher"]
    assert figures and all(s["mean_gap"] == s["max_gap"] == s["kl_k3"] == 0 for s in figures.values())
    manifest = Manifest.load(tmp_path / "self")
    (report,) = manifest.last_run["teachers"]
    assert report["unscored"] == len(full) and len(report["unscored_records"]) == min(len(full), 20)
    assert f"unscored {len(full)} (they fill its context" in proc.stderr.decode()


def test_generate_with_a_context_it_was_given_keeps_what_fills_the_teachers_unscored(sim, problems, tmp_path):
    """The same rule as distill's: a --max-context-len asked for is kept, the records that fill the teacher's
    context are written without teacher fields and counted; --teacher-all-or-nothing refuses the run instead."""
    same = teacher_server(problems)  # max_model_len 4096, as the student's
    try:
        args = ("--teacher", same.url, "--max-context-len", "4096")
        refused = generate(problems, tmp_path / "a", sim.url, *args, "--teacher-all-or-nothing")
        kept = generate(problems, tmp_path / "b", sim.url, *args)
    finally:
        same.stop()
    assert refused.returncode == 2 and b"--max-model-len 4097 or more" in refused.stderr
    assert kept.returncode == 0, kept.stderr.decode()
    records = read_records(tmp_path / "b")
    full = [r for r in records if len(r["prompt_token_ids"]) + len(r["response_token_ids"]) >= 4096]
    assert full and all(r["teacher_logprobs"] is None for r in full)
    assert all(r["teacher_logprobs"] is not None for r in records if r not in full)
    (report,) = Manifest.load(tmp_path / "b").last_run["teachers"]
    assert report["unscored"] == len(full)
