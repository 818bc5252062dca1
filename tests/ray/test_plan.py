"""The pieces of a --ray job that need no cluster: the plan, the output folder, stats that add up, exit codes."""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from agentroll.client import ClientCounters
from agentroll.engine.options import GenerateOptions
from agentroll.errors import ClusterError, InputError, OutputError, UsageError
from agentroll.folder import lock as folder_lock
from agentroll.folder.job import lock_job, prepare_output
from agentroll.folder.manifest import Manifest
from agentroll.record.stats import RunStats, StageStats
from agentroll.run import cluster, cluster_task
from agentroll.run.cluster import RayJob
from agentroll.run.cluster_task import import_ray, run_partition
from agentroll.run.partitions import (
    JsonProgress,
    Outcome,
    add_requests,
    add_stats,
    check_options,
    endpoints,
    job_code,
    job_message,
    plan_tasks,
    ray_address,
    share,
    tasks_at_once,
    unseen_parts,
)
from agentroll.run.run_options import RunOptions
from agentroll.run.runner import RunResult

from ..conftest import TOKENIZER, run_cli

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
        ([URLS[0]], 45),
        ([URLS[1]], 45),
        ([URLS[2]], 45),
    ]
    assert all(t.generate["concurrency"] == "auto" for t in tasks)
    every = plan_tasks(options(tmp_path), given, GenerateOptions(**given), partitions=6, at_once=6)
    assert {t.generate["max_concurrency"] for t in every} == {15}  # all 6 tasks on every endpoint


def test_tasks_at_once_and_shares_are_at_least_one():
    assert tasks_at_once(8, cpus=2.0) == 2 and tasks_at_once(2, cpus=64.0) == 2 and tasks_at_once(4, cpus=0.0) == 1
    assert tasks_at_once(10, cpus=7.0, task_cpus=2.0) == 3
    assert share(64, 3) == 21 and share(2, 8) == 1


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"output": "-"}, "not -o -"),
        ({"input": "-"}, "not stdin"),
        ({"partition": "0/2"}, "use --partitions P, not --partition"),
        ({"limit": 5}, "--limit does not go with --ray"),
        ({"consumer": "trainer", "max_ahead": 4}, "--consumer does not go with --ray"),
        ({"endpoints_per_task": 4}, "more than the 3 --base-url endpoints"),
    ],
)
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


def a_manifest(**fields: Any) -> dict[str, Any]:
    """A manifest with no shards, as the folder package writes one, with `fields` set."""
    return {**Manifest(settings={}).to_dict(), **fields}


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
    (out / "manifest.json").write_text(json.dumps(a_manifest(merged_from=[{"folder": "part-0"}])))
    assert prepare_output(out, None, default=1, overwrite=False) == 3
    assert not (out / "manifest.json").exists()  # the merged view is written again at the end
    assert (out / "part-0" / "rollouts-00000.jsonl").exists()
    assert prepare_output(out, 5, default=1, overwrite=True) == 5  # --overwrite starts over
    assert not (out / "part-0").exists() and (out / "part-x").exists()

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.json").write_text(json.dumps(a_manifest()))
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="holds the rollouts of a run without --ray"):
            prepare_output(plain, None, default=1, overwrite=overwrite)


def sample(stage: str, reward: float, final: float, content: str | None = "x \\boxed{1}") -> Any:
    """What the counters read of a `Sample`."""
    return SimpleNamespace(
        stage=stage,
        raw_reward=reward,
        final_reward=final,
        content=content,
        status="complete",
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        teacher_logprobs=None,  # no teacher scored it
    )


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
    one = {
        "requests": 10,
        "retries": 1,
        "failures": 0,
        "in_flight": 0,
        "peak_in_flight": 4,
        "concurrency": {"http://a": 8},
    }
    two = {
        "requests": 5,
        "retries": 0,
        "failures": 2,
        "in_flight": 1,
        "peak_in_flight": 3,
        "concurrency": {"http://a": 4, "http://b": 6},
    }
    assert add_requests([one, two]) == ClientCounters(
        requests=15, retries=1, failures=2, in_flight=1, peak_in_flight=7, concurrency={"http://a": 12, "http://b": 6}
    )
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


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("auto", "auto"),
        ("local", "local"),
        ("10.0.0.5", "10.0.0.5:6379"),
        ("head:6380", "head:6380"),
        ("ray://head", "ray://head:10001"),
        ("ray://head:10002", "ray://head:10002"),
        ("[::1]", "[::1]:6379"),
        ("[::1]:7000", "[::1]:7000"),
        (" head ", "head:6379"),
    ],
)
def test_a_ray_address_without_a_port_gets_rays_default_one(given, address):
    assert ray_address(given) == address


