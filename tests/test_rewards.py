import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentroll.errors import RewardError
from agentroll.rewards import ExactReward, MathReward, RewardRequest, make_reward
from agentroll.rewards._pool import WORKER

from .conftest import TOKENIZER

ROOT = Path(__file__).resolve().parents[1]
SLOW_S = 0.15


def score(reward, *pairs):
    requests = [RewardRequest(content, label, "problem", "solver") for content, label in pairs]
    try:
        return [r.value for r in asyncio.run(reward.score(requests))]
    finally:
        asyncio.run(reward.aclose())


def test_math_counts_equal_values_in_other_forms():
    got = score(
        MathReward(),
        ("so \\boxed{\\frac{84}{2}}", "42"),
        ("\\boxed{\\frac12}", "0.5"),
        ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}"),
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}"),
        ("\\boxed{41}", "42"),
        ("first \\boxed{42} then \\boxed{7}", "42"),
        ("42 without a box", "42"),
        (None, "42"),
        ("\\boxed{50\\%}", "0.5"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
    )
    assert got == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def test_math_explains_a_zero():
    reward = MathReward()
    try:
        results = asyncio.run(
            reward.score([RewardRequest("no box", "1", "p", "solver"), RewardRequest(None, "1", "p", "solver")])
        )
    finally:
        asyncio.run(reward.aclose())
    assert [r.info for r in results] == ["no \\boxed{} answer", "no answer content"]


def test_exact_normalizes_case_space_and_dollars():
    assert score(ExactReward(), ("\\boxed{ Paris }", "paris"), ("$x  +1$", "X +1"), ("\\boxed{1/2}", "0.5")) == [
        1.0,
        1.0,
        0.0,
    ]


def test_unknown_reward_is_an_error():
    with pytest.raises(RewardError):
        make_reward("nope")


# --- the math workers, with a stand-in for math-verify -------------------------------------------------------


def check_for_tests(label: str, answer: str, timeout_s: int) -> bool:
    """Runs in the math worker in math-verify's place (AGENTROLL_MATH_CHECK): `hang` never returns, `slow:X`
    takes SLOW_S and then compares X, `die` kills the worker, `raise` raises; anything else is plain equality."""
    if answer == "hang":
        time.sleep(3600)
    if answer == "die":
        os._exit(3)
    if answer == "raise":
        raise ValueError("no good")
    if answer.startswith("slow:"):
        time.sleep(SLOW_S)  # a check that takes a while, not a synchronisation
        answer = answer[5:]
    return label == answer


@pytest.fixture
def fake_check(monkeypatch):
    monkeypatch.setenv("AGENTROLL_MATH_CHECK", "tests.test_rewards:check_for_tests")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def ask(*pairs):
    """Math requests for the stand-in check. Numbers become `n7`: plain numbers take the parent's fast path
    (rules.quick_verdict) and would never reach the worker these tests are about."""

    def tag(x: str) -> str:
        if x.startswith("slow:"):
            return "slow:" + tag(x[5:])
        return f"n{x}" if x.isdigit() else x

    return [RewardRequest(f"\\boxed{{{tag(answer)}}}", tag(label), "p", "solver") for answer, label in pairs]


def test_a_hung_check_times_out_alone_and_the_checks_queued_behind_it_go_on(fake_check):
    reward = MathReward(timeout_s=0.6, workers=1)
    slow = [(f"slow:{k}", str(k if k % 3 else k + 1)) for k in range(8)]  # 8 x 0.15s queued: more than 0.6s
    requests = ask(("hang", "1"), *slow, ("hang", "2"), ("7", "7"))

    async def go():
        try:
            return await reward.score(requests)
        finally:
            await reward.aclose()

    started = time.monotonic()
    results = asyncio.run(go())
    elapsed = time.monotonic() - started
    assert [(r.value, r.failed) for r in results] == [
        (0.0, "timeout"),
        *[(0.0 if k % 3 == 0 else 1.0, None) for k in range(8)],
        (0.0, "timeout"),
        (1.0, None),
    ]
    assert results[0].info == "math-verify timed out after 0.6s"
    # Each queued check waited past the timeout in all, and none counted that wait against itself.
    assert elapsed > 2 * 0.6 + 8 * SLOW_S


