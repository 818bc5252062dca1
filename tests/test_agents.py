"""`--system agent` end to end: real agent programs and functions (the `openai` SDK sync, async and streamed, the
OpenAI Agents SDK, plain urllib) run against the simulator through agentroll's recording proxy, by the real CLI
(in-process) as a user runs it. Every record is checked against what the simulated server sampled, token for
token, and every turn that continues another against the turn before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from agentroll.cli import app
from agentroll.render.chat import ChatEncoder, load_tokenizer
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.validate import validate as validate_folder

from . import agents_support as support
from .conftest import TOKENIZER, generations, read_records, run_cli, user_env, write_problems
from .test_tool_use import behavior

TOOL_CALLING = behavior(tool_call=1.0, correct=1.0)  # a tool call, then the answer the tool printed


@pytest.fixture
def problems(tmp_path: Path) -> Path:
    return write_problems(tmp_path / "problems.jsonl", 2)


@pytest.fixture
def server(problems: Path):
    sim = SimServer(script=Script.from_jsonl(problems, TOOL_CALLING))
    sim.start()
    yield sim
    sim.stop()


def program(tmp_path: Path, source: str, name: str = "agent.py") -> str:
    path = tmp_path / name
    path.write_text(source)
    return f"command={sys.executable} {path}"


def generate(problems: Path, out: Path, url: str, *options: str) -> tuple[int, str]:
    args = ["generate", str(problems), "-o", str(out), "--base-url", url, "--tokenizer", TOKENIZER]
    args += ["--system", "agent", "--seed", "5", "--max-tokens", "256", *options]
    done = run_cli(*args)
    return done.returncode, (done.stderr + done.stdout).decode()


def executions(records: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for r in records:
        if not out or out[-1][0]["rollout_id"] != r["rollout_id"]:
            out.append([])
        out[-1].append(r)
    return out


def check_exact(records: list[dict], server: SimServer, bare: frozenset[int] = frozenset()) -> int:
    """Each record is a call the server answered (its prompt ids, seed, response ids and logprobs), and each
    record that continues another starts with that one's prompt and response ids, then exactly the template's
    rendering of the new messages, the tool results (mask 0 there); at the positions `bare` no new message.
    Returns how many continuations were checked."""
    answered = {
        (tuple(e["request"]["prompt"]), e["request"]["seed"]): e["response"]["choices"][0] for e in generations(server)
    }
    tokenizer = load_tokenizer(TOKENIZER)
    continued = 0
    for calls in executions(records):
        for at, r in enumerate(calls):
            choice = answered[tuple(r["prompt_token_ids"]), r["sampling"]["seed"]]
            assert r["response_token_ids"] == choice["token_ids"]
            assert r["response_logprobs"] == choice["logprobs"]["token_logprobs"]
            if r["continues"] is None:
                assert r["history_mask"] is None and r["turn"] == 0
                continue
            before = calls[r["continues"]]
            head = before["prompt_token_ids"] + before["response_token_ids"]
            assert r["prompt_token_ids"][: len(head)] == head and r["turn"] == before["turn"] + 1
            injected = tokenizer.decode(r["prompt_token_ids"][len(head) :])
            closed = before["finish_reason"] == "stop"  # the model's own <|im_end|> stays in its response
            results = "".join(f"<|im_start|>tool\n{c['result']}<|im_end|>\n" for c in before["tool_calls"] or [])
            results = "" if at in bare else results
            assert injected == ("" if closed else "<|im_end|>") + "\n" + results + "<|im_start|>assistant\n"
            history = (before["history_mask"] or [0] * len(before["prompt_token_ids"])) + before["loss_mask"]
            assert r["history_mask"] == history + [0] * (len(r["prompt_token_ids"]) - len(head))
            assert r["rerendered"] is False and r["branched_from"] is None
            continued += 1
    return continued


def report(out: Path) -> dict:
    shown = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.stdout)["all"]["report"]


# -- real clients ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "agent",
    [
        pytest.param(lambda tmp: program(tmp, support.SDK_PROGRAM), id="openai-sdk-program"),
        pytest.param(lambda tmp: program(tmp, support.STREAM_PROGRAM), id="openai-sdk-streamed"),
        pytest.param(lambda tmp: program(tmp, support.CURL_PROGRAM), id="urllib-program"),
        pytest.param(lambda tmp: "agent=tests.agents_support:sdk_run", id="openai-sdk-async-function"),
    ],
)
def test_an_agent_is_recorded_token_exact_through_its_tool_turns(agent, problems, server, tmp_path):
    out = tmp_path / "out"
    code, output = generate(problems, out, server.url, "--system-option", agent(tmp_path), "--samples-per-prompt", "2")
    assert code == 0, output
    records = read_records(out)
    assert check_exact(records, server) == 4  # each execution: a tool call, then an answer continuing it
    for calls in executions(records):
        first, answer = calls
        assert first["tool_calls"][0]["status"] == "ok" and first["tool_calls"][0]["name"] == "python"
        said = first["tool_calls"][0]["result"]  # what the agent ran and sent back, read by the model
        assert answer["continues"] == 0 and f"\\boxed{{{said}}}" in answer["response"]
        assert f"\\boxed{{{said}}}" in answer["agent_answer"] and said == first["label"]
        assert {r["raw_reward"] for r in calls} == {1.0} == {r["final_reward"] for r in calls}
    assert validate_folder(out).ok
    figures = report(out)
    assert figures["calls_per_execution"] == 2.0 and figures["tool_calls_per_execution"] == 1.0
    assert figures["continued_calls"] == 0.5 and figures["branches_per_execution"] == 0.0
    assert figures["agent_accuracy"] == 1.0 == figures["system_accuracy"]


@pytest.mark.parametrize(
    "agent",
    [
        pytest.param(lambda tmp: program(tmp, support.SDK_PROGRAM), id="openai-sdk-program"),
        pytest.param(lambda tmp: program(tmp, support.CURL_PROGRAM), id="urllib-program"),
        pytest.param(lambda tmp: "agent=tests.agents_support:sdk_run", id="openai-sdk-async-function"),
    ],
)
def test_an_http_proxy_in_the_environment_does_not_come_between_the_agent_and_agentroll(
    agent, problems, server, tmp_path, monkeypatch
):
    """A cluster's HTTP_PROXY (here one that answers nothing) is for the outside world: the agent's client reaches
    agentroll's proxy on loopback directly, whatever NO_PROXY already held."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "example.com")
    monkeypatch.delenv("no_proxy", raising=False)
    out = tmp_path / "out"
    code, output = generate(problems, out, server.url, "--system-option", agent(tmp_path), "--limit", "1")
    assert code == 0, output
    assert check_exact(read_records(out), server) == 1
    assert os.environ["NO_PROXY"] == "example.com"  # the run's own environment is left as it was


