"""Curation under `--ray`, at the plan (no cluster needed): `--target-groups N` is the job's N, shared out between
the partitions, and `--mix` runs with every partition reading the same sources at the same absolute paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentroll.engine.options import GenerateOptions
from agentroll.errors import InputError
from agentroll.run.partitions import check_options, plan_tasks
from agentroll.run.run_options import RunOptions

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def job(tmp_path: Path, **run: object) -> RunOptions:
    data = tmp_path / "in.jsonl"
    data.write_text('{"prompt": "1+1?", "label": "2"}\n')
    return RunOptions(**{"input": str(data), "output": str(tmp_path / "out"), "ray": "local", **run})


def planned(run: RunOptions, partitions: int) -> list[RunOptions]:
    given = {"base_url": URLS}
    options = GenerateOptions(**given)
    check_options(run, options)
    return [RunOptions(**t.run) for t in plan_tasks(run, given, options, partitions=partitions, at_once=2)]


@pytest.mark.parametrize(
    ("target", "partitions", "shares"),
    [(3, 2, [2, 1]), (6, 2, [3, 3]), (10, 4, [3, 3, 2, 2]), (1, 3, [1, 0, 0]), (0, 2, [0, 0])],
)
def test_target_groups_is_the_jobs_and_each_partition_gets_its_share(tmp_path, target, partitions, shares):
    tasks = planned(job(tmp_path, target_groups=target), partitions)
    assert [t.target_groups for t in tasks] == shares and sum(shares) == target
    assert [t.target_groups for t in planned(job(tmp_path), partitions)] == [None] * partitions


def test_a_mixed_job_runs_the_same_mix_in_every_partition_at_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("math.jsonl", "code.jsonl"):
        (tmp_path / name).write_text('{"prompt": "1+1?", "label": "2"}\n')
    run = job(tmp_path, input="-", mix=["math.jsonl=0.7", "coding:code.jsonl=0.3"])
    tasks = planned(run, 2)
    for task in tasks:
        assert task.input == "-"
        assert [(s.name, s.path, s.weight) for s in task.sources()] == [
            ("math.jsonl", str(tmp_path / "math.jsonl"), 0.7),
            ("coding", str(tmp_path / "code.jsonl"), 0.3),
        ]


def test_a_mixed_job_with_a_missing_source_is_refused_naming_it(tmp_path):
    (tmp_path / "math.jsonl").write_text('{"prompt": "1+1?", "label": "2"}\n')
    run = job(tmp_path, input="-", mix=[f"{tmp_path / 'math.jsonl'}=1", f"{tmp_path / 'gone.jsonl'}=1"])
    with pytest.raises(InputError, match=r"gone\.jsonl: no such file"):
        check_options(run, GenerateOptions(base_url=URLS))
