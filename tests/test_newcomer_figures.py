"""The figures a run ends with, and the progress before them, as a new user reads them (issue 32): at 80 and 160
columns, one table, lines broken between phrases, each figure saying what it counts, none that does not apply to
the system, the rates of progress and summary measured alike."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from agentroll.client.slots import ClientCounters
from agentroll.record.stats import RunStats
from agentroll.run.runner import RunResult

from .conftest import TOKENIZER, run_cli, write_problems


def flat(text: str) -> str:
    """Lines joined as one, the continuation indents dropped: what the text says, whatever its width."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def summary_at(width: int, result: RunResult) -> str:
    from agentroll.cli import summary
    from agentroll.cli.console import Terminal

    console = Terminal(file=io.StringIO(), width=width, color_system=None, markup=False, emoji=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(summary, "err", console)
        summary.print_summary(result)
    return console.file.getvalue()  # type: ignore[attr-defined]


def a_result() -> RunResult:
    stats = RunStats(problems=315, executions=2520, records_written=22680, groups_written=300, groups_filtered=15)
    for name, samples in (("solver", 10080), ("rewriter", 10080), ("selector", 2520)):
        stage = stats.stage(name)
        stage.samples, stage.raw_reward_sum, stage.truncated = samples, samples * 0.4125, 17
        stage.prompt_tokens, stage.response_tokens = 1_234_567 * samples // 10080, 98_765_432 * samples // 10080
    requests = ClientCounters(requests=22683, retries=12, failures=0, peak_in_flight=512)
    return RunResult(
        stats, requests, 3725.4, "Qwen/Qwen3-8B", "/shared/out/rollouts", startup_s=4.2, startup_requests=3
    )


@pytest.mark.parametrize("columns", [80, 160])
def test_the_summary_is_one_table_and_lines_broken_only_between_phrases(columns):
    shown = summary_at(columns, a_result())
    assert max(len(line) for line in shown.splitlines()) <= columns
    assert shown.count("┏") == 1  # the table is not split into two
    assert "1234567/98765432" in shown and "308641/24691358" in shown  # every figure whole
    said, wide = (text[text.rindex("┘") + 1 :] for text in (shown, summary_at(1000, a_result())))
    assert flat(said) == flat(wide)  # the same words: no line broke inside one
    assert "wall 3725.4s (start-up 4.2s), 6.1 requests/s after it" in flat(said)


def test_a_terminal_progress_bar_labels_its_times_and_breaks_its_status_between_phrases(monkeypatch):
    from agentroll.cli import RichBar

    out = io.StringIO()
    monkeypatch.setattr("agentroll.cli.progress.err", Console(file=out, width=80, force_terminal=True))
    bar = RichBar()
    bar.start(12000, requests=3)
    stats = RunStats(groups_written=1234, groups_failed=17, executions=9872, system_correct=4000)
    stats.final_reward_sum, stats.invalid_rows, stats.reward_timeouts = 4000.0, 3, 2
    bar.advance(stats, ClientCounters(requests=99999, in_flight=1024, queued=333, failures=21, retries=456))
    bar.live.refresh()
    bar.stop()
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line) for line in out.getvalue().replace("\r", "\n").splitlines()]
    lines = [line.rstrip() for line in lines if line.strip()]
    assert all(len(line) <= 80 for line in lines), lines
    assert any(re.search(r"1254/12000 ETA \S+, elapsed \d+s$", line) for line in lines), lines
    for phrase in ("in flight 1024, queued 333", "system accuracy 0.405", "groups failed 17", "retries 456"):
        assert any(phrase in line for line in lines), (phrase, lines)


def progress_lines(stderr: bytes) -> list[str]:
    return [line.split("progress: ", 1)[1] for line in stderr.decode().splitlines() if "progress: " in line]


def test_a_resume_starts_at_the_groups_on_disk_and_a_noop_rerun_says_the_rates_its_summary_says(sim, tmp_path):
    problems = write_problems(tmp_path / "all.jsonl", 12)
    head = tmp_path / "head.jsonl"
    head.write_text("".join(problems.read_text().splitlines(keepends=True)[:5]))
    out = tmp_path / "out"
    args = ["-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--num-parallel", "2"]
    assert run_cli("generate", str(head), *args, "-q").returncode == 0
    resumed = run_cli("generate", str(problems), *args)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert progress_lines(resumed.stderr)[0].startswith("groups 5/12 (42%)")
    again = run_cli("generate", str(problems), *args)
    last = progress_lines(again.stderr)[-1]
    assert last.startswith("groups 12/12 (100%), 0.00 groups/s, 0.0 requests/s"), last
    assert len(progress_lines(again.stderr)) == 1  # not the same line twice
    assert "0.0 requests/s after it" in flat(again.stderr.decode())


