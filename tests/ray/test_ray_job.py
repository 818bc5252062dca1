"""`generate --ray` end to end on a local Ray cluster: a task killed mid-work is retried by Ray and resumes, the
merged output holds every problem exactly once, and Ctrl-C stops every partition cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import agentroll
from agentroll.inputs import in_partition
from agentroll.sim.faults import Faults
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from ..conftest import TOKENIZER, read_records, write_problems
from .conftest import Cluster, ray_env, running

PROBLEMS = 40
PARTITIONS = 4


@pytest.fixture
def slow_sim(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """40 problems and a simulated server taking 0.25 s a completion: a partition works for a few seconds."""
    problems = write_problems(tmp_path / "problems.jsonl", PROBLEMS)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.25), record=False)
    url = server.start()
    yield problems, url
    server.stop()


def start_job(cluster: Cluster, problems: Path, url: str, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    """The job's driver, its stderr into a file beside OUT (`finish` reads it)."""
    cmd = [
        sys.executable,
        "-m",
        "agentroll",
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--shard-size",
        "2",
        "--concurrency",
        "4",
        "--ray",
        cluster.address,
        "--partitions",
        str(PARTITIONS),
        *extra,
    ]
    with open(out.parent / "driver.log", "wb") as log:
        return subprocess.Popen(cmd, env=cluster.env, stdout=log, stderr=log)


def finish(job: subprocess.Popen[bytes], out: Path, timeout: float = 240) -> tuple[int, str]:
    code = job.wait(timeout=timeout)
    return code, (out.parent / "driver.log").read_text(errors="replace")


def attempts(out: Path, index: int) -> list[dict]:
    path = out / ".agentroll" / "ray" / f"part-{index}.attempts"
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def committed(part: Path) -> set[str]:
    """Problems with records in the partition's shards so far (a line being written is passed over)."""
    ids = set()
    for shard in part.glob("rollouts-*"):
        for line in shard.read_bytes().split(b"\n"):
            try:
                ids.add(json.loads(line)["problem_id"])
            except ValueError:
                continue
    return ids


def mid_work(out: Path, job: subprocess.Popen[bytes], skip: set[int]) -> tuple[int, dict]:
    """A partition not in `skip` whose first attempt has written some of its problems (two: the first is then
    surely whole) but not half: (its index, its attempt record). Fails if none is seen before the job ends."""
    sizes = [sum(in_partition(f"p{i:03d}", k, PARTITIONS) for i in range(PROBLEMS)) for k in range(PARTITIONS)]
    deadline = time.monotonic() + 120
    while job.poll() is None and time.monotonic() < deadline:
        for index in set(range(PARTITIONS)) - skip:
            tried = attempts(out, index)
            if len(tried) == 1 and running(tried[0]["child"]):
                done = len(committed(out / f"part-{index}"))
                if 2 <= done <= sizes[index] // 2:
                    return index, tried[0]
        time.sleep(0.05)  # other processes' progress: files to look at again
    pytest.fail(f"no partition was caught in the middle of its work (job exit {job.poll()})")


