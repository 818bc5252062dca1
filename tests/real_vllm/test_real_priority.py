"""vLLM's request priority, for real: a server started with --scheduling-policy priority takes each call's group
number (older groups first), on both token APIs; the run is whole and token-exact as ever."""

from __future__ import annotations

import pytest

from ..conftest import read_records
from .conftest import SUMMARY
from .helpers import COMPLETIONS, GENERATE, RecordingProxy, generate, manifest, problems


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_a_priority_server_gets_each_groups_number_as_its_priority(priority_vllm, tmp_path, api):
    path = problems(tmp_path / "p.jsonl", 6)
    with RecordingProxy(priority_vllm) as proxy:
        proc = generate(proxy.url, path, tmp_path / "out", "--api", api, "--server-priority", "on")
        log = list(proxy.log)
    assert proc.returncode == 0, proc.stderr.decode()
    assert manifest(tmp_path / "out")["servers"][-1]["priority"] is True
    calls = [
        e
        for e in log
        if e["path"] == (GENERATE if api == "generate" else COMPLETIONS)
        and (e["request"].get("sampling_params") or e["request"]).get("max_tokens") != 1
    ]
    assert calls and all(isinstance(e["request"].get("priority"), int) for e in calls)
    by_problem: dict[str, set[int]] = {}
    records = read_records(tmp_path / "out")
    for record in records:  # each problem's calls carry one number, its group's admission order
        prompts = [
            e["request"].get("priority")
            for e in calls
            if (e["request"].get("prompt") or e["request"].get("token_ids")) == record["prompt_token_ids"]
        ]
        by_problem.setdefault(record["problem_id"], set()).update(prompts)
    assert all(len(numbers) == 1 for numbers in by_problem.values()), by_problem
    assert len({n for numbers in by_problem.values() for n in numbers}) == 6
    SUMMARY.append(
        f"priority ({api}): {len(calls)} calls sent with their group's priority to a "
        "--scheduling-policy priority server"
    )
