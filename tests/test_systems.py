"""Pluggable agent systems: the built-ins, a user's system, token-exact multi-turn, per-stage settings, resume."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import ClassVar

import pytest

from agentroll import Generator
from agentroll.context.turns import prefix_break, separator
from agentroll.errors import UsageError
from agentroll.process.resources import samples_dir
from agentroll.record.schema import OPTIONAL_FIELDS
from agentroll.render.chat import load_tokenizer
from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, generations, read_records, run_cli, write_problems
from .test_reliability import popen

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "fixtures" / "three_stage_seed7.json"
NEW_FIELDS = {
    "rollout_id",
    "latency_s",
    "schema_version",
    "trainable",
    "turn",
    "continues",
    "history_mask",
    "history_logprobs",
    "endpoint",
    "tool_calls",
    "problem",  # schema 6: the row's prompt as given
    "branched_from",  # the agent system's (null for the others)
    "rerendered",
    "agent_answer",
    "agent_reward",
    "agent_error",
    "policy",  # a head-to-head run's policy (null here)
    *OPTIONAL_FIELDS,  # null without a teacher
}


def args(problems: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        "exact",
        *extra,
    ]


@pytest.fixture
def served(problems):
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    yield server
    server.stop()


def by_execution(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["rollout_id"], []).append(r)
    return out


# -- three-stage: unchanged ---------------------------------------------------------------------------------------
def test_three_stage_with_a_seed_writes_what_it_wrote_before_systems_were_pluggable(tmp_path):
    """The golden hashes were made by the commit before this change (see the fixture's made_by)."""
    golden = json.loads(GOLDEN.read_text())
    server = SimServer(script=Script.from_jsonl(None, Behavior(reasoning_words=12)), record=False)
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate",
            str(samples_dir() / "math.jsonl"),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--seed",
            "7",
            "--samples-per-prompt",
            "2",
            "--num-parallel",
            "3",
            "--max-tokens",
            "200",
            "--system",
            "three-stage",
            "-q",
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        server.stop()
    got = {}
    for r in read_records(out):
        key = "/".join(map(str, (r["problem_id"], r["sample_index"], r["stage"], r["worker"])))
        body = {k: v for k, v in r.items() if k not in NEW_FIELDS}
        got[key] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
        assert r["trainable"] is True and r["turn"] == 0 and r["history_mask"] is None and r["policy"] is None
    assert got == golden["records"]


# -- single ---------------------------------------------------------------------------------------------------
def test_single_writes_k_independent_samples_per_prompt(served, problems, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(*args(problems, out, served.url, "--system", "single", "--samples-per-prompt", "4", "--seed", "3"))
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert len(records) == 8 * 4 and {r["stage"] for r in records} == {"solver"}
    assert Counter(r["problem_id"] for r in records) == {f"p{i:03d}": 4 for i in range(8)}
    assert {r["rollout_size"] for r in records} == {1} and len({r["rollout_id"] for r in records}) == 32
    assert all(r["final_reward"] == r["raw_reward"] == r["reward"] for r in records)
    assert len({r["sampling"]["seed"] for r in records}) == 32  # each sample its own seed
    assert any(r["raw_reward"] == 1 for r in records) and all(r["worker"] == 0 for r in records)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["system"] == {"name": "single", "stages": ["solver"], "options": {}}
    report = manifest["last_run"]["stats"]["report"]
    assert set(manifest["last_run"]["stats"]["stages"]) == {"solver"} and "rewriter_accuracy" not in report
    assert report["solver_accuracy"] == pytest.approx(sum(r["raw_reward"] for r in records) / 32)


# -- critique-revise: token-exact multi-turn ------------------------------------------------------------------
def test_critique_revise_continues_one_conversation_by_token_ids(served, problems, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        *args(
            problems,
            out,
            served.url,
            "--system",
            "critique-revise",
            "--samples-per-prompt",
            "2",
            "--max-tokens",
            "120",
            "--seed",
            "11",
        )
    )  # seeded: the same answers whatever the timing
    assert proc.returncode == 0, proc.stderr.decode()
    tokenizer = load_tokenizer(TOKENIZER)
    sent = {tuple(e["request"]["prompt"]) for e in generations(served)}
    executions = by_execution(read_records(out))
    assert len(executions) == 16
    for rows in executions.values():
        assert [r["stage"] for r in rows] == ["solver", "critic", "reviser"]
        assert [r["turn"] for r in rows] == [0, 1, 2] and [r["continues"] for r in rows] == [None, 0, 1]
        for before, now in itertools.pairwise(rows):
            head = before["prompt_token_ids"] + before["response_token_ids"]
            assert now["prompt_token_ids"][: len(head)] == head  # never a re-rendering
            injected = now["prompt_token_ids"][len(head) :]
            text = tokenizer.decode(injected)
            assert text.endswith("<|im_end|>\n<|im_start|>assistant\n") and "<|im_start|>user\n" in text
            # the stop token the model sampled is counted once, in its response
            assert text.startswith("\n") == (before["finish_reason"] == "stop")
            mask = (before["history_mask"] or [0] * len(before["prompt_token_ids"])) + before["loss_mask"]
            assert now["history_mask"] == mask + [0] * len(injected)
            logprobs = before["history_logprobs"] or [0.0] * len(before["prompt_token_ids"])
            assert now["history_logprobs"] == logprobs + before["response_logprobs"] + [0.0] * len(injected)
            assert tuple(now["prompt_token_ids"]) in sent  # what the server got is what is recorded
        assert sum(rows[2]["history_mask"]) == len(rows[0]["response_token_ids"]) + len(rows[1]["response_token_ids"])
        _, critic, reviser = rows
        assert critic["raw_reward"] == reviser["raw_reward"] and all(
            r["final_reward"] == reviser["raw_reward"] for r in rows
        )
    assert any(rows[2]["raw_reward"] == 1 for rows in executions.values())


def test_a_turn_cut_by_max_tokens_gets_the_templates_whole_end_of_turn(problems, tmp_path):
    server = SimServer(script=Script.from_jsonl(problems, Behavior(reasoning_words=400)))
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            *args(problems, out, server.url, "--system", "critique-revise", "--max-tokens", "30", "--limit", "2")
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        server.stop()
    tokenizer = load_tokenizer(TOKENIZER)
    for rows in by_execution(read_records(out)).values():
        solver, critic = rows[0], rows[1]
        assert solver["finish_reason"] == "length"
        injected = critic["prompt_token_ids"][len(solver["prompt_token_ids"]) + len(solver["response_token_ids"]) :]
        assert tokenizer.decode(injected).startswith("<|im_end|>\n<|im_start|>user\n")


QWEN3_LIKE = (  # the part of Qwen3's template that matters here: earlier turns lose their think blocks
    "{%- set ns = namespace(last_query_index=messages|length - 1) %}"
    "{%- for m in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.last_query_index == messages|length - 1 and m.role == 'user' %}"
    "{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- if loop.index0 > ns.last_query_index and '</think>' in message.content %}"
    "{{- '<|im_start|>assistant\\n<think>' + message.content.split('</think>')[0].split('<think>')[-1]"
    " + '</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_the_separator_and_the_prefix_check_on_a_template_that_drops_earlier_think_blocks():
    tokenizer = load_tokenizer(TOKENIZER)
    assert prefix_break(tokenizer) is None  # the bundled template re-renders nothing
    tokenizer.chat_template = QWEN3_LIKE
    broken = prefix_break(tokenizer)
    assert broken is not None and "changes the rendering of the turns before it" in broken
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = asyncio.run(separator(tokenizer, [{"role": "user", "content": "Again."}], {}, end))
    assert tokenizer.decode(ids) == "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    cut = asyncio.run(separator(tokenizer, [{"role": "user", "content": "Again."}], {}, None))
    assert tokenizer.decode(cut) == "<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"


def test_doctor_reports_the_templates_prefix_property(served):
    proc = run_cli("doctor", "--base-url", served.url, "--tokenizer", TOKENIZER)
    assert proc.returncode == 0, proc.stderr.decode() + proc.stdout.decode()
    assert re.search(r"ok +multi-turn: the template.s prefix property holds", proc.stdout.decode())


# -- a user's system: the docs' example, run as written ---------------------------------------------------------
def docs_example(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "systems.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    assert len(code.group(1).strip().splitlines()) <= 35  # "a complete custom system in about 30 lines"
    path = tmp_path / "self_check.py"
    path.write_text(code.group(1))
    return path


def test_the_custom_system_in_the_docs_runs_end_to_end(served, problems, tmp_path):
    system = docs_example(tmp_path)
    out = tmp_path / "out"
    proc = run_cli(
        *args(
            problems,
            out,
            served.url,
            "--system",
            f"{system}:SelfCheck",
            "--system-option",
            "drafts=3",
            "--samples-per-prompt",
            "2",
            "--seed",
            "1",
            "--max-tokens",
            "300",
        )
    )
    assert proc.returncode == 0, proc.stderr.decode()
    executions = by_execution(read_records(out))
    assert len(executions) == 16
    for rows in executions.values():
        assert [r["stage"] for r in rows] == ["solver"] * 3 + ["checker"] * 3
        for check in rows[3:]:
            draft = rows[check["continues"]]
            assert draft["worker"] == check["worker"] and check["turn"] == 1
            assert (
                check["prompt_token_ids"][: len(draft["prompt_token_ids"]) + len(draft["response_token_ids"])]
                == draft["prompt_token_ids"] + draft["response_token_ids"]
            )
        assert rows[0]["final_reward"] == max(r["raw_reward"] for r in rows[3:])
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["system"] == {
        "name": f"{system}:SelfCheck",
        "stages": ["solver", "checker"],
        "options": {"drafts": 3},
    }
    # another option is another dataset: the folder refuses it rather than mixing the two
    again = run_cli(
        *args(
            problems,
            out,
            served.url,
            "--system",
            f"{system}:SelfCheck",
            "--system-option",
            "drafts=2",
            "--samples-per-prompt",
            "2",
            "--seed",
            "1",
            "--max-tokens",
            "300",
        )
    )
    assert again.returncode == 6 and b"system.options.drafts" in again.stderr


def test_a_system_may_be_an_async_function(served, problems, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "async def twice(ctx):\n"
        "    prompt = await ctx.problem_prompt('solver')\n"
        "    first = await ctx.complete('solver', prompt, worker=0)\n"
        "    second = await ctx.complete('solver', prompt, worker=1, temperature=0.0)\n"
        "    await ctx.reward([first, second])\n"
        "    return [first, second]\n"
        "twice.stages = ('solver',)\n"
        "twice.templates = ('solver',)\n"
    )
    out = tmp_path / "out"
    proc = run_cli(*args(problems, out, served.url, "--system", f"{path}:twice", "--limit", "3"))
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(out)
    assert len(records) == 6 and [r["sampling"]["temperature"] for r in records[:2]] == [1.0, 0.0]
    assert all(r["final_reward"] == by_execution(records)[r["rollout_id"]][-1]["raw_reward"] for r in records)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    raise ValueError('boom')\n", b"system"),
        (
            "    a = await ctx.complete('solver', await ctx.problem_prompt('solver'), worker=0)\n"
            "    b = await ctx.complete('solver', await ctx.problem_prompt('solver'), worker=0)\n"
            "    return [a, b]\n",
            b"two solver calls with worker 0",
        ),
        ("    return []\n", b"no samples"),
    ],
)
def test_a_broken_system_stops_the_run_with_one_line_and_a_consistent_folder(served, problems, tmp_path, body, message):
    path = tmp_path / "broken.py"
    path.write_text("async def broken(ctx):\n" + body + "broken.templates = ('solver',)\n")
    out = tmp_path / "out"
    proc = run_cli(*args(problems, out, served.url, "--system", f"{path}:broken"))
    assert proc.returncode == 2 and message in proc.stderr and b"Traceback" not in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False and manifest["records"] == len(read_records(out))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--system", "nope"], b"not a built-in"),
        (["--system", "single", "--stage", "selector.temperature=0"], b"system single has the stages solver"),
        (["--system", "single", "--system-option", "rounds=2"], b"has no option rounds"),
        (["--stage", "selector.temp=0"], b"expected STAGE.KEY=VALUE"),
    ],
)
def test_bad_system_flags_are_one_line_usage_errors(served, problems, tmp_path, flags, message):
    proc = run_cli(*args(problems, tmp_path / "out", served.url, *flags))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr.decode()
    assert len(proc.stderr.decode().strip().splitlines()) == 1
    assert not served.log  # refused before any server call


