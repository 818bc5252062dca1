"""Remote reward models, user functions and per-row reward kinds, each driving the shaped rewards end to end."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
from aiohttp import web

from agentroll.errors import RewardError
from agentroll.rewards import FunctionReward, RewardRequest, RewardSet, RewardSettings, make_reward

from .conftest import TOKENIZER, read_records, run_cli, run_process


def grade(response: str, label: str) -> float:
    """The reward model's own rule, independent of agentroll: the label right after the last '\\boxed{'."""
    tail = response.rsplit("\\boxed{", 1)
    return 1.0 if len(tail) == 2 and tail[1].startswith(label + "}") else 0.0


class RewardModel(BaseHTTPRequestHandler):
    seen: list[dict] = []  # noqa: RUF012
    bad = False

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append(body)
        score = grade(body["response"], body["label"])
        reply = (
            b"<html>oops</html>"
            if self.bad
            else json.dumps(score if len(self.seen) % 2 else {"reward": score}).encode()
        )
        self.send_response(200)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def reward_model():
    RewardModel.seen, RewardModel.bad = [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), RewardModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/score"
    server.shutdown()
    server.server_close()


def shaped_correctly(records, correct_weight=2.0, incorrect_weight=0.5):
    by_rollout = {}
    for r in records:
        by_rollout.setdefault(r["rollout_id"], []).append(r)
    for rs in by_rollout.values():
        won = any(r["stage"] == "selector" and r["raw_reward"] == 1.0 for r in rs)
        assert all(r["reward"] == r["raw_reward"] * (correct_weight if won else incorrect_weight) for r in rs)
    return len(by_rollout)


def generate(sim, problems, out, *extra, run=run_cli):
    return run(
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
        "--correct-reward-weight",
        "2",
        "--incorrect-reward-weight",
        "0.5",
        *extra,
    )


def test_a_remote_reward_model_scores_every_sample_and_drives_shaping(sim, problems, tmp_path, reward_model):
    proc = generate(sim, problems, tmp_path / "out", "--reward", "remote", "--reward-url", reward_model)
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert shaped_correctly(records) == 16
    scored = [r for r in records if r["stage"] != "selector"]
    assert len(RewardModel.seen) == len(scored)  # every solver and rewriter sample, with content or not
    assert {tuple(sorted(body)) for body in RewardModel.seen} == {("label", "metadata", "prompt", "response")}
    assert RewardModel.seen[0]["metadata"] == {"topic": "addition"}
    for r in scored:
        assert r["raw_reward"] == grade(r["response"], r["label"])
    assert any(r["raw_reward"] == 1.0 for r in scored) and any(r["raw_reward"] == 0.0 for r in scored)


def test_a_reward_model_that_answers_nonsense_stops_the_run(sim, problems, tmp_path, reward_model):
    RewardModel.bad = True
    # a process of its own: this test's reward server (a thread here) may print its own broken pipes
    proc = generate(
        sim, problems, tmp_path / "out", "--reward", "remote", "--reward-url", reward_model, run=run_process
    )
    assert proc.returncode == 5 and b"reply is not JSON" in proc.stderr and b"Traceback" not in proc.stderr


def test_a_users_function_in_a_file_drives_shaping(sim, problems, tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def score(request):\n"
        "    if request.stage == 'selector':\n"
        "        raise AssertionError('the selector is never scored directly')\n"
        "    return {'reward': 1.0 if request.content and request.label in request.content else 0.0, 'info': 'mine'}\n"
    )
    proc = generate(sim, problems, tmp_path / "out", "--reward", f"{tmp_path / 'my_reward.py'}:score")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    shaped_correctly(records)
    for r in records:
        if r["stage"] != "selector":
            assert r["raw_reward"] == (1.0 if r["content"] and r["label"] in r["content"] else 0.0)
            assert r["reward_info"] == "mine"


def test_rows_can_name_their_own_reward(tmp_path):
    rows = [{"id": "m", "prompt": "x", "label": "42"}, {"id": "e", "prompt": "y", "label": "42", "reward": "exact"}]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from agentroll.inputs import read_problems

    math_row, exact_row = read_problems(str(path))
    rewards = RewardSet(RewardSettings("math"))
    request = [RewardRequest("\\boxed{\\frac{84}{2}}", "42", "p", "solver")]

    async def go():
        try:
            return [(await rewards.get(p.reward).score(request))[0].value for p in (math_row, exact_row)]
        finally:
            await rewards.aclose()

    assert (math_row.reward, exact_row.reward) == (None, "exact")
    assert asyncio.run(go()) == [1.0, 0.0]


def hangs(request):
    time.sleep(5)
    return 1.0


async def hangs_async(request):
    await asyncio.sleep(5)
    return 1.0


def many(requests):
    return [float(len(r.content or "")) for r in requests]


many.batched = True  # type: ignore[attr-defined]


def wrong_type(request):
    return "yes"


def broken(request):
    raise ZeroDivisionError("oops")


@pytest.mark.parametrize("name", ["hangs", "hangs_async"])
def test_a_slow_function_hits_the_timeout_and_scores_zero(name):
    reward = FunctionReward(f"tests.test_reward_kinds:{name}", timeout_s=0.2)
    (result,) = asyncio.run(reward.score([RewardRequest("a", "1", "p", "solver")]))
    assert (result.value, result.failed) == (0.0, "timeout") and "timed out after 0.2s" in result.info


def test_batched_functions_errors_and_bad_return_values():
    requests = [RewardRequest("ab", "1", "p", "solver"), RewardRequest(None, "1", "p", "solver")]
    assert [r.value for r in asyncio.run(FunctionReward("tests.test_reward_kinds:many").score(requests))] == [2.0, 0.0]
    failed = asyncio.run(FunctionReward("tests.test_reward_kinds:broken").score(requests))
    assert {(r.value, r.failed) for r in failed} == {(0.0, "error")} and "ZeroDivisionError" in failed[0].info
    with pytest.raises(RewardError, match="returned 'yes'"):
        asyncio.run(FunctionReward("tests.test_reward_kinds:wrong_type").score(requests))
    with pytest.raises(RewardError, match="no function 'nope'"):
        FunctionReward("tests.test_reward_kinds:nope")
    with pytest.raises(RewardError, match="no file"):
        FunctionReward("missing.py:f")


# --- a sync function that hangs costs only its own sample ------------------------------------------------------


def hangs_on_label(request):
    """Hangs for good on the label "hang" (after saying which process it hangs in), else scores 1."""
    if request.label == "hang":
        with open(request.metadata["pids"], "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(3600)
    return 1.0


def test_hung_sync_calls_cost_only_their_own_samples_and_their_workers_are_replaced(tmp_path):
    """Through the API; through generate, as root and as a user: tests/test_hostile_generate.py."""
    pids = tmp_path / "pids.txt"
    reward = FunctionReward("tests.test_reward_kinds:hangs_on_label", timeout_s=0.5, concurrency=4)

    async def go():
        try:
            requests = [
                RewardRequest("a", "hang" if i % 10 == 0 else "1", "p", "solver", {"pids": str(pids)})
                for i in range(40)
            ]
            return await asyncio.wait_for(reward.score(requests), 120)
        finally:
            await reward.aclose()

    results = asyncio.run(go())
    assert [(r.value, r.failed) for r in results[::10]] == [(0.0, "timeout")] * 4
    assert all("timed out after 0.5s" in (r.info or "") for r in results[::10])
    assert [r.value for i, r in enumerate(results) if i % 10] == [1.0] * 36
    hung = [int(line) for line in pids.read_text().split()]
    assert len(hung) == 4 and not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in hung)


def test_a_function_that_cannot_run_in_a_worker_process_is_refused_at_start(monkeypatch):
    import tests.test_reward_kinds as module

    monkeypatch.setattr(module, "made_at_run_time", lambda request: 1.0, raising=False)
    rewards = RewardSet(RewardSettings("tests.test_reward_kinds:made_at_run_time"))

    async def go():
        try:
            await rewards.ready()
        finally:
            await rewards.aclose()

    with pytest.raises(RewardError, match="cannot run in a worker process"):
        asyncio.run(go())


# --- NaN and infinite rewards are refused and counted ----------------------------------------------------------


def gives_nan(request):
    return float("nan")


def gives_inf_with_info(request):
    return {"reward": float("inf"), "info": "overflowed"}


async def gives_minus_inf(request):
    return -math.inf


def gives_huge_int(request):
    return 10**400


def gives_some_nan(requests):
    return [1.0, float("nan")]


gives_some_nan.batched = True  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "info"),
    [
        ("gives_nan", "reward function returned nan"),
        ("gives_inf_with_info", "reward function returned inf"),
        ("gives_minus_inf", "reward function returned -inf"),
        ("gives_huge_int", "reward function returned inf"),
    ],
)
def test_a_function_returning_nan_or_infinity_is_refused(name, info):
    reward = FunctionReward(f"tests.test_reward_kinds:{name}")
    (result,) = asyncio.run(reward.score([RewardRequest("a", "1", "p", "solver")]))
    assert (result.value, result.info, result.failed) == (0.0, info, "invalid")


