"""A system owns its words: a new system in one file declares a report figure, a folder check and an inspect
label, and `generate`, `stats`, `validate`, `inspect` and `report` show or apply them with no other change. Also
the run counters that carry those figures (they add up across partitions and merges), a figure that does not
apply ("-"), and the report of a rescored folder (no throughput of its own)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentroll.cli.summary import figures as summary_figures
from agentroll.record.stats import RunStats
from agentroll.systems import vocabulary_of
from agentroll.systems.three_stage import ThreeStageWords
from agentroll.systems.votes import Votes
from agentroll.tools.figures import figures
from agentroll.tools.html import render

from . import synthetic
from .conftest import TOKENIZER, read_records, run_cli

PAIR = '''
"""A draft, then a final answer at temperature 0: does the final agree with the draft?"""
from agentroll import System
from agentroll.systems.vocabulary import Figure, Finding, Label, Vocabulary


class PairWords(Vocabulary):
    figures = (Figure("agreement", "draft and final agree", "agreed"),)

    def tally(self, samples):
        return {"agreed": samples[0].raw_reward == samples[-1].raw_reward}

    def check(self, samples):
        final = samples[-1]
        if samples[0].final_reward != final.raw_reward:
            yield Finding(len(samples) - 1, f"the final's raw_reward {final.raw_reward} is not the outcome")

    def label(self, sample, samples):
        last = sample is samples[-1]
        return Label(f"{sample.stage} of the pair", "<- the outcome" if last else "")


class Pair(System):
    stages = ("draft", "final")
    templates = ("solver",)
    vocabulary = PairWords()

    async def run(self, ctx):
        prompt = await ctx.problem_prompt("solver")
        draft = await ctx.complete("draft", prompt, worker=0)
        final = await ctx.complete("final", prompt, worker=0, temperature=0.0)
        await ctx.reward([draft, final])
        ctx.final_reward = final.raw_reward
        ctx.shape([draft, final], won=final.raw_reward == 1)
        return [draft, final]
'''


def agreement(records: list[dict[str, Any]]) -> float:
    executions: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        executions.setdefault(r["rollout_id"], []).append(r)
    return sum(rs[0]["raw_reward"] == rs[-1]["raw_reward"] for rs in executions.values()) / len(executions)


def test_a_new_system_in_one_file_brings_its_figure_check_and_label_to_every_tool(sim, problems, tmp_path):
    system = tmp_path / "pair.py"
    system.write_text(PAIR)
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
        "--reward",
        "exact",
        "--system",
        f"{system}:Pair",
        "--samples-per-prompt",
        "2",
        "--seed",
        "3",
    )
    assert made.returncode == 0, made.stderr.decode()
    records = read_records(out)
    want = agreement(records)
    assert 0 < want < 1  # seeded: both cases happen, so the figure is not trivially right
    # generate: the run's summary and the manifest's report
    assert f"draft and final agree {want:.3f}" in made.stderr.decode()
    report = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]["report"]
    assert report["agreement"] == pytest.approx(want) and list(report)[:1] == ["agreement"]
    # stats: the figure, recomputed from the records, under its name
    shown = run_cli("stats", str(out), "--json")
    assert json.loads(shown.stdout)["all"]["report"]["agreement"] == pytest.approx(want)
    assert "draft and final agree" in run_cli("stats", str(out)).stdout.decode()
    # inspect: the system's labels
    tree = run_cli("inspect", str(out)).stdout.decode()
    assert "draft of the pair · " in tree and "final of the pair · " in tree and "<- the outcome" in tree
    # report: the figure on the page
    page = tmp_path / "report.html"
    assert run_cli("report", str(out), "-o", str(page)).returncode == 0
    assert "draft and final agree" in page.read_text()
    # validate: the folder passes the system's check, and a record that breaks it is a fault at its line
    assert run_cli("validate", str(out)).returncode == 0
    finals = [i for i, r in enumerate(records) if r["stage"] == "final"]

    def break_one(rs: list[dict[str, Any]]) -> None:
        r = rs[finals[0]]
        r["raw_reward"] = 1.0 - r["raw_reward"]

    synthetic.edit(out, break_one)
    checked = run_cli("validate", str(out))
    assert checked.returncode == 6
    text = checked.stdout.decode()
    assert f":{finals[0] + 1}: execution: the final's raw_reward" in text and "is not the outcome" in text
    # the system's file gone: the generic words, said once, and the tools still work
    system.rename(tmp_path / "elsewhere.py")
    fallback = run_cli("stats", str(out), "--json")
    assert fallback.returncode == 0 and "agreement" not in json.loads(fallback.stdout)["all"]["report"]
    assert "no file" in json.loads(fallback.stdout)["warning"]
    assert "its own figures, checks and labels are left out" in run_cli("validate", str(out)).stdout.decode()
    assert run_cli("report", str(out), "-o", str(page)).returncode == 0
    assert "left out" in page.read_text() and "draft and final agree" not in page.read_text()


def execution(*samples: tuple[str, float, str | None], final: float = 0.0) -> list[Any]:
    return [
        SimpleNamespace(
            stage=stage,
            raw_reward=raw,
            final_reward=final,
            content=content,
            status="completed",
            prompt_token_ids=[1],
            response_token_ids=[2],
            listed_as=None,
            judgment=None,
            continues=None,
            teacher_logprobs=None,  # no teacher scored it
        )
        for stage, raw, content in samples
    ]


def test_a_majority_vote_with_nothing_to_vote_on_is_shown_as_not_applying():
    """Programs box no answer: the vote does not apply ("-"), where it used to read 0.000."""
    stats = RunStats()
    stats.use_stages(("solver",), Votes())
    for _ in range(3):
        stats.add_execution(execution(("solver", 1.0, "def f(): return 1"), ("solver", 0.0, None), final=1.0))
    assert stats.report()["majority_vote_accuracy"] is None
    assert stats.report()["best_of_n_accuracy"] == 1.0
    assert "majority vote -, best of N 1.000" in summary_figures(stats)
    stats.add_execution(execution(("solver", 0.0, "\\boxed{3}"), final=0.0))  # one vote: it applies, 0 of 4
    assert stats.report()["majority_vote_accuracy"] == 0.0


def test_run_counters_of_a_system_add_up_and_come_back_from_a_manifest():
    def run(*executions: list[Any]) -> RunStats:
        stats = RunStats()
        stats.use_stages(("solver", "rewriter", "selector"), ThreeStageWords())
        for samples in executions:
            stats.add_execution(samples)
        return stats

    right = execution(("solver", 1.0, "\\boxed{1}"), ("selector", 1.0, "Judgment: 1"), final=1.0)
    wrong = execution(("solver", 0.0, "\\boxed{2}"), final=0.0)
    a, b, whole = run(right), run(wrong, wrong), run(right, wrong, wrong)
    assert (a + b).to_dict() == whole.to_dict()
    assert whole.counters["selections"] == 1 and whole.counters["majority_correct"] == 1
    # what the Ray driver and `merge` do: the manifest's figures back, added, the report recomputed
    back = RunStats.from_dict(a.to_dict()) + RunStats.from_dict(b.to_dict())
    assert back.to_dict() == whole.to_dict()
    assert back.report()["selector_pick_accuracy"] == 1.0 and back.report()["majority_vote_accuracy"] == 1 / 3
    # an older manifest (the counters were fields, no figure list): its counters are kept
    old = {"executions": 2, "majority_correct": 1, "selections": 1, "selector_accuracy": 0.5, "truncation_rate": 0}
    assert RunStats.from_dict(old).counters == {"majority_correct": 1, "selections": 1}
    with pytest.raises(ValueError, match="may not be named"):
        RunStats().count("executions")


def test_the_built_in_systems_declare_their_words():
    assert [f.key for f in vocabulary_of("three-stage").figures][-1] == "selector_pick_accuracy"
    assert [c.name for c in vocabulary_of("three-stage").charts] == ["selector"]
    assert "tool_calls_ok" in [f.key for f in vocabulary_of("tool-use").figures]
    assert type(vocabulary_of("single")).__name__ == "SingleWords"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentroll.sim.script import Script
    from agentroll.sim.server import SimServer

    from .conftest import write_problems

    root = tmp_path_factory.mktemp("derived")
    problems = write_problems(root / "p.jsonl", 4)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        made = run_cli(
            "generate", str(problems), "-o", str(root / "out"), "--base-url", server.url, "--tokenizer", TOKENIZER
        )
    finally:
        server.stop()
    assert made.returncode == 0, made.stderr.decode()
    return root / "out"


def test_the_report_of_a_rescored_folder_shows_no_throughput_of_its_own(generated, tmp_path):
    rescored = tmp_path / "rescored"
    done = run_cli("rescore", str(generated), "-o", str(rescored), "--reward", "exact")
    assert done.returncode == 0, done.stderr.decode()
    page = render(figures(rescored))
    assert "records/s" not in page and 'data-chart="speed"' not in page and 'data-chart="latency"' not in page
    assert f"derived from {generated.resolve()}" in page and "agentroll rescore" in page
    source = render(figures(generated))  # the folder that was generated keeps its throughput
    assert "records/s" in source and 'data-chart="speed"' in source


def test_a_folder_whose_system_is_not_loadable_still_validates(tmp_path):
    folder = synthetic.debate(tmp_path / "debate")  # its system "debate.py:Debate" is nowhere here
    from agentroll.tools.validate import validate

    report = validate(folder)
    assert report.ok and any("debate.py" in w and "left out" in w for w in report.warnings)