# -- per-stage settings -------------------------------------------------------------------------------------------
def test_a_stage_may_sample_otherwise_and_run_on_another_model_and_server(problems, tmp_path):
    policy = SimServer(script=Script.from_jsonl(problems))
    judge = SimServer(script=Script.from_jsonl(problems), model="judge")
    policy.start()
    judge.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            *args(
                problems,
                out,
                policy.url,
                "--num-parallel",
                "2",
                "--stage",
                "rewriter.temperature=0.5",
                "--stage",
                "selector.model=judge",
                "--stage",
                f"selector.base_url={judge.url}",
                "--stage",
                "selector.temperature=0",
                "--stage",
                "selector.max_tokens=64",
            )
        )
        assert proc.returncode == 0, proc.stderr.decode()
        records = read_records(out)
        selectors = [r for r in records if r["stage"] == "selector"]
        others = [r for r in records if r["stage"] != "selector"]
        assert selectors and others
        assert all(
            r["model"] == "judge"
            and r["endpoint"] == judge.url
            and r["trainable"] is False
            and r["sampling"]["temperature"] == 0.0
            and r["sampling"]["max_tokens"] <= 64
            for r in selectors
        )
        assert all(
            r["model"] == policy.model and r["trainable"] is True and r["endpoint"] == policy.url for r in others
        )
        assert {r["sampling"]["temperature"] for r in others if r["stage"] == "rewriter"} == {0.5}
        assert {r["sampling"]["temperature"] for r in others if r["stage"] == "solver"} == {1.0}
        asked = [e["request"] for e in generations(judge)]
        assert len(asked) == len(selectors) and all(a["model"] == "judge" and a["temperature"] == 0 for a in asked)
        manifest = json.loads((out / "manifest.json").read_text())
        assert set(manifest["last_run"]["requests"]["concurrency"]) == {policy.url, judge.url}  # auto: each its own
        settings = manifest["settings"]
        assert settings["stage_settings"]["selector"] == {"model": "judge", "temperature": 0.0, "max_tokens": 64}
    finally:
        policy.stop()
        judge.stop()


