"""Hostile model programs driven through `agentroll generate` (issue 31): the simulator writes them as answers
(`--reward code`) and as python tool calls (`--system tool-use`), and `generate` runs as its own process, as root
and as an ordinary user (`tests/unprivileged.py`). A hostile answer scores what it earns, 0 here; it never
changes the run's exit code, another sample's record, or anything outside its sandbox."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentroll.sim.script import Behavior
from agentroll.sim.server import SimServer

from . import hostile, unprivileged
from .conftest import TOKENIZER, read_records, user_env

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

QUIET = {
    "truncate": 0,
    "no_think_close": 0,
    "empty_after_think": 0,
    "tool_malformed": 0,
    "tool_unknown": 0,
    "tool_code_crash": 0,
    "tool_code_loop": 0,
    "tool_parallel": 0,
    "tool_again": 0,
    "tool_call": 1.0,
    "correct": 1.0,
}


@dataclass
class Side:
    """Who runs `generate`: root, or an ordinary user; `home` holds the run's input and output."""

    who: str
    home: Path

    def write(self, name: str, text: str, mode: int = 0o644) -> Path:
        path = self.home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        if self.who == "user":
            unprivileged.give(path.parent if path.parent != self.home else path)
        return path

    def generate(self, *args: str, key: str | None = None, path: str | None = None) -> subprocess.CompletedProcess:
        if self.who == "root":
            env = user_env()
            if path is not None:
                env["PATH"] = path
            argv = [sys.executable, "-m", "agentroll", "generate", *args, "--tokenizer", TOKENIZER]
            if key:
                argv += ["--api-key", key]  # on the command line: what the attack reads
            return subprocess.run(argv, capture_output=True, timeout=600, env=env, cwd=self.home)
        extra = {"OPENAI_API_KEY": key} if key else {}
        if path is not None:
            extra["PATH"] = path
        return unprivileged.agentroll(
            self.home, "generate", *args, "--tokenizer", unprivileged.tokenizer(), timeout=600, **extra
        )


@pytest.fixture(params=["root", "user"])
def side(request) -> Iterator[Side]:
    if request.param == "root":
        if not unprivileged.is_root():
            pytest.skip("the root half runs when the tests run as root (CI does)")
        home = Path(tempfile.mkdtemp(prefix="agentroll-shared-"))
        home.chmod(0o755)  # a dataset as they usually are: readable by all
    else:
        unprivileged.interpreter()
        home = unprivileged.home()
    yield Side(request.param, home)
    shutil.rmtree(home, ignore_errors=True)


def serve(problems: Path, key: str | None = None, **writes: str) -> SimServer:
    script = hostile.Writes.from_jsonl(problems, Behavior(**QUIET))  # type: ignore[arg-type]
    for name, value in writes.items():
        setattr(script, name, value)
    server = SimServer(script=script, api_key=key, max_model_len=32768, record=False)
    server.start()
    return server


def through(side: Side, problems: Path, out: Path, *args: str, key: str | None = None, **writes: str):
    """`generate` by `side` against a simulator writing `writes` (Writes' fields), started for it alone."""
    server = serve(problems, key, **writes)
    try:
        return side.generate(*common(problems, out, server.url), *args, key=key)
    finally:
        server.stop()


def common(problems: Path, out: Path, url: str, quiet: bool = True) -> list[str]:
    return [str(problems), "-o", str(out), "--base-url", url, "--seed", "3", "--max-tokens", "8192", *["-q"] * quiet]


