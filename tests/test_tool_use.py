"""`--system tool-use` and `--reward code` end to end: the real CLI (in-process) and the Generator against the
simulator, which calls tools in Hermes format and writes programs. Every record is checked token for token."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentroll import Generator
from agentroll.cli import app
from agentroll.render.chat import ChatEncoder, load_tokenizer
from agentroll.sim.programs import CRASH, HOG, LOOP
from agentroll.sim.script import Behavior, Script
from agentroll.sim.server import SimServer
from agentroll.toolcalls import PYTHON
from agentroll.tools.validate import validate as validate_folder

from .conftest import TOKENIZER, generations, read_records, write_problems

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

QUIET = Behavior(
    truncate=0,
    no_think_close=0,
    empty_after_think=0,
    tool_malformed=0,
    tool_unknown=0,
    tool_code_crash=0,
    tool_code_loop=0,
    tool_parallel=0,
    tool_again=0,
)


def behavior(**changes) -> Behavior:
    """A simulated model that does exactly the one thing a test is about (every other surprise off)."""
    values = {name: getattr(QUIET, name) for name in QUIET.__slots__}
    return Behavior(**{**values, **changes})


@pytest.fixture
def serve(tmp_path: Path) -> Iterator:
    servers: list[SimServer] = []

    def start(problems: Path, how: Behavior) -> SimServer:
        server = SimServer(script=Script.from_jsonl(problems, how))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def generate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["generate", *args])
    return result.exit_code, result.output


def tool_use(problems: Path, out: Path, url: str, *extra: str) -> tuple[int, str]:
    return generate(
        str(problems),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--system",
        "tool-use",
        "--seed",
        "5",
        "-q",
        *extra,
    )


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def executions(records: list[dict]) -> list[list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["rollout_id"], []).append(r)
    return list(out.values())


def check_token_exact(records: list[dict], server: SimServer) -> int:
    """Each turn is the call the server answered, and each later turn's prompt is the turn before's prompt and
    response ids, then exactly the template's rendering of the tool results (mask 0 there). Returns how many
    continued turns were checked."""
    tokenizer = load_tokenizer(TOKENIZER)
    sent = {
        (tuple(e["request"]["prompt"]), e["request"]["seed"]): e["response"]["choices"][0]["token_ids"]
        for e in generations(server)
    }
    continued = 0
    for turns in executions(records):
        assert [r["turn"] for r in turns] == list(range(len(turns)))
        for r in turns:
            answered = sent[tuple(r["prompt_token_ids"]), r["sampling"]["seed"]]
            assert answered == r["response_token_ids"]  # what the server sent back
        for before, now in pairwise(turns):
            head = before["prompt_token_ids"] + before["response_token_ids"]
            assert now["prompt_token_ids"][: len(head)] == head and now["continues"] == before["turn"]
            injected = now["prompt_token_ids"][len(head) :]
            closed = before["finish_reason"] == "stop"  # the model's own <|im_end|> stays in its response
            results = "".join(f"<|im_start|>tool\n{c['result']}<|im_end|>\n" for c in before["tool_calls"])
            expected = ("" if closed else "<|im_end|>") + "\n" + results + "<|im_start|>assistant\n"
            assert injected == tokenizer.encode(expected, add_special_tokens=False)
            history = (before["history_mask"] or [0] * len(before["prompt_token_ids"])) + before["loss_mask"]
            assert now["history_mask"] == history + [0] * len(injected)
            continued += 1
    return continued


# -- a run -------------------------------------------------------------------------------------------------------
def test_a_tool_use_run_is_token_exact_over_its_turns_and_the_model_reads_the_results(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 4)
    server = serve(problems, behavior(tool_call=0.8, tool_parallel=0.3, tool_again=0.3, correct=0.7))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--samples-per-prompt", "4", "--reward", "math")
    assert code == 0, output
    records = read_records(out)
    assert check_token_exact(records, server) >= 8
    first = records[0]["prompt"]
    assert "<tools>\n" + json.dumps(PYTHON.schema) + "\n</tools>" in first  # offered through the template
    said = 0
    for turns in executions(records):
        final = turns[-1]
        assert final["tool_calls"] is None and all(t["tool_calls"] for t in turns[:-1])
        assert {t["raw_reward"] for t in turns} == {final["final_reward"]}
        calls = turns[-2]["tool_calls"] if len(turns) > 1 else []
        if calls and calls[-1]["status"] == "ok":  # the answer is what the python tool printed
            said += f"\\boxed{{{calls[-1]['result']}}}" in final["response"]
            assert calls[-1]["arguments"]["code"] == f"print({json.dumps(calls[-1]['result'])})"
    assert said >= 4
    stats = manifest(out)["last_run"]["stats"]
    assert stats["tool_calls"] == sum(len(r["tool_calls"] or []) for r in records) > 0
    assert manifest(out)["settings"]["system"]["name"] == "tool-use"
    assert validate_folder(out).ok
    # a conversation is one answer however many turns it took: pass@k up to the 4 conversations per problem,
    # the solver's accuracy the share of conversations answered right (each turn carries the final reward)
    shown = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    figures = json.loads(shown.stdout)["all"]
    assert len(records) > 16 and [p["k"] for p in figures["pass_at_k"]] == [1, 2, 3, 4]
    finals = [turns[-1]["raw_reward"] == 1.0 for turns in executions(records)]
    assert figures["report"]["solver_accuracy"] == sum(finals) / len(finals) == figures["report"]["system_accuracy"]


def test_the_generator_runs_tool_use_as_a_library(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 1)
    server = serve(problems, behavior(tool_call=1.0, correct=1.0))

    async def go():
        async with Generator(
            base_url=server.url,
            tokenizer=TOKENIZER,
            system="tool-use",
            samples_per_prompt=2,
            system_option=["max_turns=3"],
        ) as gen:
            return await gen.run_group({"prompt": "What is 10 plus 7?", "label": "17"})

    group = asyncio.run(go())
    assert group.ok
    for samples in group.executions:
        assert [s.turn for s in samples] == [0, 1]
        assert samples[0].tool_calls is not None and samples[0].tool_calls[0]["result"] == "17"
        assert samples[1].raw_reward == 1.0 and samples[1].continues == 0


def test_the_tool_use_docs_example_runs_as_written(serve, tmp_path, monkeypatch):
    text = (Path(__file__).resolve().parent.parent / "docs" / "tool-use.md").read_text()
    example = re.search(r"```python\n(# my_tools.py\n.*?)```", text, re.S)
    assert example is not None
    (tmp_path / "my_tools.py").write_text(example.group(1))
    monkeypatch.chdir(tmp_path)  # the command as the docs give it
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(problems, behavior(tool_call=1.0))
    for tools, called in (("python,my_tools.py:lookup", "python"), ("my_tools.py:lookup", "lookup")):
        out = tmp_path / called
        code, output = tool_use(
            problems,
            out,
            server.url,
            "--system-option",
            f"tools={tools}",
            "--system-option",
            "max_turns=6",
            "--samples-per-prompt",
            "2",
            "--reward",
            "math",
        )
        assert code == 0, output
        records = read_records(out)
        assert '"description": "Look a fact up in the course notes."' in records[0]["prompt"]
        assert {c["name"] for r in records for c in r["tool_calls"] or []} == {called}
        assert all(c["status"] == "ok" for r in records for c in r["tool_calls"] or [])
        check_token_exact(records, server)


# -- each failure path: shown to the model, counted, and the run goes on -------------------------------------------
@pytest.mark.parametrize(
    ("how", "status", "shown", "counter"),
    [
        (
            behavior(tool_call=1.0, tool_malformed=1.0),
            "malformed",
            "error: the call is not valid JSON",
            "tool_calls_malformed",
        ),
        (
            behavior(tool_call=1.0, tool_unknown=1.0),
            "unknown",
            "error: unknown tool 'web_search_v2' (the tools: python)",
            "tool_calls_unknown",
        ),
        (behavior(tool_call=1.0, tool_code_crash=1.0), "failed", "[stderr]\nTraceback", "tool_calls_failed"),
        (behavior(tool_call=1.0, tool_code_loop=1.0), "timeout", "error: timed out after 1s", "tool_calls_timed_out"),
    ],
)
def test_a_bad_call_gets_its_error_as_the_tools_output_and_is_counted(serve, tmp_path, how, status, shown, counter):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(problems, how)
    out = tmp_path / "out"
    timeout = "1" if status == "timeout" else "20"  # short only where the program is meant to overrun
    code, output = tool_use(
        problems, out, server.url, "--samples-per-prompt", "2", "--system-option", f"tool_timeout={timeout}"
    )
    assert code == 0, output
    records = read_records(out)
    check_token_exact(records, server)
    firsts = [turns[0] for turns in executions(records)]
    assert all(len(turns) == 2 for turns in executions(records))  # the model answered after the error
    for first in firsts:
        (made,) = first["tool_calls"]
        assert made["status"] == status and shown in made["result"] and made["error"]
    assert manifest(out)["last_run"]["stats"][counter] == len(firsts) == 4
    assert manifest(out)["last_run"]["stats"]["tool_calls"] == 4


def test_a_users_tools_are_offered_called_and_their_failures_shown(serve, tmp_path):
    (tmp_path / "my_tools.py").write_text(
        'def lookup(query: str) -> dict:\n    """Look a fact up.\n\n    Args:\n        query: what to look up\n'
        "    \"\"\"\n    if 'plus 7' in query:\n        raise ValueError('the index is down')\n"
        "    return {'query': query, 'hits': 3}\n"
    )
    problems = write_problems(tmp_path / "p.jsonl", 2)  # "What is 10 plus 7?" makes the tool raise
    server = serve(problems, behavior(tool_call=1.0))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--system-option", f"tools={tmp_path / 'my_tools.py'}:lookup")
    assert code == 0, output
    records = read_records(out)
    check_token_exact(records, server)
    assert '"name": "lookup", "description": "Look a fact up."' in records[0]["prompt"]
    calls = {r["problem_id"]: r["tool_calls"][0] for r in records if r["tool_calls"]}
    assert calls["p000"]["status"] == "failed" and calls["p000"]["result"] == "error: ValueError: the index is down"
    assert calls["p001"]["status"] == "ok" and json.loads(calls["p001"]["result"])["hits"] == 3
    assert manifest(out)["last_run"]["stats"]["tool_calls_failed"] == 1


