"""The pieces of a --ray job that need no cluster: the plan, the output folder, stats that add up, exit codes."""

from __future__ import annotations

import io
import json
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from agentroll.client import ClientCounters
from agentroll.cluster import import_ray
from agentroll.errors import InputError, OutputError, UsageError
from agentroll.options import GenerateOptions
from agentroll.partitions import (
    JsonProgress,
    Outcome,
    add_requests,
    add_stats,
    check_options,
    endpoints,
    job_code,
    plan_tasks,
    prepare_output,
    share,
    tasks_at_once,
)
from agentroll.runner import RunOptions
from agentroll.stats import RunStats, StageStats

from ..conftest import run_cli

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]


def options(tmp_path: Path, **run: object) -> RunOptions:
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    return RunOptions(**{"input": str(data), "output": str(tmp_path / "out"), "ray": "auto", **run})


def test_each_task_is_a_partition_of_the_job_with_its_share_of_the_concurrency(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sesame")  # found on the driver, sent to every task
    run = options(tmp_path, output="out", shard_size=7, compression="zstd", overwrite=True)
    given = {"base_url": URLS, "concurrency": "100", "num_parallel": 2}
    tasks = plan_tasks(run, given, GenerateOptions(**given), partitions=4, at_once=3)
    assert [t.index for t in tasks] == [0, 1, 2, 3]
    for task in tasks:
        again = RunOptions(**task.run)  # a valid run of its own
        assert again.partition == f"{task.index}/4" and again.output == str(tmp_path / "out" / f"part-{task.index}")
        assert again.input == str(tmp_path / "in.jsonl")  # absolute: the task runs elsewhere
        assert (again.ray, again.partitions, again.overwrite) == (None, None, False)  # a retry must resume
        assert (again.shard_size, again.compression) == (7, "zstd")
        assert task.generate == {"base_url": URLS, "concurrency": 33, "num_parallel": 2, "api_key": "sesame"}
        assert GenerateOptions(**task.generate).concurrency == 33


def test_endpoints_per_task_go_round_robin_and_auto_concurrency_splits_the_per_endpoint_cap(tmp_path):
    assert [endpoints(URLS, i, 1) for i in range(4)] == [[URLS[0]], [URLS[1]], [URLS[2]], [URLS[0]]]
    assert [endpoints(URLS, i, 2) for i in range(3)] == [URLS[:2], [URLS[2], URLS[0]], URLS[1:]]
    assert endpoints(URLS, 5, None) == URLS
    run = options(tmp_path, endpoints_per_task=1)
    given = {"base_url": URLS, "concurrency": "auto", "max_concurrency": 90}
    tasks = plan_tasks(run, given, GenerateOptions(**given), partitions=6, at_once=6)
    # 6 tasks at once over 3 endpoints, one each: 2 tasks share an endpoint, so each gets half its cap
    assert [(t.generate["base_url"], t.generate["max_concurrency"]) for t in tasks[:3]] == [
        ([URLS[0]], 45), ([URLS[1]], 45), ([URLS[2]], 45)]
    assert all(t.generate["concurrency"] == "auto" for t in tasks)
    every = plan_tasks(options(tmp_path), given, GenerateOptions(**given), partitions=6, at_once=6)
    assert {t.generate["max_concurrency"] for t in every} == {15}  # all 6 tasks on every endpoint


def test_tasks_at_once_and_shares_are_at_least_one():
    assert tasks_at_once(8, cpus=2.0) == 2 and tasks_at_once(2, cpus=64.0) == 2 and tasks_at_once(4, cpus=0.0) == 1
    assert tasks_at_once(10, cpus=7.0, task_cpus=2.0) == 3
    assert share(64, 3) == 21 and share(2, 8) == 1


@pytest.mark.parametrize(("run", "message"), [
    ({"output": "-"}, "not -o -"),
    ({"input": "-"}, "not stdin"),
    ({"partition": "0/2"}, "use --partitions P, not --partition"),
    ({"limit": 5}, "--limit does not go with --ray"),
    ({"consumer": "trainer", "max_ahead": 4}, "--consumer does not go with --ray"),
    ({"endpoints_per_task": 4}, "more than the 3 --base-url endpoints"),
])
def test_what_a_ray_job_cannot_do_is_said_before_it_starts(tmp_path, run, message):
    with pytest.raises(UsageError, match=message):
        check_options(options(tmp_path, **run), GenerateOptions(base_url=URLS))


def test_ray_options_are_checked_like_any_other(tmp_path):
    with pytest.raises(UsageError, match="--partitions goes with --ray"):
        options(tmp_path, ray=None, partitions=2)
    with pytest.raises(UsageError, match="--endpoints-per-task must be a whole number of at least 1"):
        options(tmp_path, endpoints_per_task=0)
    with pytest.raises(UsageError, match="--ray-retries must be a whole number of at least 0"):
        options(tmp_path, ray_retries=-1)
    with pytest.raises(InputError, match="no such file"):
        check_options(options(tmp_path, input=str(tmp_path / "missing.jsonl")), GenerateOptions(base_url=URLS))


def test_the_folder_keeps_its_number_of_partitions_and_refuses_a_run_without_ray(tmp_path):
    out = tmp_path / "out"
    assert prepare_output(out, None, default=3, overwrite=False) == 3  # the cluster's size, the first time
    assert prepare_output(out, None, default=8, overwrite=False) == 3  # a bigger cluster: the same split
    assert prepare_output(out, 3, default=8, overwrite=False) == 3
    with pytest.raises(UsageError, match="split into 3 partitions: rerun it with --partitions 3"):
        prepare_output(out, 5, default=8, overwrite=False)

    (out / "part-0").mkdir()
    (out / "part-0" / "rollouts-00000.jsonl").write_text("{}\n")
    (out / "part-x").mkdir()  # not a partition: kept
    (out / "manifest.json").write_text(json.dumps({"merged_from": [{"folder": "part-0"}]}))
    assert prepare_output(out, None, default=1, overwrite=False) == 3
    assert not (out / "manifest.json").exists()  # the merged view is written again at the end
    assert (out / "part-0" / "rollouts-00000.jsonl").exists()
    assert prepare_output(out, 5, default=1, overwrite=True) == 5  # --overwrite starts over
    assert not (out / "part-0").exists() and (out / "part-x").exists()

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.json").write_text(json.dumps({"format": "agentroll.rollouts", "shards": []}))
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="holds the rollouts of a run without --ray"):
            prepare_output(plain, None, default=1, overwrite=overwrite)


