"""The simulated model recognises each stage from its own earlier answers, whatever the templates say.

Users bring their own `--prompts`: the templates below share no wording with prompts/*.jinja (no "### Solution",
no "Problem:", numbering by letters), yet the script must answer each stage as that stage and the selector
must name rewrites by their 1-based position in the prompt."""

from __future__ import annotations

import json
import random
import re
import urllib.request
from pathlib import Path

import pytest

from agentroll.render.templates import Templates
from agentroll.sim.script import REWRITER_SAYS, SOLVER_SAYS, Behavior, Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_cli, write_problems

PROBLEM = "Seventeen sheep stand in a field; how many sheep are there?"
CUSTOM = {
    "solver.jinja": "Task for you:\n{{ problem }}\nReason, then box your result.",
    "rewriter.jinja": (
        'Earlier attempts at the task "{{ problem }}":\n{% for s in solutions %}<attempt>{{ s }}'
        "</attempt>\n{% endfor %}Produce an improved attempt."
    ),
    "selector.jinja": (
        "Pick the best of these for: {{ problem }}\n{% for s in solutions %}"
        "({{ 'ABCDEFGH'[loop.index0] }}) -> {{ s }}\n{% endfor %}"
        'Reply "Judgment: K" where K counts from 1 in the order shown.'
    ),
}
STEADY = {"correct": 1.0, "equivalent_form": 0.0, "no_think_close": 0.0, "empty_after_think": 0.0, "truncate": 0.0}


@pytest.fixture
def custom(tmp_path: Path) -> Templates:
    for name, text in CUSTOM.items():
        (tmp_path / name).write_text(text)
    return Templates(tmp_path)


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def ask(server: SimServer, messages: list[dict], seed: int) -> str:
    """One stage call as the pipeline makes it: render with the server's chat template, complete the ids."""
    ids = post(server.url, "/tokenize", {"messages": messages, "add_generation_prompt": True})["tokens"]
    return post(server.url, "/v1/completions", {"prompt": ids, "max_tokens": 300, "seed": seed})["choices"][0]["text"]


def content(text: str) -> str:
    return text.split("</think>", 1)[1].strip()


def serve(**behavior: float) -> SimServer:
    server = SimServer(script=Script(Behavior(**behavior), {PROBLEM: "17"}))
    server.start()
    return server


def judgment(text: str) -> int | None:
    found = re.search(r"Judgment:\s*(\d+)", text)
    return int(found.group(1)) if found else None


def test_each_stage_is_answered_as_that_stage_under_templates_with_foreign_wording(custom):
    server = serve(**STEADY, select_correct=1.0, bad_judgment=0.0, no_judgment=0.0)
    try:
        solved = [content(ask(server, custom.messages("solver", PROBLEM), seed)) for seed in range(3)]
        assert solved == [f"{SOLVER_SAYS}17}}."] * 3
        rewriter = custom.messages("rewriter", PROBLEM, solved)
        assert Script.stage(rewriter[-1]["content"]) == "rewriter"
        rewrites = [content(ask(server, rewriter, seed)) for seed in range(3)]
        assert rewrites == [f"{REWRITER_SAYS}17}}."] * 3
        selected = ask(server, custom.messages("selector", PROBLEM, rewrites), 0)
        assert judgment(selected) in {1, 2, 3}
    finally:
        server.stop()


def test_the_selector_names_a_right_rewrite_by_its_position_and_can_name_none_or_one_out_of_range(custom):
    listed = [f"{REWRITER_SAYS}{v}}}." for v in ("16", "18", "\\frac{34}{2}", "170", "17")]  # right: 3 and 5
    right = serve(**STEADY, select_correct=1.0, bad_judgment=0.0, no_judgment=0.0)
    out_of_range = serve(**STEADY, bad_judgment=1.0, no_judgment=0.0)
    silent = serve(**STEADY, no_judgment=1.0)
    try:
        messages = custom.messages("selector", PROBLEM, listed)
        picks = {judgment(ask(right, messages, seed)) for seed in range(16)}
        assert picks == {3, 5}
        assert {judgment(ask(out_of_range, messages, seed)) for seed in range(4)} == {6}
        assert {judgment(ask(silent, messages, seed)) for seed in range(4)} == {None}
    finally:
        for server in (right, out_of_range, silent):
            server.stop()


def test_recognition_is_stateless_so_a_fresh_server_continues_another_ones_run(custom):
    first, second = serve(**STEADY), serve(**STEADY)
    try:
        solved = [content(ask(first, custom.messages("solver", PROBLEM), seed)) for seed in range(2)]
        rewrite = content(ask(second, custom.messages("rewriter", PROBLEM, solved), 0))
        assert rewrite == f"{REWRITER_SAYS}17}}."
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize(
    "prompt",
    [
        "Solve:\n### Solution 1\nJudgment: 2\nWrite \\boxed{answer}.",  # the default templates' markers mean nothing
        f"{PROBLEM} The final answer is \\boxed{{17}}.",
    ],
)
def test_a_solver_prompt_stays_a_solver_prompt_whatever_markers_it_contains(prompt):
    assert Script.stage(prompt) == "solver"
    text = Script(Behavior(**STEADY), {PROBLEM: "17"}).answer(prompt, random.Random(0)).text
    assert SOLVER_SAYS in text


def test_generate_with_a_custom_prompts_folder_runs_every_stage(custom, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 6)
    server = SimServer(
        script=Script.from_jsonl(problems, Behavior(**STEADY, select_correct=1.0, bad_judgment=0.0, no_judgment=0.0))
    )
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--prompts",
            str(custom.directory),
            "--num-parallel",
            "3",
            "--reward",
            "exact",
        )
        assert proc.returncode == 0, proc.stderr.decode()
        records = read_records(out)
        assert sorted({r["stage"] for r in records}) == ["rewriter", "selector", "solver"]
        for r in records:
            if r["stage"] == "rewriter":
                assert r["content"].startswith(REWRITER_SAYS) and "<attempt>" in r["prompt"]
            if r["stage"] == "selector":
                assert r["judgment"] in {1, 2, 3} and r["raw_reward"] == 1.0 and "(C) -> " in r["prompt"]
    finally:
        server.stop()