def test_max_turns_ends_a_conversation_whose_model_keeps_calling(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(problems, behavior(tool_call=1.0, tool_again=1.0))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--system-option", "max_turns=3")
    assert code == 0, output
    records = read_records(out)
    check_token_exact(records, server)
    for turns in executions(records):
        assert len(turns) == 3
        assert [c["status"] for c in turns[-1]["tool_calls"]] == ["not_run"]
        assert turns[-1]["tool_calls"][0]["result"] is None
        assert turns[-1]["reward_info"].startswith("max_turns (3) reached with tool calls unanswered")
    assert manifest(out)["last_run"]["stats"]["tool_calls_not_run"] == 2


def test_a_sandbox_that_is_down_fails_the_groups_and_writes_nothing_of_them(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(problems, behavior(tool_call=1.0))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--sandbox-url", "http://127.0.0.1:9", "--max-retries", "0")
    assert code == 8, output
    assert read_records(out) == [] and manifest(out)["last_run"]["stats"]["groups_failed"] == 2


def without_tools(folder: Path) -> Path:
    """The simulated model's tokenizer, copied to `folder`, with a chat template that renders no `tools`."""
    shutil.copytree(TOKENIZER, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"][config["chat_template"].index("{% for message") :]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_template_that_ignores_tools_is_refused(serve, tmp_path):
    plain = without_tools(tmp_path / "plain-tokenizer")
    problems = write_problems(tmp_path / "p.jsonl", 1)
    server = serve(problems, behavior())
    code, output = tool_use(problems, tmp_path / "out", server.url, "--tokenizer", str(plain), "--chat-render", "local")
    assert code == 2 and "renders nothing of the `tools` argument" in output


def test_bad_system_options_are_one_usage_line(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 1)
    for option, why in (
        ("max_turns=0", "max_turns=0: must be a whole number of at least 1"),
        ("tools=search", "tool 'search': expected python, FILE.py:FUNCTION"),
        ("parser=qwen9", "not one of hermes, llama3_json, mistral"),
        ("colour=red", "has no option colour"),
    ):
        code, output = tool_use(problems, tmp_path / "out", "http://127.0.0.1:9", "--system-option", option)
        assert code == 2 and why in output, output


def test_the_server_renders_tools_as_we_do(serve, tmp_path):
    """The simulator's /tokenize takes tools as vLLM does; a run that renders on the server stays exact."""
    problems = write_problems(tmp_path / "p.jsonl", 2)
    server = serve(problems, behavior(tool_call=1.0))
    encoder = ChatEncoder(load_tokenizer(TOKENIZER))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 10 plus 7?"}]
    body = {"messages": messages, "tools": [PYTHON.schema], "add_generation_prompt": True}
    import urllib.request

    request = urllib.request.Request(
        f"{server.url}/tokenize", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    served = json.loads(urllib.request.urlopen(request, timeout=10).read())["tokens"]
    assert served == encoder.encode(messages, [PYTHON.schema])[1] != encoder.encode(messages)[1]
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--chat-render", "server")
    assert code == 0, output
    assert check_token_exact(read_records(out), server) == 2
    assert manifest(out)["settings"]["prompt_rendering"] == "server"


# -- --reward code ------------------------------------------------------------------------------------------------
def code_problems(path: Path) -> Path:
    rows = [
        {
            "id": "double",
            "prompt": "Read n and print 2n.",
            "label": {"inputs": ["1\n", "21\n", "-4\n"], "outputs": ["2\n", "42\n", "-8\n"]},
        },
        {
            "id": "sum",
            "prompt": "Write add(a, b) returning a + b.",
            "label": json.dumps({"fn_name": "add", "inputs": [[1, 2], [5, 5]], "outputs": [[3], [10]]}),
        },
        {
            "id": "lines",
            "prompt": "Print the input's words one a line.",
            "label": {"inputs": [["a b", "c"]], "outputs": [["a", "b", "c"]]},
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_code_reward_run_scores_each_kind_of_program_and_says_why(serve, tmp_path):
    problems = code_problems(tmp_path / "code.jsonl")
    server = serve(problems, behavior(correct=0.4, program_crash=0.2, program_loop=0.2, program_memory=0.2))
    out = tmp_path / "out"
    code, output = generate(
        str(problems),
        "-o",
        str(out),
        "--base-url",
        server.url,
        "--tokenizer",
        TOKENIZER,
        "--system",
        "single",
        "--reward",
        "code",
        "--samples-per-prompt",
        "12",
        "--seed",
        "3",
        "--code-test-timeout",
        "3",
        "--sandbox-memory-mb",
        "256",
        "-q",
    )
    assert code == 0, output
    seen = set()
    for r in read_records(out):
        program = r["content"].split("```python\n", 1)[1]
        kind = {CRASH: "crash", LOOP: "loop", HOG: "memory"}.get(program.removesuffix("```"))
        info = r["reward_info"]
        if kind is None:
            kind = "right" if r["raw_reward"] == 1.0 else "wrong"
            assert info.endswith("tests") if kind == "right" else "wrong output" in info
        else:
            assert r["raw_reward"] == 0.0
            assert {
                "crash": "error: RuntimeError: the simulated program gives up",
                "loop": "timeout after 3s",
                "memory": "memory: over its 256 MB",
            }[kind] in info
        seen.add(kind)
    assert seen == {"right", "wrong", "crash", "loop", "memory"}
    assert manifest(out)["settings"]["code_reward"] == {"code_test_timeout": 3.0, "sandbox_memory_mb": 256}
    assert validate_folder(out).ok


def test_tool_use_with_the_code_reward_and_rows_naming_code_themselves(serve, tmp_path):
    problems = code_problems(tmp_path / "code.jsonl")
    rows = [dict(json.loads(line), reward="code") for line in problems.read_text().splitlines()]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    server = serve(problems, behavior(tool_call=1.0, correct=1.0))
    out = tmp_path / "out"
    code, output = tool_use(problems, out, server.url, "--samples-per-prompt", "2", "--code-partial-credit")
    assert code == 0, output
    records = read_records(out)
    check_token_exact(records, server)
    finals = [turns[-1] for turns in executions(records)]
    assert [f["raw_reward"] for f in finals] == [1.0] * 6 and all(len(t) == 2 for t in executions(records))


def test_validate_checks_tool_calls_and_the_outcome_of_tool_use(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 1)
    server = serve(problems, behavior(tool_call=1.0))
    out = tmp_path / "out"
    assert tool_use(problems, out, server.url)[0] == 0
    assert validate_folder(out).ok
    shard = next(out.glob("rollouts-*.jsonl"))
    records = [json.loads(line) for line in shard.read_text().splitlines()]
    records[0]["tool_calls"][0]["status"] = "fine"
    records[1]["raw_reward"] = 1.0 - records[1]["raw_reward"]
    shard.write_text("".join(json.dumps(r) + "\n" for r in records))
    faults = [str(f) for f in validate_folder(out).faults]
    assert any(":1: value: tool_calls item 0 is not" in f for f in faults), faults
    assert any("from the final turn's" in f or "is not the raw_reward of the final turn" in f for f in faults)


def test_validate_takes_tool_calls_without_an_id_as_written_before_ids_were_kept(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 1)
    server = serve(problems, behavior(tool_call=1.0))
    out = tmp_path / "out"
    assert tool_use(problems, out, server.url)[0] == 0
    shard = next(out.glob("rollouts-*.jsonl"))
    records = [json.loads(line) for line in shard.read_text().splitlines()]
    assert all(isinstance(c["id"], str) for r in records for c in r["tool_calls"] or [])

    def call_faults(edit) -> list[str]:
        edited = json.loads(json.dumps(records))
        for record in edited:
            for call in record["tool_calls"] or []:
                edit(call)
        shard.write_text("".join(json.dumps(r) + "\n" for r in edited))
        return [str(f) for f in validate_folder(out).faults if "tool_calls item" in str(f)]

    assert call_faults(lambda call: call.pop("id")) == []  # an older record: no id
    assert call_faults(lambda call: call.update(id=7))  # an id that is not a string is a fault


def test_a_folder_of_the_previous_schema_is_refused_on_resume(serve, tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 1)
    server = serve(problems, behavior(tool_call=1.0))
    out = tmp_path / "out"
    assert tool_use(problems, out, server.url)[0] == 0
    data = manifest(out)
    data["schema_version"] = 5
    (out / "manifest.json").write_text(json.dumps(data))
    code, output = tool_use(problems, out, server.url)
    assert code == 6 and "holds rollouts of schema 5 (this agentroll writes 6)" in output
