"""One line per event: a failed group is one line, and many of them fold into counts per reason."""

from __future__ import annotations

import io
import logging
import re

from agentroll.cli.folds import Folds
from agentroll.folder import Manifest
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, run_cli, write_problems

KIND = "groups not written (a rerun redoes them)"


def folded(folds: Folds, clock: list[float], count: int) -> list[str]:
    """`count` failed groups logged through `folds`, one every half second; the lines a person sees."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(folds)
    logger = logging.getLogger("agentroll.test-folds")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(count):
            clock[0] = i * 0.5
            reason = "HTTP 503" if i % 3 else "timed out"
            logger.warning("problem p%03d: not written: %s", i, reason, extra={"fold": (KIND, reason)})
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
    return stream.getvalue().splitlines()


def test_the_first_few_are_said_then_counts_per_reason_every_period_and_at_the_end():
    clock = [0.0]
    folds = Folds(first=2, every_s=10.0, clock=lambda: clock[0])
    lines = folded(folds, clock, 30)  # the period passes once, at the 23rd
    assert lines[0] == "problem p000: not written: timed out"
    assert lines[1].startswith("problem p001: not written: HTTP 503 (more of these are counted")
    assert lines[2] == f"{KIND}: 20 more (13x HTTP 503; 7x timed out), 22 in all so far"
    assert lines[3] == "something else" and len(lines) == 4
    assert folds.said() == [f"{KIND}: 8 more (6x HTTP 503; 2x timed out), 30 in all so far"]
    assert folds.said() == []  # said once


def test_after_a_burst_the_count_is_said_on_the_timer_within_the_period():
    clock = [0.0]
    folds = Folds(first=2, every_s=10.0, clock=lambda: clock[0])
    assert len(folded(folds, clock, 12)) == 3  # two said, the rest counted; then quiet
    assert folds.due() == []  # 10 s have not passed since the last line
    clock[0] = 10.5
    assert folds.due() == [f"{KIND}: 10 more (7x HTTP 503; 3x timed out), 12 in all so far"]
    assert folds.due() == [] and folds.said() == []  # said once


def test_a_run_where_many_groups_fail_says_one_line_per_group_at_most_and_folds_the_rest(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 60)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=0.3), record=False)
    server.start()
    try:
        proc = run_cli(
            "generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url, "--tokenizer",
            TOKENIZER, "--reward", "exact", "--max-retries", "0", "--limit", "60",
        )  # fmt: skip
    finally:
        server.stop()
    stderr = proc.stderr.decode()
    assert proc.returncode == 8, stderr
    failed = Manifest.load(tmp_path / "out").last_run["stats"]["groups_failed"]
    assert failed > 10
    warnings = [line for line in stderr.splitlines() if " WARNING " in line]
    assert not any(" sample " in line for line in warnings)  # a failed call is said by its group's line
    each = [line for line in warnings if "group not written" in line]
    folded = [line for line in warnings if KIND in line]
    assert len(each) == 3 and 1 <= len(folded) <= 3, stderr
    counted = sum(int(n) for line in folded for n in re.findall(r"(\d+)x ", line))
    assert len(each) + counted == failed  # every failed group accounted for
    assert len(warnings) <= 8, stderr