def wait_for(what: str, found: Callable[[], bool], job: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen (job exit {job.poll()})")
        time.sleep(0.05)  # other processes' progress: files to look at again


def test_a_partition_lost_twice_over_is_retried_by_ray_and_every_problem_is_written_once(
    ray_cluster, slow_sim, tmp_path
):
    problems, url = slow_sim
    out = tmp_path / "out"
    started = time.monotonic()
    job = start_job(ray_cluster, problems, url, out)
    first: dict = {}
    try:
        # only the partition's process killed (say, by the OOM killer): its task raises, Ray retries it
        process_lost, second = mid_work(out, job, set())
        os.kill(second["child"], signal.SIGKILL)
        # the task's worker lost (Ray's memory monitor, a crash), its partition's process still alive and still
        # holding the folder: stopped first, so it cannot finish on its own meanwhile (nor can the job)
        worker_lost, first = mid_work(out, job, {process_lost})
        os.kill(first["child"], signal.SIGSTOP)
        os.kill(first["pid"], signal.SIGKILL)
        log = out / ".agentroll" / "ray" / f"part-{worker_lost}.log"
        wait_for("the retry waiting for the lost attempt's lock", lambda: b"waiting up to" in log.read_bytes(), job)
        assert running(first["child"]) and len(attempts(out, worker_lost)) == 1  # the retry has not started a run
        # meanwhile a second driver on the same folder (the command run again, a requeue) is refused at once,
        # even with --overwrite, and deletes nothing
        second_driver = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                str(problems),
                "-o",
                str(out),
                "--base-url",
                url,
                "--tokenizer",
                TOKENIZER,
                "--ray",
                ray_cluster.address,
                "--overwrite",
            ],
            env=ray_cluster.env,
            capture_output=True,
            timeout=120,
        )
        assert second_driver.returncode == 6, second_driver.stderr.decode(errors="replace")[-2000:]
        assert b"is in use by another agentroll generate --ray" in second_driver.stderr
        assert (out / f"part-{worker_lost}" / "manifest.json").exists()
        os.kill(first["child"], signal.SIGCONT)  # its parent's death sent it SIGTERM: it closes its folder now
        wait_for("the retry's run", lambda: len(attempts(out, worker_lost)) == 2, job)
        # the retry's run began only once the lost attempt's process had taken its SIGTERM and let go
        text = log.read_text(errors="replace")
        assert text.index("waiting up to") < text.index("SIGTERM: finishing up") < text.index(", attempt 2 of job")
        code, stderr = finish(job, out)
    finally:
        job.kill()
        if first:  # never leave it stopped: it takes its SIGTERM and ends
            with contextlib.suppress(OSError):
                os.kill(first["child"], signal.SIGCONT)
    wall = time.monotonic() - started
    assert code == 0, stderr[-3000:]

    for index, killed in ((worker_lost, first), (process_lost, second)):
        tried = attempts(out, index)
        assert [a["attempt"] for a in tried] == [1, 2] and tried[1]["job"] == killed["job"]
        assert tried[1]["child"] != killed["child"]
        assert f"part-{index}: 2 attempts" in stderr
        last_run = json.loads((out / f"part-{index}" / "manifest.json").read_text())["last_run"]["stats"]
        # the retry found the lost attempt's groups on disk and did only the rest
        assert last_run["problems_skipped_done"] >= 1 and last_run["groups_written"] >= 1
    assert attempts(out, worker_lost)[1]["pid"] != first["pid"]  # the lost worker's task ran in another worker

    ids = Counter(group.problem_id for group in agentroll.read_groups(out))
    assert set(ids) == {f"p{i:03d}" for i in range(PROBLEMS)} and set(ids.values()) == {1}
    merged = json.loads((out / "manifest.json").read_text())
    assert merged["complete"] and merged["groups"] == PROBLEMS
    assert [m["folder"] for m in merged["merged_from"]] == [str(out / f"part-{k}") for k in range(PARTITIONS)]
    assert merged["records"] == sum(1 for _ in agentroll.read_records(out))
    checked = subprocess.run(
        [sys.executable, "-m", "agentroll", "validate", str(out)], capture_output=True, env=ray_cluster.env, timeout=120
    )
    assert checked.returncode == 0, checked.stdout.decode()
    for index in range(PARTITIONS):  # no partition's process outlived its task
        assert not any(running(a["child"]) for a in attempts(out, index))
    print(f"ray tier: job with two lost partitions took {wall:.1f}s")


def test_ctrl_c_stops_every_partition_cleanly_and_the_same_command_resumes(ray_cluster, slow_sim, tmp_path):
    problems, url = slow_sim
    out = tmp_path / "out"
    job = start_job(ray_cluster, problems, url, out)
    try:
        busy, _ = mid_work(out, job, set())
        job.send_signal(signal.SIGINT)
        code, stderr = finish(job, out, timeout=120)
    finally:
        job.kill()
    assert code == 130, stderr[-3000:]
    assert "stopping every partition" in stderr
    assert not (out / "manifest.json").exists()  # nothing merged: the job did not finish
    started = [k for k in range(PARTITIONS) if attempts(out, k)]
    assert started
    for index in started:
        assert not any(running(a["child"]) for a in attempts(out, index))
        path = out / f"part-{index}" / "manifest.json"
        if not path.exists():  # stopped while it started up, before it began writing
            assert not committed(out / f"part-{index}")
            continue
        # closed by its own run (done, or on SIGTERM): the last run's figures are in
        manifest = json.loads(path.read_text())
        assert manifest["last_run"].get("wall_s") is not None
    busy_manifest = json.loads((out / f"part-{busy}" / "manifest.json").read_text())
    assert busy_manifest["complete"] is False and busy_manifest["last_run"]["stats"]["groups_written"] >= 2
    before = {pid for k in started for pid in committed(out / f"part-{k}")}
    assert before  # some work was done before the stop...

    again = start_job(ray_cluster, problems, url, out)
    code, stderr = finish(again, out)
    assert code == 0, stderr[-3000:]
    ids = Counter(group.problem_id for group in agentroll.read_groups(out))
    assert set(ids) == {f"p{i:03d}" for i in range(PROBLEMS)} and set(ids.values()) == {1}
    skipped = sum(
        json.loads((out / f"part-{k}" / "manifest.json").read_text())["last_run"]["stats"]["problems_skipped_done"]
        for k in range(PARTITIONS)
    )
    assert skipped >= len(before)  # ...and the rerun kept it instead of doing it again