def test_the_summary_says_its_figures_count_the_groups_generated_where_stats_counts_those_written(
    sim, problems, tmp_path
):
    out = tmp_path / "out"
    run = run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER,
        "--samples-per-prompt", "2", "--num-parallel", "2", "--seed", "4", "--filter-uniform-groups",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    manifest = json.loads((out / "manifest.json").read_text())
    written, left = manifest["groups"], manifest["filtered_groups"]
    assert left > 0 and written > 0
    said = flat(run.stderr.decode())
    assert f"count all {written + left} groups generated: {written} written, {left} left out as uniform" in said
    assert f"agentroll stats counts the {written} written" in said and "accuracy over the groups generated:" in said
    stats = json.loads(run_cli("stats", str(out), "--json").stdout)
    assert stats["all"]["problems"] == written
    (tmp_path / "zero.py").write_text("def score(request):\n    return 0.0\n")
    for reward, dropped in ((f"{tmp_path / 'zero.py'}:score", written), ("math", 0)):
        again = tmp_path / f"again-{dropped}"
        done = run_cli("rescore", str(out), "-o", str(again), "--reward", reward, "--filter-uniform-groups")
        rescored = json.loads((again / "manifest.json").read_text())
        assert done.returncode == 0 and rescored["filtered_groups"] == dropped, done.stderr.decode()
        said = f"over the {written} rescored (agentroll stats counts the {written - dropped} written)"
        assert (said in flat(done.stderr.decode())) is (dropped > 0)


@pytest.mark.parametrize(("system", "votes"), [("single", False), ("critique-revise", False), ("three-stage", True)])
def test_majority_vote_and_best_of_n_are_shown_only_for_a_system_with_several_solvers(
    sim, problems, tmp_path, system, votes
):
    out = tmp_path / "out"
    run = run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--system", system,
        "--samples-per-prompt", "2", "--num-parallel", "2",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()
    stats = run_cli("stats", str(out)).stdout.decode()
    for text in (flat(run.stderr.decode()), stats):
        assert ("majority vote" in text) is votes and ("best of N" in text) is votes
    assert "pass@2 (executions)" in stats  # best of the K executions, under its own name


def test_an_error_line_is_one_line_in_a_file_and_wrapped_between_words_on_a_terminal(monkeypatch):
    from agentroll.cli import console
    from agentroll.cli.console import Terminal

    message = "every endpoint has been down for 300s (http://gpu-node-17.cluster.example:8000: connection refused)"
    for terminal in (False, True):
        shown = Terminal(file=io.StringIO(), width=60, force_terminal=terminal, color_system=None, markup=False)
        monkeypatch.setattr(console, "err", shown)
        console.error(message)
        lines = shown.file.getvalue().splitlines()  # type: ignore[attr-defined]
        assert flat("\n".join(lines)) == f"error: {message}"
        assert len(lines) == (3 if terminal else 1) and all(len(line) <= 60 for line in lines) is terminal


def test_figures_that_count_per_execution_are_not_said_as_accuracies():
    from agentroll.cli.summary import lines
    from agentroll.record.stats import Figure

    stats = RunStats(problems=2, executions=4, system_correct=2, groups_written=2)
    stats.figures = (Figure("calls_per_execution", "calls per execution", "calls", unit="per execution"),)
    stats.counters = {"calls": 14}
    said = [" ".join(phrases) for phrases in lines(RunResult(stats, ClientCounters(), 1.0, "m", "out"))]
    accuracy = next(line for line in said if line.startswith("accuracy:"))
    assert "calls per execution" not in accuracy and "system 0.500" in accuracy
    assert "calls per execution 3.50" in said


def test_the_accuracy_phrase_holds_only_accuracies_and_a_systems_other_shares_follow_apart():
    """An agent run's summary read "accuracy: agent 0.469, calls continued by ids 0.425, calls with history
    re-rendered 0.000, system 0.469" (a tool-use run's "tool calls ok" too): shares that are no accuracy, under
    that word (a newcomer's trial)."""
    from agentroll.cli import summary
    from agentroll.systems.agent_words import AgentWords

    stats = RunStats(executions=4, system_correct=3)
    stats.use_stages(("agent",), AgentWords())
    result = RunResult(stats, ClientCounters(), 1.0, "m", "out")
    (said,) = [phrases for phrases in summary.lines(result) if phrases[0].startswith("accuracy")]
    shares = "calls continued by ids -, calls with history re-rendered -, agents failed (scored 0) 0.000"
    assert said == ["accuracy: agent 0.000, system 0.750", shares]


def test_the_progress_line_says_how_many_agents_run_finished_and_failed():
    """ "in flight 0" while 42 agents ran their tools (a newcomer's trial): the agent system's progress phrase counts
    its agents, after the calls in flight."""
    from agentroll.run.progress import count_parts
    from agentroll.systems.agent_words import AgentWords

    stats = RunStats()
    stats.use_stages(("agent",), AgentWords())
    assert not any(p.startswith("agents") for p in count_parts(stats, ClientCounters()))  # none started yet
    for name, n in (("agents_started", 7), ("agents_finished", 2), ("agents_failed", 1), ("agents_timed_out", 1)):
        stats.count(name, n)
    parts = count_parts(stats, ClientCounters())
    assert parts[0].startswith("in flight") and parts[1] == "agents running 3, finished 2, failed 2"