def test_the_reward_an_agent_reports_is_used_with_reward_agent(problems, server, tmp_path):
    out = tmp_path / "out"
    code, output = generate(
        problems, out, server.url, "--system-option", program(tmp_path, support.CURL_PROGRAM), "--reward", "agent"
    )
    assert code == 0, output
    records = read_records(out)
    assert {(r["agent_reward"], r["raw_reward"], r["final_reward"]) for r in records} == {(0.25, 0.25, 0.25)}
    assert {r["reward_info"] for r in records} == {"the agent's own reward"}


def test_a_long_answer_is_read_whole_and_one_that_cannot_be_is_a_failure(problems, server, tmp_path):
    """A coding agent's answer (a patch) runs to hundreds of KiB on one line, after pages of logs: it is read
    whole. An answer line longer than what agentroll keeps of the output fails the agent, saying why (scored 0 and
    flagged under on_error=score); it is never scored cut."""
    talk = support.CURL_PROGRAM.split("for _ in range(6):")[0] + (
        'post("/chat/completions", {"model": model, "messages": messages})\n'
        'print("log line\\n" * 20000)\n'
        'print(json.dumps({"answer": "x" * int(os.environ["ANSWER_BYTES"]), "reward": 1}))\n'
    )
    out = tmp_path / "out"
    options = ["--system-option", program(tmp_path, talk), "--reward", "agent", "--limit", "1"]
    os.environ["ANSWER_BYTES"] = str(300_000)
    try:
        code, output = generate(problems, out, server.url, *options)
        assert code == 0, output
        assert [(len(r["agent_answer"]), r["raw_reward"]) for r in read_records(out)] == [(300_000, 1.0)]
        os.environ["ANSWER_BYTES"] = str(40 << 20)
        code, output = generate(problems, tmp_path / "cut", server.url, *options)
    finally:
        del os.environ["ANSWER_BYTES"]
    assert code == 0, output
    (record,) = read_records(tmp_path / "cut")
    said = "the agent printed an answer line longer than the 16 MiB of its output agentroll keeps"
    assert record["agent_error"] == said and (record["raw_reward"], record["agent_answer"]) == (0.0, None)