@pytest.mark.parametrize(
    "given", ["", "  ", "head:", "head:x", "head:70000", "ray://", "::1", "[::1", "[::1]x", "http://head:8265", ":6379"]
)
def test_a_ray_address_ray_could_not_take_is_a_usage_error(given):
    with pytest.raises(UsageError, match="--ray"):
        ray_address(given)


def test_ray_options_without_ray_and_an_empty_ray_are_refused_by_the_cli(tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    base = ["generate", str(data), "-o", str(tmp_path / "o"), "--base-url", URLS[0]]
    for extra, message in (
        (["--ray-retries", "2"], b"--ray-retries goes with --ray"),
        (["--endpoints-per-task", "1"], b"--endpoints-per-task goes with --ray"),
        (["--ray", ""], b"expected auto, local, HOST[:PORT]"),
        (["--ray", "head:x"], b"expected auto, local, HOST[:PORT]"),
    ):
        proc = run_cli(*base, *extra)
        assert proc.returncode == 2 and message in proc.stderr, (extra, proc.stderr)
        assert len(proc.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_relative_paths_are_made_absolute_on_the_driver(tmp_path, monkeypatch):
    """A partition runs on another node, in the driver's working directory only when that exists there."""
    monkeypatch.chdir(tmp_path)
    for name in ("tok", "templates", "stage_tok"):
        (tmp_path / name).mkdir()
    run = options(tmp_path, input="in.jsonl", output="out")
    given = {
        "base_url": URLS,
        "tokenizer": "tok",
        "prompts": "templates",
        "system": "sys.py:Mine",
        "reward": "rewards.py:score",
        "allow_reward": ["math"],
        "stage": ["solver.tokenizer=stage_tok", "judge.tokenizer=Qwen/Qwen3-8B", "solver.max_tokens=64"],
    }
    task = plan_tasks(run, given, GenerateOptions(base_url=URLS), partitions=2, at_once=2)[1]
    assert task.run["input"] == str(tmp_path / "in.jsonl") and task.run["output"] == str(tmp_path / "out" / "part-1")
    mine = task.generate
    assert (mine["tokenizer"], mine["prompts"]) == (str(tmp_path / "tok"), str(tmp_path / "templates"))
    assert mine["system"] == f"{tmp_path / 'sys.py'}:Mine" and mine["reward"] == f"{tmp_path / 'rewards.py'}:score"
    assert mine["allow_reward"] == ["math", "rewards.py:score"]  # a row naming the run's reward as given still may
    assert mine["stage"] == [
        f"solver.tokenizer={tmp_path / 'stage_tok'}",
        "judge.tokenizer=Qwen/Qwen3-8B",
        "solver.max_tokens=64",
    ]
    hub = {"base_url": URLS, "tokenizer": "Qwen/Qwen3-8B", "system": "single", "reward": "mylib.rewards:score"}
    task = plan_tasks(run, hub, GenerateOptions(base_url=URLS), partitions=1, at_once=1)[0]
    assert {k: task.generate[k] for k in hub if k != "base_url"} == {  # hub ids and modules as they are
        "tokenizer": "Qwen/Qwen3-8B",
        "system": "single",
        "reward": "mylib.rewards:score",
    }
    assert "allow_reward" not in task.generate


def test_one_driver_per_job_folder(tmp_path):
    out = tmp_path / "out"
    fd = lock_job(out)
    try:
        with pytest.raises(OutputError, match="in use by another agentroll generate --ray"):
            lock_job(out)
        assert prepare_output(out, 2, default=1, overwrite=True) == 2  # --overwrite keeps the held lock...
        with pytest.raises(OutputError, match="in use by another"):
            lock_job(out)  # ...so a second driver is still refused
    finally:
        os.close(fd)
    os.close(lock_job(out))  # let go: the next driver takes it


def test_overwrite_deletes_no_partition_that_a_process_still_writes(tmp_path):
    out = tmp_path / "out"
    for k in range(2):
        (out / f"part-{k}" / ".agentroll").mkdir(parents=True)
        (out / f"part-{k}" / ".agentroll" / "lock").touch()
        (out / f"part-{k}" / "rollouts-00000.jsonl").write_text("{}\n")
    (out / "manifest.json").write_text(
        json.dumps(a_manifest(merged_from=[{"folder": str(out / "part-0")}, {"folder": str(out / "part-1")}]))
    )
    writer = os.open(out / "part-1" / ".agentroll" / "lock", os.O_RDWR)
    fcntl.flock(writer, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a partition's run holds its folder
    try:
        with pytest.raises(OutputError, match="part-1 is being written by another agentroll process"):
            prepare_output(out, 2, default=1, overwrite=True)
        assert (out / "part-0" / "rollouts-00000.jsonl").exists() and (out / "manifest.json").exists()
    finally:
        os.close(writer)
    assert prepare_output(out, 2, default=1, overwrite=True) == 2
    assert not (out / "part-0").exists() and not (out / "part-1").exists() and not (out / "manifest.json").exists()


def test_a_merged_manifest_of_other_folders_is_not_deleted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = a_manifest(
        merged_from=[{"folder": str(out / "part-0")}, {"folder": str(tmp_path / "other" / "part-1")}]
    )
    (out / "manifest.json").write_text(json.dumps(elsewhere))
    for overwrite in (False, True):
        with pytest.raises(OutputError, match=r"is a merged view of other folders .*other/part-1"):
            prepare_output(out, None, default=1, overwrite=overwrite)
    assert json.loads((out / "manifest.json").read_text()) == elsewhere


def manifest(folder: Path, stats: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(a_manifest(last_run={"stats": stats})))


def test_the_driver_must_see_every_partitions_manifest_as_its_node_wrote_it(tmp_path):
    out = tmp_path / "out"
    done = [Outcome(k, code=0, stats={"problems": 5 + k}) for k in range(2)]
    manifest(out / "part-0", {"problems": 5})
    assert "part-1/manifest.json is not there for the driver" in unseen_parts(out, done)
    assert "shared storage" in unseen_parts(out, done)
    manifest(out / "part-1", {"problems": 3})  # an older copy than the one part-1's node read
    assert "part-1/manifest.json as the driver reads it is not what part-1 wrote" in unseen_parts(out, done)
    manifest(out / "part-1", {"problems": 6})
    assert unseen_parts(out, done) == ""
    assert unseen_parts(out, [Outcome(0, code=0), Outcome(1, code=4)]) == ""  # nothing read on the node: no check


def test_the_jobs_message_says_rerun_only_where_a_rerun_helps(tmp_path):
    def said(*codes: int | None) -> str:
        outcomes = [Outcome(k, code=c) for k, c in enumerate(codes)]
        return job_message(job_code(outcomes), outcomes, tmp_path, 3)

    assert said(0, 0) == ""
    for code in (4, 7, 8):
        assert "run the same command again to resume" in said(0, code)
    assert "--ray-retries (3)" in said(None, 0) and "run the same command again" in said(None, 0)
    for code in (1, 2, 3, 5, 6):
        message = said(0, code)
        assert f"part-1 failed with exit {code}" in message and "fix the cause" in message
        assert "part-1.log" in message


class FakeRay:
    """What a driver calls of Ray, without a cluster: every task stays pending."""

    class exceptions:  # as Ray names it
        class RayError(Exception):
            pass

        class TaskCancelledError(RayError):
            pass

    class Handle:
        def __init__(self, ray: FakeRay) -> None:
            self.ray = ray
            self.read = SimpleNamespace(remote=lambda: "read")

        def options(self, **_: Any) -> FakeRay.Handle:
            return self

        def remote(self, *args: Any) -> FakeRay.Handle:
            self.ray.submitted.append(args)
            return FakeRay.Handle(self.ray)

    def __init__(self, cpus: float, wait_error: Exception | None = None) -> None:
        self.cpus, self.wait_error, self.submitted = cpus, wait_error, []

    def nodes(self) -> list[dict[str, Any]]:
        return [{"Alive": True, "Resources": {"CPU": self.cpus} if self.cpus else {}}]

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus}

    def remote(self, *args: Any, **_: Any) -> Any:
        return FakeRay.Handle(self) if args else (lambda _f: FakeRay.Handle(self))

    def wait(self, pending: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        if self.wait_error is not None:
            raise self.wait_error
        return [], pending

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        return {}

    def cancel(self, ref: Any, force: bool = False) -> None:
        pass

    def shutdown(self) -> None:
        pass


def fake_job(tmp_path: Path, ray: FakeRay) -> RayJob:
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    job = RayJob({"input": str(data), "output": str(tmp_path / "out"), "ray": "127.0.0.1"}, {"base_url": URLS})
    job._ray = ray
    return job


def test_ray_failing_under_the_job_is_one_line_and_exit_9(tmp_path):
    job = fake_job(tmp_path, FakeRay(2, wait_error=RuntimeError("GCS unreachable\nGcsRpcClient: lost")))
    try:
        with pytest.raises(ClusterError, match=r"Ray failed during the job \(RuntimeError: GcsRpcClient: lost\)"):
            job.run()
    finally:
        job.close()
    os.close(lock_job(tmp_path / "out"))  # close() let go of the folder


def test_a_cluster_with_no_cpu_for_a_task_ends_the_job_with_exit_9(tmp_path, monkeypatch):
    monkeypatch.setattr(cluster, "NO_CPU_WAIT_S", 0.0)
    job = fake_job(tmp_path, FakeRay(0))
    try:
        with pytest.raises(ClusterError, match="no node of the Ray cluster had a CPU for a task"):
            job.run()
    finally:
        job.close()


def test_a_signal_before_the_tasks_are_submitted_submits_none(tmp_path):
    ray = FakeRay(2)
    job = fake_job(tmp_path, ray)
    job.stop(15)
    try:
        result = job.run()
    finally:
        job.close()
    assert result.code == 143 and ray.submitted == [] and all(o.cancelled for o in result.outcomes)
    assert (tmp_path / "out" / ".agentroll" / "ray" / "plan.json").exists()


def fake_ray_module(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = SimpleNamespace(is_canceled=lambda: False)
    monkeypatch.setitem(
        sys.modules,
        "ray",
        SimpleNamespace(
            util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"), get_runtime_context=lambda: runtime
        ),
    )


def test_an_os_error_in_the_task_is_the_partitions_exit_6_and_leaves_no_process(tmp_path, monkeypatch):
    psutil = pytest.importorskip("psutil")
    fake_ray_module(monkeypatch)
    state = tmp_path / "out" / ".agentroll" / "ray"
    state.mkdir(parents=True)
    (state / "part-0.attempts").mkdir()  # the attempts line cannot be written: after the child has started
    spec = {
        "job": "j",
        "index": 0,
        "state": str(state),
        "cwd": str(tmp_path),
        "debug": False,
        "run": {"output": str(tmp_path / "out" / "part-0")},
        "generate": {},
    }
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    outcome = run_partition(spec, board=None)
    assert outcome["code"] == 6 and not outcome["cancelled"] and "part-0.attempts" in outcome["tail"]
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # the child was stopped and reaped
    assert "--- part-0, attempt 1 of job j" in (state / "part-0.log").read_text()

    spec["state"] = str(tmp_path / "gone")  # no log can be opened: no child is started at all
    outcome = run_partition(spec, board=None)
    assert outcome["code"] == 6 and "No such file or directory" in outcome["tail"]


def test_the_relay_drains_the_childs_pipe_when_the_board_fails():
    class Board:
        calls = 0

        def remote(self, *_: Any) -> None:
            Board.calls += 1
            raise RuntimeError("the board's node is gone")

    stream = io.BytesIO(b"".join(orjson.dumps({"stats": {"problems": k}}) + b"\n" for k in range(500)) + b"noise\n")
    last: list[dict[str, Any]] = []
    cluster_task._relay(stream, SimpleNamespace(report=Board()), 0, 1, last)
    assert stream.read() == b"" and Board.calls == 500 and last == [{"stats": {"problems": 499}}]


def test_a_retry_does_not_wait_on_storage_without_locks(tmp_path, monkeypatch):
    part = tmp_path / "part-0"
    (part / ".agentroll").mkdir(parents=True)
    (part / ".agentroll" / "lock").touch()

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(folder_lock.fcntl, "flock", no_locks)
    cluster_task._wait_for_writer(part, tmp_path / "part-0.log", "part-0, attempt 2")
    assert not (tmp_path / "part-0.log").exists()  # it said nothing of waiting: it did not wait


def test_a_job_whose_input_runs_out_before_its_target_says_so_once(sim, problems, tmp_path, caplog):
    """Each partition warns in its own log, which the driver does not show: the job says it, for all of them."""
    out = tmp_path / "out"
    prepare_output(out, 2, 2, False)
    for index in range(2):
        done = run_cli("generate", str(problems), "-o", str(out / f"part-{index}"), "--base-url", sim.url,
                       "--tokenizer", TOKENIZER, "--system", "single", "--reward", "exact", "--partition",
                       f"{index}/2", "--target-groups", "20", "-q")  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
    run = {"input": str(problems), "output": str(out), "ray": "local", "target_groups": 20}
    job = RayJob(run, {"base_url": [sim.url]})
    stats = RunStats()
    stats.problems = 8
    result = cluster.JobResult(
        RunResult(stats, ClientCounters(), 1.0, "", str(out)), [Outcome(0, code=0), Outcome(1, code=0)], 1, 2
    )
    with caplog.at_level("WARNING", logger="agentroll"):
        job._merge(result, 2)
    assert result.merged is not None and result.merged.groups == 8
    said = "--target-groups 20: the input ran out at 8 of 20 groups (8 prompts read over 2 partitions)"
    assert result.run.notes == [said] and [r.getMessage() for r in caplog.records] == [said]