def test_a_spying_tool_call_reads_writes_and_leaves_nothing_and_harms_no_other_sample(side: Side):
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(2)))
    secret = side.write(".ssh/id_rsa", f"PRIVATE {uuid.uuid4().hex}\n", 0o600)
    out, target, key = side.home / "out", side.home / "target.pth", f"sk-test-{uuid.uuid4().hex}"
    mark = f"agentroll-left-{uuid.uuid4().hex}"
    code = hostile.spy(
        [str(problems), str(secret)], [str(out / "planted"), str(side.home / "planted")], str(target), mark
    )
    done = through(
        side,
        problems,
        out,
        *("--system", "tool-use", "--system-option", "max_turns=2", "--system-option", "max_tool_output=4000"),
        *("--reward", "code", "--samples-per-prompt", "2", "--sandbox-concurrency", "2"),
        key=key,
        tool_code=code,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    records = read_records(out)
    shown = [c["result"] for r in records for c in r.get("tool_calls") or [] if c["name"] == "python"]
    assert shown == ["[]"] * 4  # what it found: nothing
    answers = [r for r in records if not r.get("tool_calls")]
    assert len(answers) == 4 and {r["raw_reward"] for r in answers} == {1.0}  # no other sample was touched
    everything = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert key.encode() not in everything
    assert not target.exists() and not (out / "planted").exists() and not (side.home / "planted").exists()
    left = [b for b in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(os.path.join(b, mark))]
    for base in left:
        os.unlink(os.path.join(base, mark))
    assert left == []


def test_a_program_cannot_read_the_tests_it_is_scored_by(side: Side):
    """16 answers that look the expected output up in the run's input file, found through /proc: all score 0."""
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(2, secret=True)))
    args = ("--system", "single", "--reward", "code", "--samples-per-prompt", "8")
    done = through(side, problems, side.home / "out", *args, program=hostile.CHEAT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    records = read_records(side.home / "out")
    assert len(records) == 16 and {r["raw_reward"] for r in records} == {0.0}
    assert all("nothing found" in r["reward_info"] for r in records), records[0]["reward_info"]


def test_an_answer_that_takes_the_hosts_aio_or_forges_its_exit_through_init_scores_0(side: Side):
    """Answers that print the right sum but exit 0 only if they took the host's AIO contexts or set the exit
    status bwrap reports through its init's eventfd (both got through the second review): all score 0."""
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(2)))
    args = ("--system", "single", "--reward", "code", "--samples-per-prompt", "4")
    done = through(side, problems, side.home / "out", *args, program=hostile.GRAB)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    records = read_records(side.home / "out")
    assert len(records) == 8 and {r["raw_reward"] for r in records} == {0.0}, [r["reward_info"] for r in records]
    assert all("test 1: error: exit code 1" in r["reward_info"] for r in records), records[0]["reward_info"]


@pytest.mark.parametrize("sandbox", ["bwrap", "unsafe-local"])
def test_an_answer_that_forges_a_sandbox_failure_scores_0_and_the_run_goes_on(side: Side, sandbox: str):
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(3)))
    server = serve(problems, program=hostile.FORGE, tool_code=hostile.FORGE)
    try:
        scored = side.generate(
            *common(problems, side.home / "code", server.url),
            *("--system", "single", "--reward", "code", "--samples-per-prompt", "4", "--sandbox", sandbox),
        )
        tools = side.generate(
            *common(problems, side.home / "tools", server.url),
            *("--system", "tool-use", "--system-option", "max_turns=2", "--reward", "code"),
            *("--samples-per-prompt", "2", "--sandbox", sandbox),
        )
    finally:
        server.stop()
    assert scored.returncode == 0, scored.stderr.decode()[-3000:]
    records = read_records(side.home / "code")
    assert len(records) == 12 and {r["raw_reward"] for r in records} == {0.0}
    assert all("test 1: error: sandbox: the program could not start" in r["reward_info"] for r in records)
    assert tools.returncode == 0, tools.stderr.decode()[-3000:]
    calls = [c for r in read_records(side.home / "tools") for c in r.get("tool_calls") or []]
    assert len(calls) == 6 and all("[exit code 125]" in c["result"] for c in calls)


