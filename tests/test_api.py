"""The embeddable API: `agentroll.Generator` in the caller's loop, whole groups, bounded streams, cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from rich.markup import escape

import agentroll
from agentroll.engine.options import GenerateOptions
from agentroll.folder import ShardWriter
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, write_problems

ROOT = Path(__file__).resolve().parent.parent
ROW = {"id": "q1", "prompt": "What is 40 plus 2?", "label": "42"}

PUBLIC = [
    "AgentrollError",
    "Context",
    "GenerateOptions",
    "Generator",
    "Group",
    "IncompleteRun",
    "InputError",
    "OutputError",
    "RewardError",
    "RunEnded",
    "Sample",
    "ServerError",
    "System",
    "TooManyFailures",
    "UsageError",
    "__version__",
    "distill",
    "gather_or_cancel",
    "read_groups",
    "read_records",
    "rescore",
    "shard_paths",
]


def test_all_is_exactly_the_public_surface():
    assert sorted(agentroll.__all__) == sorted(PUBLIC)
    for name in agentroll.__all__:
        value = getattr(agentroll, name)
        assert name == "__version__" or value.__module__.startswith("agentroll.")  # no re-export of a dependency
    public_classes = {n for n, v in vars(agentroll).items() if isinstance(v, type) and not n.startswith("_")}
    assert public_classes <= set(agentroll.__all__)


def test_importing_the_package_loads_its_names_on_first_use_and_its_submodules_stay_reachable():
    probe = (
        "import sys, agentroll; print('aiohttp' in sys.modules, 'agentroll.engine.generator' in sys.modules); "
        "print(agentroll.errors.InputError is agentroll.InputError, "
        "agentroll.folder.read_groups is agentroll.read_groups)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split("\n")[:2] == ["False False", "True True"]  # nothing heavy at import; reachable after
    with pytest.raises(AttributeError):
        agentroll.no_such_name  # noqa: B018


def test_the_generator_takes_the_cli_options_with_the_same_defaults():
    from typer.main import get_command

    from agentroll.cli import app

    params = {p.name: p for p in get_command(app).commands["generate"].params}  # type: ignore[attr-defined]
    for spec in dataclasses.fields(GenerateOptions):
        assert spec.name in params, spec.name
        option = params[spec.name]
        assert option.opts[0] == "--" + spec.name.replace("_", "-")
        default = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()  # type: ignore[misc]
        assert option.default == (None if isinstance(default, list | dict) else default), spec.name
        assert option.help == escape(spec.metadata["help"])  # as written (typer reads help as markup)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_paralel'"):
        agentroll.Generator(base_url="http://127.0.0.1:1", num_paralel=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward_concurrency": 0}, "--reward-concurrency must be a whole number of at least 1"),
        ({"probe_interval": 0}, "--probe-interval must be a number of seconds above 0"),
        ({"request_timeout": float("nan")}, "--request-timeout must be a number of seconds above 0"),
        ({"top_p": 1.5}, "--top-p must be in (0, 1]"),
        ({"max_retries": -1}, "--max-retries must be a whole number of at least 0"),
        ({"concurrency": 2.5}, "--concurrency must be a whole number"),
        ({"chat_template_kwargs": "[1]"}, "--chat-template-kwargs must be a JSON object"),
        ({"base_url": []}, "no server given"),
        ({"max_context_len": 3000.5}, "--max-context-len must be a whole number, got 3000.5"),
        ({"temperature": True}, "--temperature must be a number, got True"),
        ({"seed": 1.5}, "--seed must be a whole number"),
    ],
)
def test_every_numeric_option_is_validated(kwargs, message):
    with pytest.raises(agentroll.UsageError) as info:
        agentroll.Generator(**{"base_url": "http://127.0.0.1:1", **kwargs})
    assert message in str(info.value)


def test_the_api_reads_the_environment_as_the_cli_does(monkeypatch):
    monkeypatch.setenv("AGENTROLL_BASE_URL", "http://127.0.0.1:5,http://127.0.0.1:6")
    monkeypatch.setenv("OPENAI_API_KEY", "sesame")
    options = agentroll.Generator().options
    assert (options.base_url, options.api_key) == (["http://127.0.0.1:5", "http://127.0.0.1:6"], "sesame")
    assert agentroll.Generator(base_url="http://127.0.0.1:7", api_key="k").options.api_key == "k"


def generator(url: str, **kw) -> agentroll.Generator:
    return agentroll.Generator(
        base_url=url, tokenizer=TOKENIZER, num_parallel=2, samples_per_prompt=3, reward="exact", seed=1, **kw
    )


def test_run_group_gives_a_whole_group_whose_records_are_the_lines_written(sim, tmp_path):
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))

    async def go():
        async with generator(sim.url) as gen:
            handlers = dict(getattr(asyncio.get_running_loop(), "_signal_handlers", {}))
            group = await gen.run_group(ROW)
            return gen.settings, group, handlers

    settings, group, handlers = asyncio.run(go())
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before and handlers == {}
    assert group.ok and group.problem_id == "q1" and len(group.executions) == 3
    assert [e[0].sample_index for e in group.executions] == [0, 1, 2]
    records = group.records()
    assert len(records) == group.num_records == sum(len(e) for e in group.executions)
    assert {r["problem_id"] for r in records} == {"q1"} and {r["group_size"] for r in records} == {3}
    finals = [e[0].final_reward for e in group.executions]
    assert {r["group_reward_mean"] for r in records} == {sum(finals) / 3}

    writer = ShardWriter(tmp_path / "out", settings)
    writer.open()
    writer.commit(group)
    writer.close(complete=True)
    lines = (tmp_path / "out" / "rollouts-00000.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == records


def test_stream_keeps_at_most_max_ahead_groups_and_a_slow_consumer_slows_it(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 12)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.02))
    server.start()
    pulled = consumed = 0
    worst = 0

    def rows():
        nonlocal pulled
        for line in problems.read_bytes().splitlines():
            pulled += 1
            yield orjson.loads(line)

    async def go():
        nonlocal consumed, worst
        async with generator(server.url, concurrency=64) as gen:
            seen = []
            async for group in gen.stream(rows(), max_ahead=2):
                worst = max(worst, pulled - consumed)
                await asyncio.sleep(0.05)  # the consumer's own work (a training step)
                consumed += 1
                seen.append(group.problem_id)
            return seen

    try:
        seen = asyncio.run(go())
    finally:
        server.stop()
    assert sorted(seen) == [f"p{i:03d}" for i in range(12)]
    assert worst <= 2 + 1  # max_ahead groups, plus the next row read ahead
    assert server.peak_in_flight <= 2 * 3 * 2  # two groups of K=3 executions of N=2 calls, never more


def test_a_cancelled_group_closes_its_requests_so_vllm_aborts_them(problems):
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults())
    server.start()

    async def go():
        async with generator(server.url) as gen:
            server.faults.latency_s = 30  # after the start-up probes: only the group's calls hang
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(gen.run_group(ROW), 1)
            # still inside: the session is open, so only the cancellation can have closed the connections
            return await asyncio.to_thread(server.wait_until, lambda: server.aborted >= 6, 20)

    try:
        assert asyncio.run(go()), f"aborted {server.aborted} of 6 requests"
    finally:
        server.stop()


def test_a_group_whose_calls_fail_comes_back_failed_not_smaller(problems):
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=0.3, latency_s=0.01), seed=5)
    server.start()

    async def go():
        async with generator(server.url, max_retries=0) as gen:
            return [await gen.run_group({**ROW, "id": f"q{i}"}) for i in range(6)], gen.stats

    try:
        groups, stats = asyncio.run(go())
    finally:
        server.stop()
    failed = [g for g in groups if g.status == "failed"]
    assert failed and stats.groups_failed == len(failed)
    assert all(g.executions == [] and g.records() == [] and "HTTP 5" in (g.error or "") for g in failed)
    assert all(len(g.executions) == 3 for g in groups if g.ok)


def test_a_row_may_name_only_an_allowed_reward(sim, tmp_path):
    module = tmp_path / "evil.py"
    module.write_text(
        "import pathlib\npathlib.Path(__file__).with_name('ran').touch()\ndef score(r):\n    return 1.0\n"
    )

    async def go(**kw):
        async with generator(sim.url, **kw) as gen:
            return await gen.run_group({**ROW, "reward": f"{module}:score"})

    with pytest.raises(agentroll.InputError, match=r"field 'reward': reward '.*evil.py:score' is not allowed"):
        asyncio.run(go())
    assert not (tmp_path / "ran").exists()  # the dataset did not get to import code
    group = asyncio.run(go(allow_reward=[f"{module}:score"]))
    assert group.ok and (tmp_path / "ran").exists()
    assert {s.raw_reward for e in group.executions for s in e if s.stage != "selector"} == {1.0}


def test_the_api_doc_example_runs(sim):
    doc = ROOT.joinpath("docs", "api.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)  # type: ignore[union-attr]
    assert "http://127.0.0.1:8000" in code
    namespace: dict = {}
    exec(compile(code.replace("http://127.0.0.1:8000", sim.url), "docs/api.md", "exec"), namespace)
    groups = namespace["groups"]
    assert [g.problem_id for g in groups][:1] == ["q1"] and all(g.ok for g in groups)