# -- exactly-once resume, for every built-in ------------------------------------------------------------------
@pytest.mark.parametrize("system", ["three-stage", "single", "critique-revise"])
def test_killed_mid_run_then_rerun_gives_every_execution_exactly_once(tmp_path, system):
    problems = write_problems(tmp_path / "p.jsonl", 60)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.02))
    server.start()
    try:
        out = tmp_path / "out"
        run = args(
            problems,
            out,
            server.url,
            "--system",
            system,
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "2",
            "--concurrency",
            "4",
            "--shard-size",
            "10",
        )
        proc = popen(*run)
        assert server.wait_for_completions(40, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        first = len(read_records(out)) if (out / "manifest.json").exists() else 0
        rerun = run_cli(*run)
        assert rerun.returncode == 0, rerun.stderr.decode()
        records = read_records(out)
        executions = by_execution(records)
        assert all(len(rows) == rows[0]["rollout_size"] for rows in executions.values())
        per = Counter((rows[0]["problem_id"], rows[0]["sample_index"]) for rows in executions.values())
        assert len(per) == 60 * 2 and set(per.values()) == {1}
        assert len(records) > first
        if system == "critique-revise":
            assert all(len(rows) == 1 or rows[1]["continues"] == 0 for rows in executions.values())
    finally:
        server.stop()


# -- the library ------------------------------------------------------------------------------------------------
def test_the_generator_runs_a_system_class_given_by_module(served, problems, tmp_path, monkeypatch):
    (tmp_path / "my_systems.py").write_text(docs_example(tmp_path).read_text())
    monkeypatch.syspath_prepend(str(tmp_path))

    async def go():
        async with Generator(
            base_url=served.url,
            tokenizer=TOKENIZER,
            reward="exact",
            samples_per_prompt=2,
            system="my_systems:SelfCheck",
            system_option=["drafts=1"],
        ) as gen:
            row = json.loads(problems.read_text().splitlines()[0])
            return await gen.run_group(row), gen.settings

    group, settings = asyncio.run(go())
    assert group.ok and [[s.stage for s in e] for e in group.executions] == [["solver", "checker"]] * 2
    assert settings["system"]["name"] == "my_systems:SelfCheck"


def test_a_continuation_of_another_executions_sample_is_refused(served, problems, tmp_path):
    path = tmp_path / "thief.py"
    path.write_text(
        "STOLEN = []\n"
        "async def thief(ctx):\n"
        "    first = await ctx.complete('solver', await ctx.problem_prompt('solver'), worker=0)\n"
        "    if STOLEN:\n"
        "        await ctx.complete('solver', [{'role': 'user', 'content': 'x'}], worker=1, after=STOLEN[0])\n"
        "    STOLEN.append(first)\n"
        "    return [first]\n"
        "thief.templates = ('solver',)\n"
    )

    async def go():
        async with Generator(
            base_url=served.url, tokenizer=TOKENIZER, reward="exact", system=f"{path}:thief", samples_per_prompt=2
        ) as gen:
            row = json.loads(problems.read_text().splitlines()[0])
            await gen.run_group(row)

    with pytest.raises(UsageError, match="continues a sample of this execution only"):
        asyncio.run(go())


def test_a_frozen_turn_is_injected_in_the_trajectory_and_the_folder_validates_and_converts(served, problems, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        *args(
            problems,
            out,
            served.url,
            "--system",
            "critique-revise",
            "--max-tokens",
            "120",
            "--stage",
            "critic.trainable=false",
        )
    )
    assert proc.returncode == 0, proc.stderr.decode()
    for rows in by_execution(read_records(out)).values():
        solver, critic, reviser = rows
        assert (solver["trainable"], critic["trainable"], reviser["trainable"]) == (True, False, True)
        start = len(critic["prompt_token_ids"])
        assert reviser["history_mask"][start : start + len(critic["response_token_ids"])] == [0] * len(
            critic["response_token_ids"]
        )  # another model's tokens are not the policy's
        assert sum(reviser["history_mask"]) == len(solver["response_token_ids"])
    checked = run_cli("validate", str(out))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    slime = run_cli("convert", str(out), "--to", "slime", "-o", str(tmp_path / "slime"))
    assert slime.returncode == 0 and b"skipped frozen" in slime.stderr and b"folded turns" in slime.stderr
    trl = [
        run_cli("convert", str(out), "--to", "trl", "-o", str(tmp_path / f"trl{i}"), *flag)
        for i, flag in enumerate([[], ["--include-frozen"]])
    ]
    rows = [int(re.search(rb"-> (\d+) trl rows", p.stderr).group(1)) for p in trl]  # type: ignore[union-attr]
    assert rows == [16, 24]


def test_the_generator_takes_a_system_object_and_a_builtin_instance_keeps_its_name(served, problems):
    from agentroll.systems.single import Single

    async def one(ctx):
        sample = await ctx.complete("solver", await ctx.problem_prompt("solver"), worker=0)
        await ctx.reward([sample])
        return [sample]

    one.templates = ("solver",)  # type: ignore[attr-defined]
    row = json.loads(problems.read_text().splitlines()[0])

    async def go(system):
        async with Generator(base_url=served.url, tokenizer=TOKENIZER, reward="exact", system=system) as gen:
            return await gen.run_group(row), gen.settings["system"]

    group, identity = asyncio.run(go(one))
    assert group.ok and identity["name"].endswith(
        ":test_the_generator_takes_a_system_object_and_a_builtin_instance_keeps_its_name.<locals>.one"
    )
    group, identity = asyncio.run(go(Single()))
    assert group.ok and identity == {"name": "single", "stages": ["solver"], "options": {}}


# -- what a careful review found --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "    async with asyncio.TaskGroup() as tg:\n"
        "        calls = [tg.create_task(ctx.complete('solver', prompt, worker=i)) for i in range(3)]\n"
        "    samples = [c.result() for c in calls]\n",
        "    samples = []\n"
        "    for i in range(3):\n"
        "        try:\n"
        "            samples.append(await ctx.complete('solver', prompt, worker=i))\n"
        "        except Exception:\n"
        "            pass  # the docs say not to: the engine still fails the group\n",
    ],
)
def test_a_failed_call_fails_its_group_however_the_system_runs_its_calls(problems, tmp_path, body):
    path = tmp_path / "calls.py"
    path.write_text(
        "import asyncio\n\nasync def calls(ctx):\n    prompt = await ctx.problem_prompt('solver')\n"
        + body
        + "    await ctx.reward(samples)\n    return samples\ncalls.templates = ('solver',)\n"
    )
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=0.3))
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(*args(problems, out, server.url, "--system", f"{path}:calls", "--max-retries", "0"))
    finally:
        server.stop()
    assert proc.returncode == 8, proc.stderr.decode()  # groups missing, a rerun redoes them; never exit 2
    for rows in by_execution(read_records(out)).values():
        assert len(rows) == 3  # no group with a call missing