def sample(stage: str, reward: float, final: float, content: str | None = "x \\boxed{1}") -> Any:
    """What the counters read of a `Sample`."""
    return SimpleNamespace(stage=stage, raw_reward=reward, final_reward=final, content=content, status="complete",
                           prompt_token_ids=[1, 2], response_token_ids=[3])


def run_stats(*executions: list[Any], **counts: int) -> RunStats:
    stats = RunStats(**counts)
    for samples in executions:
        stats.add_execution(samples)
    return stats


def test_stats_of_partitions_add_up_to_the_stats_of_one_run():
    right = [sample("solver", 1.0, 1.0), sample("rewriter", 1.0, 1.0), sample("selector", 1.0, 1.0)]
    wrong = [sample("solver", 0.0, 0.0, content=None)]
    a = run_stats(right, problems=3, groups_written=1, problems_skipped_done=2)
    b = run_stats(wrong, wrong, problems=2, groups_written=2, reward_timeouts=1)
    whole = run_stats(right, wrong, wrong, problems=5, groups_written=3, problems_skipped_done=2, reward_timeouts=1)
    assert (a + b).to_dict() == whole.to_dict()
    assert (a + b).report()["system_accuracy"] == pytest.approx(1 / 3)  # recomputed, not added
    assert RunStats.from_dict(a.to_dict()).to_dict() == a.to_dict()  # a manifest's last_run.stats, back
    assert add_stats([a.to_dict(), b.to_dict()]).to_dict() == whole.to_dict()
    assert add_stats([]).to_dict() == RunStats().to_dict()
    assert StageStats(samples=1, truncated=1) + StageStats(samples=2) == StageStats(samples=3, truncated=1)

    other = RunStats()
    other.use_stages(("solver", "critic"))
    other.stage("critic").samples = 4
    both = RunStats.from_dict(a.to_dict()) + other
    assert list(both.stages) == ["solver", "rewriter", "selector", "critic"] and both.stages["critic"].samples == 4


def test_request_counters_add_up_with_each_endpoints_settled_cap():
    one = {"requests": 10, "retries": 1, "failures": 0, "in_flight": 0, "peak_in_flight": 4,
           "concurrency": {"http://a": 8}}
    two = {"requests": 5, "retries": 0, "failures": 2, "in_flight": 1, "peak_in_flight": 3,
           "concurrency": {"http://a": 4, "http://b": 6}}
    assert add_requests([one, two]) == ClientCounters(requests=15, retries=1, failures=2, in_flight=1,
                                                      peak_in_flight=7, concurrency={"http://a": 12, "http://b": 6})
    assert add_requests([]) == ClientCounters()


def test_the_jobs_exit_code():
    assert job_code([Outcome(0, code=0), Outcome(1, code=0)]) == 0
    assert job_code([Outcome(0, code=0), Outcome(1, code=8), Outcome(2, code=8)]) == 8
    assert job_code([Outcome(0, code=8), Outcome(1, code=4), Outcome(2, code=6)]) == 4
    assert job_code([Outcome(0, code=4), Outcome(1, code=None)]) == 9  # a task lost for good


def test_a_partition_streams_its_counters_as_json_lines():
    stream = io.BytesIO()
    progress = JsonProgress(stream, every_s=3600)
    stats, requests = RunStats(problems=1), ClientCounters(requests=2)
    progress.stop()
    assert stream.getvalue() == b""  # nothing seen, nothing said
    progress.advance(stats, requests)  # the first at once...
    stats.problems = 2
    progress.advance(stats, requests)  # ...then at most every `every_s`...
    stats.problems = 3
    progress.stop()  # ...and the last at the end
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["stats"]["problems"] for line in lines] == [1, 3] and lines[0]["requests"]["requests"] == 2


def test_without_ray_installed_the_flag_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(UsageError, match=r"pip install 'agentroll\[ray\]'"):
        import_ray()


def test_a_bad_ray_job_is_refused_by_the_cli_before_any_cluster_is_reached(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    proc = run_cli("generate", str(data), "-o", "-", "--base-url", URLS[0], "--ray", "127.0.0.1:1")
    assert proc.returncode == 2 and b"--ray writes into a folder" in proc.stderr
    proc = run_cli("generate", str(data), "-o", str(tmp_path / "o"), "--base-url", URLS[0], "--partitions", "2")
    assert proc.returncode == 2 and b"--partitions goes with --ray" in proc.stderr


def test_a_cluster_that_does_not_answer_is_exit_9_at_once(tmp_path):
    pytest.importorskip("ray", reason="the Ray tier needs ray: pip install '.[test]' (or 'agentroll[ray]')")
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    started = time.monotonic()
    proc = run_cli("generate", str(data), "-o", str(tmp_path / "o"), "--base-url", URLS[0], "--ray", address)
    assert proc.returncode == 9 and f"cannot reach the Ray cluster ({address})".encode() in proc.stderr
    assert time.monotonic() - started < 30 and not (tmp_path / "o").exists()