def test_reward_agent_takes_the_agent_system(problems, server, tmp_path):
    code, output = generate(problems, tmp_path / "out", server.url, "--system", "single", "--reward", "agent")
    assert code == 2 and "--reward agent is the reward an agent reports: it takes --system agent" in output


@pytest.mark.parametrize("thinking", ["branch", "continue"])
def test_the_openai_agents_sdk_runs_unchanged(thinking, problems, server, tmp_path):
    """The Agents SDK sends its history back without the model's reasoning: by default each such turn is a new
    branch rendered from the messages; with thinking=continue it goes on by the model's own ids."""
    out = tmp_path / "out"
    options = ["--system-option", "agent=tests.agents_support:agents_run", "--system-option", f"thinking={thinking}"]
    code, output = generate(problems, out, server.url, *options)
    assert code == 0, output
    records = read_records(out)
    check_exact(records, server)
    for first, answer in executions(records):
        assert first["tool_calls"][0]["result"] == first["label"]  # the SDK ran the tool and sent its output back
        assert answer["raw_reward"] == 1.0
        if thinking == "continue":
            assert answer["continues"] == 0 and not answer["rerendered"]
            assert first["response"] in answer["prompt"]  # the model's thinking and call, as it wrote them
        else:
            assert answer["continues"] is None and answer["rerendered"] and answer["branched_from"] == 0
            assert answer["history_mask"] is None and "<think>" not in answer["prompt"]
    figures = report(out)
    assert figures["branches_per_execution"] == (1.0 if thinking == "branch" else 0.0)
    # the branches only the dropped reasoning made: said (once, then counted), naming thinking=continue
    named = "--system-option thinking=continue continues them by the model's own ids" in output
    assert named == (thinking == "branch"), output
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["branches_by_reasoning"] == (2 if thinking == "branch" else 0)
    assert (stats["agents_started"], stats["agents_finished"], stats["agents_failed"]) == (2, 2, 0)


@pytest.mark.parametrize("responses", [True, False], ids=["responses-api-program", "chat-completions-function"])
def test_a_stock_agents_sdk_agent_on_a_model_that_calls_unknown_tools_completes_the_run_scored_and_flagged(
    responses, problems, tmp_path
):
    """The Agents SDK raises ModelBehaviorError on a call of a tool it was not offered: the model's mistake. Under
    the default on_error=score that execution is written with its call, scored 0 and flagged; the run exits 0."""
    sim = SimServer(script=Script.from_jsonl(problems, behavior(tool_call=1.0, tool_unknown=1.0, correct=1.0)))
    sim.start()
    agent = program(tmp_path, support.AGENTS_SDK_PROGRAM) if responses else "agent=tests.agents_support:agents_run"
    try:
        out = tmp_path / "out"
        code, output = generate(problems, out, sim.url, "--system-option", agent)
    finally:
        sim.stop()
    assert code == 0, output
    records = read_records(out)
    assert len(records) == 2 and all(r["tool_calls"][0]["status"] == "unknown" for r in records)
    said = "exited with code 1; its stderr ends: " if responses else "raised "
    for r in records:
        assert r["agent_error"].startswith(f"the agent {said}") and "ModelBehaviorError" in r["agent_error"]
        assert r["raw_reward"] == 0.0
    assert report(out)["agent_errors"] == 1.0 and validate_folder(out).ok