def test_critique_revise_with_no_room_to_revise_validates(served, problems, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        *args(
            problems,
            out,
            served.url,
            "--system",
            "critique-revise",
            "--max-context-len",
            "260",
            "--samples-per-prompt",
            "2",
        )
    )
    assert proc.returncode == 0, proc.stderr.decode()
    executions = list(by_execution(read_records(out)).values())
    short = [rows for rows in executions if len(rows) < 3]
    assert short and all(rows[0]["final_reward"] == rows[0]["raw_reward"] for rows in short)
    checked = run_cli("validate", str(out))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def test_a_stage_on_a_replica_of_the_policy_is_trainable_and_continues_its_conversation(problems, tmp_path):
    one, two = (SimServer(script=Script.from_jsonl(problems)) for _ in range(2))
    one.start()
    two.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            *args(
                problems,
                out,
                one.url,
                "--system",
                "critique-revise",
                "--max-tokens",
                "120",
                "--stage",
                f"critic.base_url={two.url}",
                "--limit",
                "3",
            )
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        one.stop()
        two.stop()
    for rows in by_execution(read_records(out)).values():
        assert [(r["stage"], r["endpoint"], r["trainable"]) for r in rows] == [
            ("solver", one.url, True),
            ("critic", two.url, True),
            ("reviser", one.url, True),
        ]
        assert sum(rows[2]["history_mask"]) == len(rows[0]["response_token_ids"]) + len(rows[1]["response_token_ids"])
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["stage_settings"] == {"critic": {"model": one.model}}  # where it ran is not what it is


