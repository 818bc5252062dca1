"""The head-to-head pieces that need no server: the --policy values, the table and its bootstrap, how the figures
add up through a manifest, the journal key, and a --ray job's plan."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agentroll.context.calls import call_key
from agentroll.engine.options import GenerateOptions
from agentroll.errors import UsageError
from agentroll.inputs import Problem
from agentroll.record.headtohead import Comparison, Tally, bootstrap, problem_key
from agentroll.record.schema import Sample
from agentroll.record.stats import RunStats
from agentroll.run.partitions import plan_tasks
from agentroll.run.run_options import RunOptions
from agentroll.settings.policies import parse_policies, parse_policy


def test_a_policy_value_reads_back_as_given():
    p = parse_policy("new=http://a:8000, http://b:8000,model=ckpt-2,tokenizer=/m/tok,temperature=0.6,top_k=20")
    assert (p.name, p.urls, p.model, p.tokenizer) == ("new", ("http://a:8000", "http://b:8000"), "ckpt-2", "/m/tok")
    assert p.overrides() == {"temperature": 0.6, "top_k": 20}
    assert parse_policy(p.spec()) == p
    moved = parse_policy(p.spec(["http://c:1"], "/abs/tok"))
    assert (moved.urls, moved.tokenizer, moved.sampling) == (("http://c:1",), "/abs/tok", p.sampling)
    assert parse_policy("old=127.0.0.1:8001").urls == ("127.0.0.1:8001",)
    assert parse_policies([]) == ()
    with pytest.raises(UsageError, match="given twice"):
        parse_policy("a=http://x,model=m,model=n")


def test_generate_options_take_policies_in_place_of_base_url(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://from-the-environment:1")  # a user's shell: let go
    given = GenerateOptions(policy=["a=http://x:1", "b=http://y:2"])
    assert given.base_url == [] and [p.name for p in given.policies()] == ["a", "b"]
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(UsageError, match="no server given"):
        GenerateOptions()


def means(rng: random.Random) -> dict[str, float]:
    return {"a": rng.choice([0.0, 0.25, 0.5, 1.0]), "b": rng.choice([0.0, 0.5, 1.0])}


def test_the_table_is_the_same_whatever_order_the_problems_came_in():
    rng = random.Random(3)
    rows = [(f"p{i}", means(rng)) for i in range(200)]
    one, two = Comparison(), Comparison()
    for pid, m in rows:
        one.add(pid, m)
    for pid, m in reversed(rows):
        two.add(pid, m)
    assert one.table() == two.table()
    assert one.table(seed=1) != one.table()  # the seed is what it depends on
    (pair,) = one.table()["pairs"]
    wins = sum(m["a"] > m["b"] for _, m in rows)
    ties = sum(m["a"] == m["b"] for _, m in rows)
    assert (pair["wins"], pair["ties"], pair["losses"]) == (wins, ties, 200 - wins - ties)
    low, high = pair["mean_difference_ci"]
    assert low < pair["mean_difference"] < high


def test_the_bootstrap_says_what_the_data_allow():
    certain = bootstrap([1.0] * 30, resamples=500, seed=0, level=0.95)
    assert certain["mean_difference_ci"] == [1.0, 1.0] and certain["a_better_share"] == 1.0
    even = bootstrap([1.0, -1.0] * 50, resamples=2000, seed=0, level=0.95)
    low, high = even["mean_difference_ci"]
    assert low < 0 < high and 0.3 < even["a_better_share"] < 0.7
    none = Comparison()
    none.add("p", {"a": 1.0, "b": 1.0})
    (pair,) = none.table()["pairs"]
    assert pair["ties"] == 1 and pair["mean_difference_ci"] is None and pair["verdict"].startswith("too few problems")


def test_the_counts_add_up_through_a_manifest_and_the_intervals_need_the_problems():
    rng = random.Random(5)
    a, b = Comparison(), Comparison()
    for i in range(40):
        (a if i % 2 else b).add(f"p{i}", means(rng))
    whole = a + b
    assert whole.tallies() == {("a", "b"): a.tallies()[("a", "b")] + b.tallies()[("a", "b")]}
    assert whole.table()["pairs"][0]["mean_difference_ci"] is not None  # every problem is there
    through = Comparison.from_dict(a.to_dict()) + Comparison.from_dict(b.to_dict())  # the --ray driver's sum
    assert through.tallies() == whole.tallies()
    (pair,) = through.table()["pairs"]
    assert pair["mean_difference_ci"] is None and pair["verdict"].startswith("no interval")
    assert Tally(1, 1, 0, 0, 0.5) + Tally(2, 0, 1, 1, -0.5) == Tally(3, 1, 1, 1, 0.0)
    assert problem_key("p1") == problem_key("p1") != problem_key("p2")


def sample(policy: str | None, final: float, stage: str = "solver") -> Sample:
    fields = {name: None for name in Sample.__dataclass_fields__}
    fields.update(
        problem_id="p", problem_hash="h", rollout_id=f"{policy}{final}", sample_index=0, group_size=2, stage=stage,
        worker=0, prompt="", prompt_token_ids=[], response="", response_token_ids=[], response_logprobs=[],
        loss_mask=[], status="completed", raw_reward=final, reward=final, model="m", endpoint="e", latency_s=0.0,
        attempts=1, final_reward=final, policy=policy, sampling={}, metadata={}, problem="", trainable=True,
        turn=0, rollout_size=1, label="x",
    )  # fmt: skip
    return Sample(**fields)


def test_run_stats_keep_each_policys_figures_and_the_comparison_through_a_manifest():
    stats = RunStats()
    executions = [[sample("new", 1.0)], [sample("new", 1.0)], [sample("old", 0.0)], [sample("old", 1.0)]]
    for samples in executions:
        stats.add_execution(samples)
    stats.compare("p", executions)
    assert stats.executions == 4 and stats.policies["new"].mean_final_reward == 1.0
    assert stats.policies["old"].mean_final_reward == 0.5 and not stats.policies["old"].policies
    back = RunStats.from_dict(stats.to_dict())
    assert back.policies["new"].executions == 2 and back.compared.tallies() == stats.compared.tallies()
    assert (back + back).compared.tallies()[("new", "old")].wins == 2
    assert "policies" not in RunStats().to_dict()  # a run of one model: as before


def test_each_policys_calls_have_their_own_journal_key():
    problem = Problem(id="p", prompt="q", label="1", content_hash="h", line=1, source="x", metadata={})
    sent = ([1, 2], {"temperature": 1.0}, "m", 0)
    plain = call_key(problem, 0, 0, "solver", 0, sent)
    assert plain == call_key(problem, 0, 0, "solver", 0, sent, None)  # a run of one model: journals stay valid
    assert call_key(problem, 0, 0, "solver", 0, sent, "new")[0] != call_key(problem, 0, 0, "solver", 0, sent, "old")[0]


def test_a_ray_job_gives_every_partition_every_policy_on_its_share_of_each_policys_endpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    run = RunOptions(input=str(data), output="out", ray="auto", endpoints_per_task=1)
    given = {"policy": ["new=http://a:1,http://a:2,tokenizer=tok", "old=http://b:1,temperature=0.5"]}
    tasks = plan_tasks(run, given, GenerateOptions(**given), partitions=3, at_once=3)
    for task in tasks:
        again = GenerateOptions(**task.generate)
        new, old = again.policies()
        assert new.urls == (("http://a:1",), ("http://a:2",), ("http://a:1",))[task.index]
        assert new.tokenizer == str(Path(tmp_path / "tok")) and old.urls == ("http://b:1",)
        assert old.overrides() == {"temperature": 0.5} and again.base_url == []


def test_a_verdict_needs_problems_that_differ_and_takes_float_noise_for_a_tie():
    def row(means: list[tuple[float, float]]) -> dict:
        comparison = Comparison()
        for i, (a, b) in enumerate(means):
            comparison.add(f"p{i}", {"a": a, "b": b})
        (pair,) = comparison.table()["pairs"]
        return pair

    one = row([(1.0, 0.0)])  # one problem: every draw is that problem, the interval has no width
    assert one["wins"] == 1 and one["mean_difference_ci"] is None and one["a_better_share"] is None
    assert one["verdict"].startswith("too few problems")
    few = row([(1.0, 0.0)] * 3 + [(0.5, 0.5)])  # 3 wins, a tie: a sign test finds nothing in 3 of 3 (p 0.25)
    assert few["mean_difference_ci"][0] > 0 and few["verdict"].startswith("too few problems that differ (3)")
    swept = row([(1.0, 0.0)] * 6)  # 6 of 6 (p 0.03): as sure as the interval says
    assert swept["verdict"] == "a better"
    lost = row([(0.0, 1.0)] * 5 + [(0.0, 0.5)] + [(1.0, 1.0)] * 10)
    assert lost["verdict"] == "b better"
    # the same rewards summed in another order: equal means but for the last bit, a tie in the counts, and so in
    # the verdict (not `a better` on a difference of 3e-17)
    noise = row([((0.1 + 0.2) / 2, 0.15)] * 30)
    assert noise["ties"] == 30 and noise["a_better_share"] == 0.0
    assert noise["verdict"] == "no clear difference"


def test_a_ray_jobs_cap_per_endpoint_is_shared_by_the_tasks_that_use_each_policys_endpoint(tmp_path, monkeypatch):
    """Under --concurrency auto, `--max-concurrency` is the most an endpoint takes: the tasks running at once that
    share one of a policy's endpoints split it, counted over that policy's endpoints (not all policies' together)."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    run = RunOptions(input=str(data), output="out", ray="auto", endpoints_per_task=1)
    given = {"policy": ["new=http://a:1,http://a:2", "old=http://b:1,http://b:2"], "max_concurrency": 64}
    tasks = plan_tasks(run, given, GenerateOptions(**given), partitions=4, at_once=4)
    users: dict[str, int] = {}
    for task in tasks:
        for policy in GenerateOptions(**task.generate).policies():
            for url in policy.urls:
                users[url] = users.get(url, 0) + task.generate["max_concurrency"]
    assert users == {"http://a:1": 64, "http://a:2": 64, "http://b:1": 64, "http://b:2": 64}