def test_a_harness_that_rewrites_history_makes_counted_branches_never_a_wrong_continuation(problems, server, tmp_path):
    out, log = tmp_path / "out", tmp_path / "requests.jsonl"
    os.environ["REQUESTS"] = str(log)
    try:
        code, output = generate(
            problems, out, server.url, "--system-option", program(tmp_path, support.REWRITER_PROGRAM)
        )
    finally:
        del os.environ["REQUESTS"]
    assert code == 0, output
    records = read_records(out)
    assert check_exact(records, server, bare=frozenset({4})) == 4
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    encoder = ChatEncoder(load_tokenizer(TOKENIZER))
    for calls in executions(records):
        assert len(calls) == 5
        first, going_on, stripped, edited, again = calls
        assert going_on["continues"] == 0 and again["continues"] == 0  # a continuation with no new message too
        for branch in (stripped, edited):
            assert branch["continues"] is None and branch["rerendered"] is True and branch["history_mask"] is None
            assert branch["branched_from"] is not None and branch["branched_from"] < calls.index(branch)
            head = first["prompt_token_ids"] + first["response_token_ids"]
            assert branch["prompt_token_ids"][: len(head)] != head  # never stitched onto the model's ids
            # rendered whole from exactly what the harness sent (the simulator's template shows no tool calls)
            messages = next(m for m in sent if encoded(encoder, m) == branch["prompt_token_ids"])
            assert messages[-1]["role"] == "tool"
        assert "</think>" not in stripped["prompt"] and "Be brief." in edited["prompt"]
    assert validate_folder(out).ok
    figures = report(out)
    assert figures["branches_per_execution"] == 2.0 and figures["continued_calls"] == 0.4
    assert figures["rerendered_calls"] == 0.4


def encoded(encoder: ChatEncoder, messages: list[dict]) -> list[int]:
    from agentroll.agents.messages import for_template

    return encoder.encode([for_template(m) for m in messages], [support.PYTHON])[1]


# -- failures -------------------------------------------------------------------------------------------------------
CRASH_ONCE = support.SDK_PROGRAM.replace(
    "    messages.append(message)\n",
    "    messages.append(message)\n"
    "    if os.path.exists(os.environ['CRASH_FLAG']) and os.environ['AGENTROLL_SAMPLE_INDEX'] == '1':\n"
    "        print('RuntimeError: the harness fell over', file=sys.stderr)\n"
    "        sys.exit(3)\n",
    1,
)


def test_under_on_error_fail_a_crashed_agent_fails_its_group_and_a_changed_agent_reruns_it_on_the_same_calls(
    problems, server, tmp_path
):
    """`on_error=fail` (agents whose crashes are bugs): the group is not written, and the warning and exit line say
    that a rerun gives the agent the same answers (the journal), so only a changed agent gets further."""
    out, flag = tmp_path / "out", tmp_path / "crash"
    flag.touch()
    agent = ["--system-option", program(tmp_path, CRASH_ONCE), "--system-option", "on_error=fail"]
    os.environ["CRASH_FLAG"] = str(flag)
    try:
        code, output = generate(problems, out, server.url, *agent, "--samples-per-prompt", "2")
        assert code == 8, output
        assert "group not written, a rerun fails it again unless the agent changes: the agent exited with code 3" in (
            output
        )
        assert "a rerun gives their agents the same answers: it fails them again unless the agent changes" in output
        assert "its stderr ends: RuntimeError: the harness fell over" in output
        assert read_records(out) == []
        failed = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
        assert failed["agents_failed"] == 2 and failed["groups_failed"] == 2  # one crashed agent in each group
        asked = len(generations(server))
        flag.unlink()
        code, output = generate(problems, out, server.url, *agent, "--samples-per-prompt", "2")
    finally:
        del os.environ["CRASH_FLAG"]
    assert code == 0, output
    records = read_records(out)
    check_exact(records, server)
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    # the calls made before the crash (each execution's first, the second of execution 0) are not asked again
    assert stats["calls_replayed"] >= 4 and len(generations(server)) - asked == len(records) - stats["calls_replayed"]
    assert stats["agents_failed"] == 0