def test_a_stage_served_elsewhere_counts_in_the_runs_failures(problems, tmp_path):
    policy = SimServer(script=Script.from_jsonl(problems))
    judge = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=1.0))
    policy.start()
    judge.start()
    try:
        proc = run_cli(
            *args(
                problems,
                tmp_path / "out",
                policy.url,
                "--num-parallel",
                "2",
                "--max-retries",
                "0",
                "--stage",
                f"selector.base_url={judge.url}",
                "--max-failures",
                "1",
            )
        )
    finally:
        policy.stop()
        judge.stop()
    assert proc.returncode == 7, proc.stderr.decode()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "    return [await ctx.complete('solver', prompt, worker=0, temperature=-1)]\n",
            b"ctx.complete(): --temperature",
        ),
        ("    return [await ctx.complete('judge', prompt, worker=0)]\n", b"does not declare"),
    ],
)
def test_a_bad_call_is_a_usage_error_not_a_failed_group(served, problems, tmp_path, line, message):
    path = tmp_path / "bad.py"
    path.write_text(
        "from agentroll import System\n\nclass Bad(System):\n    stages = ('solver',)\n"
        "    templates = ('solver',)\n\n    async def run(self, ctx):\n"
        "        prompt = await ctx.problem_prompt('solver')\n    " + line
    )
    proc = run_cli(*args(problems, tmp_path / "out", served.url, "--system", f"{path}:Bad"))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr.decode()