def test_a_batched_function_returning_a_nan_is_refused_for_that_value_alone():
    reward = FunctionReward("tests.test_reward_kinds:gives_some_nan")
    results = asyncio.run(reward.score([RewardRequest("a", "1", "p", "solver")] * 2))
    assert [(r.value, r.failed) for r in results] == [(1.0, None), (0.0, "invalid")]


def test_a_rows_own_reward_returning_nan_is_refused():
    rewards = RewardSet(RewardSettings("exact"))

    async def go():
        try:
            reward = rewards.get("tests.test_reward_kinds:gives_nan")  # as a row's `reward` field names it
            return await reward.score([RewardRequest("a", "1", "p", "solver")])
        finally:
            await rewards.aclose()

    assert [(r.value, r.failed) for r in asyncio.run(go())] == [(0.0, "invalid")]


async def serve(handler):
    app = web.Application()
    app.router.add_post("/score", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/score"


def test_a_reward_model_returning_nan_or_infinity_is_refused():
    replies = [b"NaN", b'{"reward": Infinity}', b"-1e999", b"1" + b"0" * 400, b"0.5"]

    async def go():
        async def handler(request):
            return web.Response(body=replies[int((await request.json())["label"])])

        runner, url = await serve(handler)
        reward = make_reward("remote", RewardSettings(url=url))
        try:
            return await reward.score([RewardRequest("a", str(i), "p", "solver") for i in range(len(replies))])
        finally:
            await reward.aclose()
            await runner.cleanup()

    results = asyncio.run(go())
    assert [(r.value, r.failed) for r in results] == [(0.0, "invalid")] * 4 + [(0.5, None)]
    assert [r.info for r in results[:4]] == [
        "the reward model returned nan",
        "the reward model returned inf",
        "the reward model returned -inf",
        "the reward model returned inf",
    ]


# --- the reward model has --reward-timeout per attempt ---------------------------------------------------------


def test_a_reward_model_that_stalls_hits_the_reward_timeout_on_each_attempt():
    async def go():
        stall = asyncio.Event()
        seen: list[tuple[str, float]] = []

        async def handler(request):
            label = (await request.json())["label"]
            seen.append((label, time.monotonic()))
            if label == "never" or sum(1 for s in seen if s[0] == label) == 1:
                await stall.wait()  # stalls: every attempt for "never", the first one for the others
            return web.json_response({"reward": 1.0})

        runner, url = await serve(handler)
        reward = make_reward("remote", RewardSettings(timeout_s=0.3, url=url, max_retries=1))
        try:
            started = time.monotonic()
            retried = await reward.score([RewardRequest("a", "once", "p", "solver")])
            with pytest.raises(RewardError, match=r"failed 2 times; last: no reply within 0.3s"):
                await reward.score([RewardRequest("a", "never", "p", "solver")])
            return retried, seen, time.monotonic() - started
        finally:
            stall.set()
            await reward.aclose()
            await runner.cleanup()

    retried, seen, elapsed = asyncio.run(go())
    assert [(r.value, r.failed) for r in retried] == [(1.0, None)]
    assert [label for label, _ in seen] == ["once", "once", "never", "never"]
    assert seen[1][1] - seen[0][1] >= 0.3 and seen[3][1] - seen[2][1] >= 0.3  # each attempt had its 0.3s
    assert elapsed < 10  # far from the 60s the reward model used to get