def test_a_partition_that_fails_for_good_is_not_retried_and_its_code_is_the_jobs(ray_cluster, sim, problems, tmp_path):
    """Tasks 1 and 3 get the endpoint nobody serves (--endpoints-per-task 1, round-robin): they exit 4 at once, Ray
    does not run them again, the others finish, and nothing is merged."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            f"{sim.url},{dead}",
            "--endpoints-per-task",
            "1",
            "--down-timeout",
            "1",
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "1",
            "--reward",
            "exact",
            "--ray",
            ray_cluster.address,
            "--partitions",
            "4",
        ],
        env=ray_cluster.env,
        capture_output=True,
        timeout=240,
    )
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 4, stderr[-3000:]
    for index in (0, 2):
        assert json.loads((out / f"part-{index}" / "manifest.json").read_text())["complete"]
    for index in (1, 3):
        assert not (out / f"part-{index}" / "manifest.json").exists()
        assert [a["attempt"] for a in attempts(out, index)] == [1]  # not retried: a rerun would fail the same way
        assert f"part-{index}: exit 4" in stderr and "cannot reach" in stderr
    assert not (out / "manifest.json").exists()
    endpoints = {r["endpoint"] for k in (0, 2) for r in read_records(out / f"part-{k}")}
    assert endpoints == {sim.url}  # tasks 0 and 2 were given the live endpoint only
    assert {r["problem_id"] for k in (0, 2) for r in read_records(out / f"part-{k}")} == {
        f"p{i:03d}" for i in range(8) if in_partition(f"p{i:03d}", 0, 4) or in_partition(f"p{i:03d}", 2, 4)
    }


def test_ray_local_starts_a_cluster_for_the_job_with_one_partition_per_node(sim, problems, tmp_path):
    pytest.importorskip("ray", reason="the Ray tier needs ray: pip install '.[test]' (or 'agentroll[ray]')")
    temp = tempfile.mkdtemp(prefix="ar-ray-")  # the local cluster's files (short: Ray's socket paths)
    env = {**ray_env(), "RAY_TMPDIR": temp}
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
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
                "--reward",
                "exact",
                "--ray",
                "local",
            ],
            env=env,
            capture_output=True,
            timeout=240,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    merged = json.loads((out / "manifest.json").read_text())
    assert [m["folder"] for m in merged["merged_from"]] == [str(out / "part-0")]  # one node: one partition
    assert merged["complete"] and merged["groups"] == 8
    assert sorted(g.problem_id for g in agentroll.read_groups(out)) == [f"p{i:03d}" for i in range(8)]


def test_a_row_that_is_not_json_is_skipped_once_and_the_job_ends_0_every_time(ray_cluster, sim, problems, tmp_path):
    """Under --skip-invalid an unreadable row has no id: one partition counts it, and no partition fails for it."""
    rows = problems.read_text().splitlines()
    problems.write_text("\n".join([rows[0], "{not json", *rows[1:]]) + "\n")
    out = tmp_path / "out"
    for _ in range(2):  # and the same command again
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                str(problems),
                "-o",
                str(out),
                "--base-url",
                sim.url,
                "--tokenizer",
                TOKENIZER,
                "--num-parallel",
                "1",
                "--reward",
                "exact",
                "--skip-invalid",
                "--ray",
                ray_cluster.address,
                "--partitions",
                "3",
            ],
            env=ray_cluster.env,
            capture_output=True,
            timeout=240,
        )
        stderr = proc.stderr.decode(errors="replace")
        assert proc.returncode == 0, stderr[-3000:]
    assert "problems 8 (already done 8)" in stderr and "invalid rows 1" in stderr  # the bad row no problem
    assert sorted(g.problem_id for g in agentroll.read_groups(out)) == [f"p{i:03d}" for i in range(8)]


def test_a_head_to_head_job_runs_every_policy_in_every_partition(ray_cluster, problems, tmp_path):
    """`--policy` under --ray: each partition runs both policies on its slice; the merged folder holds each problem
    once, with K executions of each policy, and its head-to-head table covers every problem."""
    strong = SimServer(script=Script.from_jsonl(problems), model="strong", record=False)
    weak = SimServer(script=Script.from_jsonl(problems), model="weak", seed=1, record=False)
    strong.start()
    weak.start()
    out = tmp_path / "out"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentroll",
                "generate",
                str(problems),
                "-o",
                str(out),
                "--policy",
                f"new={strong.url},tokenizer={TOKENIZER}",
                "--policy",
                f"old={weak.url},tokenizer={TOKENIZER},temperature=0.5",
                "--endpoints-per-task",
                "1",
                "--samples-per-prompt",
                "2",
                "--num-parallel",
                "1",
                "--reward",
                "exact",
                "--ray",
                ray_cluster.address,
                "--partitions",
                "2",
            ],
            env=ray_cluster.env,
            capture_output=True,
            timeout=240,
        )
    finally:
        strong.stop()
        weak.stop()
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, stderr[-3000:]
    groups = list(agentroll.read_groups(out))
    assert sorted(g.problem_id for g in groups) == [f"p{i:03d}" for i in range(8)]
    for group in groups:
        assert Counter(e[0].policy for e in group.executions) == {"new": 2, "old": 2}
        assert {e[0].model for e in group.executions if e[0].policy == "old"} == {"weak"}
    from agentroll.tools.report import stats as folder_stats

    stats = folder_stats(out)
    assert stats["all"]["head_to_head"]["pairs"][0]["problems"] == 8
    assert "new vs old over 8 problems" in stderr  # the driver's summary adds the partitions' counts