def test_a_caller_that_gives_up_leaves_the_workers_right(fake_check):
    reward = MathReward(timeout_s=0.5, workers=1)

    async def go():
        assert [r.value for r in await reward.score(ask(("0", "0")))] == [1.0]  # the worker is up and idle
        # Cancelled while running: its late verdict ("equal") must not be taken for the next check's.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reward.score(ask(("slow:5", "5"))), SLOW_S / 3)
        after_running = await reward.score(ask(("x", "y")))
        # Cancelled while hung, with checks queued behind it: those are dropped; the worker is replaced.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reward.score(ask(("hang", "1"), ("1", "1"), ("2", "2"))), 0.05)
        after_hung = await reward.score(ask(("3", "3"), ("4", "5")))
        return after_running, after_hung

    try:
        after_running, after_hung = asyncio.run(go())
        assert [(r.value, r.failed) for r in after_running] == [(0.0, None)]
        assert [(r.value, r.failed) for r in after_hung] == [(1.0, None), (0.0, None)]
    finally:
        asyncio.run(reward.aclose())


def test_a_check_abandoned_with_its_event_loop_does_not_block_the_next_loop(fake_check):
    reward = MathReward(timeout_s=30, workers=1)

    async def give_up():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reward.score(ask(("hang", "1"))), 0.05)

    try:
        asyncio.run(give_up())  # the loop closes while the worker hangs on that check
        started = time.monotonic()
        assert [r.value for r in asyncio.run(reward.score(ask(("6", "6"), ("6", "7"))))] == [1.0, 0.0]
        assert time.monotonic() - started < 20  # not behind the 30s timeout of the abandoned check
        assert [r.value for r in asyncio.run(reward.score(ask(("8", "8"))))] == [1.0]  # an idle worker follows
    finally:
        asyncio.run(reward.aclose())


def test_a_check_that_raises_or_kills_its_worker_scores_zero_and_the_next_ones_work(fake_check):
    reward = MathReward(timeout_s=5, workers=2)

    async def go():
        try:
            return await reward.score(ask(("die", "1"), ("raise", "1"), ("1", "1"))), await reward.score(
                ask(("2", "2"))
            )
        finally:
            await reward.aclose()

    first, second = asyncio.run(go())
    assert [(r.value, r.failed) for r in first + second] == [(0.0, "error"), (0.0, "error"), (1.0, None), (1.0, None)]
    assert first[0].info == "math-verify error: the math worker died (exit code 3)"
    assert first[1].info == "math-verify error: ValueError: no good"


def test_a_worker_killed_while_idle_is_replaced_and_the_check_sent_to_it_is_not_lost(fake_check):
    reward = MathReward(timeout_s=5)
    try:
        assert [r.value for r in asyncio.run(reward.score(ask(("1", "1"))))] == [1.0]
        (worker,) = [p for p in psutil.Process().children() if any(a.endswith("_worker.py") for a in p.cmdline())]
        worker.kill()  # between event loops: nothing watches its pipe, the next check is written to a dead worker
        os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)
        assert [(r.value, r.failed) for r in asyncio.run(reward.score(ask(("2", "2"))))] == [(1.0, None)]
    finally:
        asyncio.run(reward.aclose())


def test_a_worker_that_cannot_start_is_a_set_up_failure_not_a_zero_for_every_answer(monkeypatch):
    monkeypatch.setenv("AGENTROLL_MATH_CHECK", "agentroll_no_such_module:check")
    reward = MathReward(timeout_s=5)
    try:
        with pytest.raises(RewardError, match="could not start"):
            asyncio.run(reward.score(ask(("x^2", "x^2"), ("y", "y"))))  # off the fast path: a worker is needed
        with pytest.raises(RewardError, match="the math reward cannot check answers"):
            asyncio.run(reward.ready())
    finally:
        asyncio.run(reward.aclose())