def test_without_bubblewrap_model_code_runs_only_when_asked_for_by_name(side: Side):
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(1)))
    server = serve(problems)
    bare = side.home / "bin"
    bare.mkdir()
    try:
        refused = side.generate(
            *common(problems, side.home / "refused", server.url),
            *("--system", "single", "--reward", "code"),
            path=str(bare),
        )
        unsafe = side.generate(
            *common(problems, side.home / "unsafe", server.url, quiet=False),  # -q would keep the warning back
            *("--system", "single", "--reward", "code", "--sandbox", "unsafe-local"),
            path=str(bare),
        )
    finally:
        server.stop()
    said = refused.stderr.decode().strip().splitlines()
    assert refused.returncode == 2 and len(said) == 1, said
    assert "bubblewrap" in said[0] and "--sandbox-url" in said[0] and "--sandbox unsafe-local" in said[0]
    assert unsafe.returncode == 0, unsafe.stderr.decode()[-3000:]
    assert "unsafe-local" in unsafe.stderr.decode() and len(read_records(side.home / "unsafe")) == 1


GREEDY = """import json, os, subprocess, sys
found = {{}}
for name, source in {programs!r}.items():
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True)
    found[name] = done.stdout.strip() or "killed: " + str(done.returncode)
print(json.dumps(found))
"""


def test_a_greedy_tool_call_gets_its_runs_limits_not_more_and_leaves_nothing(side: Side):
    """Memory, files and leftovers of one python tool call, through generate: three children after 600 MB
    each in a run of 1024 MB, 4 MB files everywhere it can, a process and files left behind."""
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in hostile.code_rows(1)))
    mark, key, seconds = f"agentroll-left-{uuid.uuid4().hex}", 0x5B000000 + uuid.uuid4().int % 0xFFFFF, "911.25"
    programs = {"hoard": hostile.hoard(600), "fill": hostile.fill(200), "linger": hostile.linger(mark, key, seconds)}
    done = through(
        side,
        problems,
        side.home / "out",
        *("--system", "tool-use", "--system-option", "max_turns=2", "--system-option", "tool_timeout=60"),
        *("--reward", "code", "--sandbox-disk-mb", "32"),
        tool_code=GREEDY.format(programs=programs),
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    (call,) = [c for r in read_records(side.home / "out") for c in r.get("tool_calls") or []]
    said = call["result"].split("\n", 1)[0]  # then `[ran out of memory]` where the kernel killed one
    assert said.startswith("{"), call
    found = json.loads(said)
    assert found["hoard"].startswith("killed") or int(found["hoard"]) <= 1024, found
    assert int(found["fill"]) <= 2 * 32, found
    left = [b for b in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(os.path.join(b, mark))]
    segments = Path("/proc/sysvipc/shm").read_text().split("\n")[1:]
    stragglers = subprocess.run(["pgrep", "-f", f"sleep {seconds}"], capture_output=True).stdout.split()
    for base in left:
        os.unlink(os.path.join(base, mark))
    assert left == [] and key not in {int(line.split()[0]) for line in segments if line.strip()}
    assert stragglers == []


def test_a_reward_function_that_hangs_on_one_problem_costs_that_problem_alone(side: Side):
    """The issue's case, as root and as a user: a sync FILE.py:FUNCTION that hangs on one problem of 6; its
    calls time out and score 0 saying so, every group is written, the run exits 0."""
    rows = [{"id": f"p{i}", "prompt": f"What is {i} plus 1?", "label": str(i + 1)} for i in range(6)]
    problems = side.write("problems.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    judge = side.write(
        "judge.py",
        "import time\n\ndef judge(request):\n    if request.problem_id == 'p3':\n        time.sleep(3600)\n"
        "    return 1.0\n",
    )
    done = through(
        side,
        problems,
        side.home / "out",
        *("--system", "single", "--samples-per-prompt", "4", "--reward", f"{judge}:judge"),
        *("--reward-timeout", "0.5", "--reward-concurrency", "2"),
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    records = read_records(side.home / "out")
    assert len(records) == 24
    hung = {(r["raw_reward"], r["reward_info"]) for r in records if r["problem_id"] == "p3"}
    assert hung == {(0.0, "reward function timed out after 0.5s")}
    assert {r["raw_reward"] for r in records if r["problem_id"] != "p3"} == {1.0}