def test_an_agent_that_crashes_after_its_calls_is_the_models_failure_recorded_flagged_and_scored_0(
    problems, server, tmp_path
):
    """The default `on_error=score`: the crashed executions are written with their calls, `agent_error` saying why,
    raw reward 0, counted in the summary; the run completes (exit 0)."""
    out, flag = tmp_path / "out", tmp_path / "crash"
    flag.touch()
    os.environ["CRASH_FLAG"] = str(flag)
    try:
        code, output = generate(
            problems, out, server.url, "--system-option", program(tmp_path, CRASH_ONCE), "--samples-per-prompt", "2"
        )
    finally:
        del os.environ["CRASH_FLAG"]
    assert code == 0, output
    records = read_records(out)
    check_exact(records, server)
    runs = executions(records)
    failed = [e for e in runs if e[0]["agent_error"] is not None]
    assert len(runs) == 4 and len(failed) == 2 and all(e[0]["sample_index"] == 1 for e in failed)
    for execution in failed:
        assert len(execution) == 1  # the call made before the crash
        for r in execution:
            assert r["agent_error"].startswith("the agent exited with code 3; its stderr ends: RuntimeError")
            assert (r["raw_reward"], r["agent_answer"]) == (0.0, None) and "scored 0" in r["reward_info"]
    assert all(r["agent_error"] is None for e in runs if e not in failed for r in e)
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["agents_failed"] == 2 and stats["groups_failed"] == 0
    assert report(out)["agent_errors"] == 0.5
    assert "agents failed (scored 0) 0.500" in output
    assert validate_folder(out).ok


def test_an_agent_past_its_timeout_is_killed_with_everything_it_started(problems, server, tmp_path):
    pid_file = tmp_path / "child.pid"
    os.environ["CHILD_PID"] = str(pid_file)
    try:
        options = ["--system-option", program(tmp_path, support.HANG_PROGRAM), "--system-option", "timeout=10"]
        code, output = generate(problems, tmp_path / "out", server.url, "--limit", "1", *options)
    finally:
        del os.environ["CHILD_PID"]
    assert code == 8, output
    assert "the agent ran past its timeout of 10s (nothing on its stderr)" in output
    stats = json.loads((tmp_path / "out" / "manifest.json").read_text())["last_run"]["stats"]
    assert (stats["agents_failed"], stats["agents_timed_out"]) == (0, 1)
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_crash_is_counted_as_a_crash_whatever_its_stderr_says(problems, server, tmp_path):
    """An agent that exits non-zero after a traceback naming a timeout of its own (a tool's, an HTTP read's) crashed:
    only the execution's own timeout counts as `agents_timed_out`."""
    crash = "import sys\nprint('requests.exceptions.ReadTimeout: read timeout=10', file=sys.stderr)\nsys.exit(1)\n"
    out = tmp_path / "out"
    code, output = generate(problems, out, server.url, "--system-option", program(tmp_path, crash), "--limit", "1")
    assert code == 8 and "the agent exited with code 1; its stderr ends: requests.exceptions.ReadTimeout" in output
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert (stats["agents_failed"], stats["agents_timed_out"]) == (1, 0)


def test_the_exit_8_line_of_a_crashed_agent_blames_no_call(problems, server, tmp_path):
    """The line that ends a run whose agent crashed says why (its agent), not "calls failed for good": no call
    failed (a newcomer's trial read it so)."""
    crash = "import sys\nsys.exit(1)\n"
    for quiet in ([], ["-q"]):
        out = tmp_path / f"out{len(quiet)}"
        code, output = generate(problems, out, server.url, "--system-option", program(tmp_path, crash), *quiet)
        line = next(line for line in output.splitlines() if line.startswith("error: "))
        assert code == 8 and line.startswith("error: 2 of 2 groups could not be produced"), output
        assert "call" not in line, line
    assert "(2x the agent exited with code 1 (nothing on its stderr))" in line, line