def test_a_worker_that_cannot_start_says_why_in_one_line_with_its_own_exit_code(monkeypatch, capfd, caplog):
    """The cause is the worker's own (its exit 1 and the import error), not the kill that cleaned up after it
    (exit -9), and the worker prints no traceback of its own before our one line."""
    monkeypatch.setenv("AGENTROLL_MATH_CHECK", "agentroll_no_such_module:check")
    reward = MathReward(timeout_s=5)
    try:
        with pytest.raises(RewardError) as failed:
            asyncio.run(reward.ready())
    finally:
        asyncio.run(reward.aclose())
    message = str(failed.value)
    assert "\n" not in message and "-9" not in message
    assert "exit code 1" in message and "No module named 'agentroll_no_such_module'" in message
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "math worker" in r.getMessage()]  # said once: by the error


def test_a_worker_whose_parent_is_already_gone_exits_at_once():
    """The race PR_SET_PDEATHSIG leaves open (the parent died before the call) is closed by a parent check."""
    not_its_parent = os.getppid()
    done = subprocess.run(
        [sys.executable, WORKER, str(not_its_parent)], input=b'["1", "1", 1]\n', capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, b"")


def test_the_verdict_cache_spares_the_worker(fake_check):
    reward = MathReward(timeout_s=0.5)

    async def go():
        try:
            first = await reward.score(ask(("slow:8", "8")))
            started = time.monotonic()
            again = await reward.score(ask(("slow:8", "8")) * 20)
            return first, again, time.monotonic() - started
        finally:
            await reward.aclose()

    first, again, elapsed = asyncio.run(go())
    assert [r.value for r in first + again] == [1.0] * 21
    assert elapsed < 20 * SLOW_S / 2


def test_the_fast_paths_give_math_verifys_own_verdicts_on_a_corpus():
    """The integer fast path and the per-worker label cache must not change one verdict: compared with plain
    math-verify (parse both, verify) on pairs that take the fast path and pairs that do not."""
    from math_verify import parse, verify

    from agentroll.rewards._worker import math_equal
    from agentroll.rewards.rules import quick_verdict

    labels = [
        "42",
        "-7",
        "0",
        "042",
        "+5",
        "1000000000000000000001",
        "0.5",
        "\\frac{1}{2}",
        "x^2+1",
        "3.14159",
        "\\dfrac{3}{4}",
        "-\\frac{14}{2}",
    ]
    answers = [
        "42",
        "43",
        "-7",
        "7",
        "-0",
        "0",
        "42.0",
        "\\frac{84}{2}",
        "5",
        "+5",
        "05",
        "1000000000000000000001",
        "1000000000000000000000",
        "\\frac{1}{2}",
        "0.5",
        "1+x^2",
        "x^2",
        "3.141592",
        "4 2",
        " 42 ",
        "\\frac{85}{2}",
        "-\\frac{14}{2}",
        "\\tfrac{6}{8}",
        "\\frac{3}{4}",
        "\\frac{1}{0}",
        "\\frac{0}{5}",
        "\\frac{ 84 }{ 2 }",
        "\\frac{2}{4}",
    ]
    fast = 0
    for label in labels:
        for answer in answers:
            gold, pred = parse(f"${label}$"), parse(f"${answer}$")
            plain = bool(gold and pred and verify(gold, pred))
            quick = quick_verdict(label, answer)
            if quick is not None:
                fast += 1
                assert quick == plain, (label, answer)
            assert math_equal(label, answer, 5) == plain, (label, answer)  # labels parsed once, cached
    assert fast >= 60  # the corpus exercises the fast path, not only the slow one


def test_a_math_worker_that_cannot_start_is_exit_5_before_any_group_is_written(sim, problems, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from agentroll.cli import app
    from agentroll.folder import Manifest

    monkeypatch.setenv("AGENTROLL_MATH_CHECK", "no_such_module_here:check")  # the worker dies as it starts
    result = CliRunner().invoke(
        app,
        ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "-q"],
    )
    assert result.exit_code == 5, result.output
    assert "the math reward cannot check answers" in result.output
    assert Manifest.load(tmp_path / "out").groups == 0 and not Manifest.load(tmp_path / "out").complete