LLAMA2_LIKE = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' + m.content + ' [/INST]' }}"
    "{% else %}{{ ' ' + m.content | trim + ' ' + '<|im_end|>' }}{% endif %}{% endfor %}"
)


def test_a_space_the_template_puts_before_its_end_of_turn_does_not_double_the_stop_token():
    tokenizer = load_tokenizer(TOKENIZER)
    tokenizer.chat_template = LLAMA2_LIKE
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = asyncio.run(separator(tokenizer, [{"role": "user", "content": "Again."}], {}, end))
    assert tokenizer.decode(ids) == "[INST] Again. [/INST]"


def test_with_server_rendering_the_separator_is_the_servers_own_ids():
    tokenizer = load_tokenizer(TOKENIZER)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    asked = []

    async def server(messages):  # stands for POST /tokenize: the same template, so the same ids
        asked.append(messages)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)

    turn = [{"role": "user", "content": "Again."}]
    for last in (end, None):
        local = asyncio.run(separator(tokenizer, turn, {}, last))
        assert asyncio.run(separator(tokenizer, turn, {}, last, server)) == local
    assert len(asked) == 2


def test_system_options_are_kept_as_the_manifest_keeps_them(served, problems):
    from agentroll import System

    class Sized(System):
        stages = ("solver",)
        templates = ("solver",)
        options: ClassVar[dict] = {"sizes": (1, 2)}

        async def run(self, ctx):
            sample = await ctx.complete("solver", await ctx.problem_prompt("solver"), worker=0)
            await ctx.reward([sample])
            return [sample]

    async def go():
        async with Generator(base_url=served.url, tokenizer=TOKENIZER, reward="exact", system=Sized) as gen:
            return gen.settings

    assert asyncio.run(go())["system"]["options"] == {"sizes": [1, 2]}  # a tuple would refuse every resume


def test_each_built_in_is_imported_by_its_name_only():
    """`systems.BUILTINS` names each built-in without importing it: the table must say what the classes say, and a
    run of one system must not load the others (a three-stage run has no use for the tool parsers)."""
    from agentroll.systems import BUILTINS, System, builtin, identity

    for name in BUILTINS:
        found = builtin(name)
        assert found is not None and issubclass(found, System) and found.name == name
    assert builtin("no-such-system") is None
    renamed = builtin("single")()
    renamed.name = "my-single"  # type: ignore[misc]
    assert identity(renamed, "x")["name"] == "my-single"  # a built-in keeps the name it carries

    class Mine(builtin("single")):  # type: ignore[misc]
        pass

    assert identity(Mine(), "mine.py:Mine")["name"] == "mine.py:Mine"  # a user's subclass is its spec
    probe = (
        "import sys; from agentroll.systems import load_system; load_system('three-stage'); "
        "print(sorted(m for m in sys.modules if m.startswith(('agentroll.systems.', 'agentroll.toolcalls'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert "agentroll.systems.three_stage" in loaded.stdout
    assert "tool_use" not in loaded.stdout and "toolcalls" not in loaded.stdout and "single" not in loaded.stdout