def test_the_timeout_runs_while_the_row_is_handed_over(server, tmp_path):
    """A row larger than a pipe holds, to an agent that never reads its standard input: the timeout still ends it
    (the row is not written to the end first)."""
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps({"id": "p000", "prompt": "What is 10 plus 7?", "label": "17", "notes": "x" * 400_000}))
    sleeper = "import time\ntime.sleep(30)\n"
    options = ["--system-option", program(tmp_path, sleeper), "--system-option", "timeout=2"]
    code, output = generate(big, tmp_path / "out", server.url, *options)
    assert code == 8 and "the agent ran past its timeout of 2s" in output, output


def test_an_agent_that_makes_no_call_fails_its_execution(problems, server, tmp_path):
    code, output = generate(
        problems, tmp_path / "out", server.url, "--system-option", program(tmp_path, "print(42)"), "--limit", "1"
    )
    assert code == 8 and "the agent made no model call" in output


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ([], "give --system-option command="),
        (["command=echo", "agent=x.py:run"], "one of the two"),
        (["command=echo", "thinking=maybe"], "thinking='maybe': must be branch or continue"),
        (["command=echo", "timeout=0"], "timeout=0: must be a number of seconds above 0"),
        (["agent=tests.agents_support:PYTHON"], "expected an async function run(client, problem)"),
        (["agent=nowhere.py:run"], "no file nowhere.py"),
    ],
)
def test_bad_agent_options_are_one_usage_line(options, said, problems, server, tmp_path):
    given = [x for o in options for x in ("--system-option", o)]
    code, output = generate(problems, tmp_path / "out", server.url, *given)
    assert code == 2, output
    assert said in output


def test_a_template_that_differs_from_the_servers_is_caught_and_the_server_renders_the_agents_prompts(
    problems, server, tmp_path
):
    from .test_doctor import other_template

    out = tmp_path / "out"
    code, output = generate(
        problems, out, server.url, "--system-option", "agent=tests.agents_support:sdk_run",
        "--tokenizer", str(other_template(tmp_path)),
    )  # fmt: skip
    assert code == 0, output
    assert "does not render prompts as the server does" in output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["prompt_rendering"] == "server"
    records = read_records(out)
    assert check_exact(records, server) == 2  # the tool turns rendered by the server's /tokenize, and continued
    assert all(r["prompt"].endswith("<|im_start|>assistant\n") for r in records)  # the server's template


def running_agent(problems: Path, server: SimServer, tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """`agentroll generate` in a process of its own, once its agent has started a child of its own: the run, that
    child's pid, and where the run's stderr goes."""
    pid_file = tmp_path / "child.pid"
    agent = tmp_path / "agent.py"
    agent.write_text(support.HANG_PROGRAM)
    env = {**user_env(), "CHILD_PID": str(pid_file)}
    args = ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url, "--tokenizer"]
    args += [TOKENIZER, "--system", "agent", "--system-option", f"command={sys.executable} {agent}", "--limit", "1"]
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], env=env, stderr=err)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the agent's own progress: its child's pid written
    assert run.poll() is None, log.read_text()
    return run, int(pid_file.read_text()), log


def gone(pid: int) -> bool:
    """Whether the process has ended (or is a zombie), waiting for it up to a minute."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_a_stop_ends_the_run_and_every_agent_with_all_it_started(stop, code, problems, server, tmp_path):
    """A stop while agents run: agentroll exits 143 (130), each agent's process group is killed, nothing is left."""
    run, child, log = running_agent(problems, server, tmp_path)
    run.send_signal(stop)
    assert run.wait(timeout=60) == code, log.read_text()
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_kill_9_of_the_run_leaves_nothing_an_agent_started(problems, server, tmp_path):
    """agentroll killed outright (no chance to clean up): the agent and all it started die with it."""
    run, child, log = running_agent(problems, server, tmp_path)
    run.kill()
    assert run.wait(timeout=60) == -signal.SIGKILL
    alive = not gone(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, log.read_text()
