"""What a new user meets first, from a shell or a cron job (issue 32): the documented exit code whatever the
flags, one line per fault in the user's words, the error said last, and no line that points at what was not
shown."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, run_cli, user_env


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(stderr: bytes) -> str:
    return stderr.decode().strip().splitlines()[-1]


def generate_against(problems, out, faults: Faults, *extra: str):
    """`generate` against a simulator with `faults` (seeded: the same calls fail each time)."""
    server = SimServer(script=Script.from_jsonl(problems), faults=faults, seed=3, record=False)
    server.start()
    try:
        args = ["-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER, *extra]
        return run_cli("generate", str(problems), *args)
    finally:
        server.stop()


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_debug_keeps_every_documented_exit_code_and_adds_the_traceback_above_the_error(sim, problems, tmp_path, debug):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(problems.read_text().splitlines()[0] + '\n{"prompt": 3, "label": "1"}\n')
    afile = tmp_path / "afile"
    afile.write_text("x")
    url = sim.url
    cases = {
        "bad row": (3, [str(bad), "-o", str(tmp_path / "o1"), "--base-url", url]),
        "server down": (
            4,
            [str(problems), "-o", str(tmp_path / "o2"), "--base-url", f"http://127.0.0.1:{closed_port()}"],
        ),
        "a file as -o": (6, [str(problems), "-o", str(afile), "--base-url", url]),
        "no scheme": (2, [str(problems), "-o", str(tmp_path / "o3"), "--base-url", url.removeprefix("http://")]),
        "unknown model": (4, [str(problems), "-o", str(tmp_path / "o4"), "--base-url", url, "--model", "nope"]),
    }
    for name, (code, args) in cases.items():
        proc = run_cli("generate", *args, "--tokenizer", TOKENIZER, *(["--debug"] if debug else []))
        assert proc.returncode == code, (name, proc.stderr.decode()[-2000:])
        assert last_line(proc.stderr).startswith("error: "), name  # the one line a script greps, last
        assert (b"Traceback (most recent call last)" in proc.stderr) is debug, name


def test_a_debug_run_says_debug_lines_and_a_plain_one_none(sim, problems, tmp_path):
    args = ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER]
    debug = run_cli(*args, "--debug", "--limit", "2")
    assert debug.returncode == 0, debug.stderr.decode()
    lines = [line for line in debug.stderr.decode().splitlines() if " DEBUG " in line]
    assert any("serves agentroll-sim" in line for line in lines)  # what the run learnt of its server
    assert sum("group complete" in line for line in lines) == 2  # each group as it is committed
    plain = run_cli(*args)
    assert plain.returncode == 0 and b" DEBUG " not in plain.stderr


def test_exit_4_after_the_down_timeout_is_said_below_the_summary(tmp_path, problems):
    proc = generate_against(
        problems, tmp_path / "out", Faults(error_rate=1.0), "--down-timeout", "1", "--probe-interval", "0.2"
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 4, stderr
    assert stderr.index("agentroll generate:") < stderr.index("error: every endpoint has been down for 1s")
    assert last_line(proc.stderr).startswith("error: every endpoint has been down")


def test_quiet_exit_8_names_why_groups_failed_rather_than_warnings_it_did_not_print(tmp_path, problems):
    quiet = generate_against(
        problems, tmp_path / "out", Faults(error_rate=0.4), "--max-retries", "0", "--num-parallel", "2", "-q"
    )
    assert quiet.returncode == 8, quiet.stderr.decode()
    lines = quiet.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "see the warnings above" not in lines[0], lines
    assert "call failed: HTTP 50" in lines[0] and "run the same command again" in lines[0]


def test_loud_exit_8_points_at_the_warnings_it_printed(tmp_path, problems):
    loud = generate_against(
        problems, tmp_path / "out", Faults(error_rate=0.4), "--max-retries", "0", "--num-parallel", "2"
    )
    assert loud.returncode == 8
    assert "see the warnings above" in last_line(loud.stderr) and "group not written" in loud.stderr.decode()


@pytest.fixture
def web_server(tmp_path):
    """`python -m http.server`: a server that is not vLLM, answering 404 with an HTML page."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_server_that_is_not_vllm_is_said_in_one_line_with_its_status_and_a_hint(web_server, problems, tmp_path):
    made = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", web_server)
    checked = run_cli("doctor", "--base-url", web_server)
    for proc, code, said in ((made, 4, made.stderr), (checked, 1, checked.stdout)):  # doctor's verdicts: stdout
        lines = said.decode().strip().splitlines()
        assert proc.returncode == code and len(lines) == 1, lines
        assert "/v1/models answered 404" in lines[0] and "File not found" in lines[0]
        assert "is it a vLLM server? --base-url" in lines[0] and "<" not in lines[0]


@pytest.mark.bwrap  # tool-use's python tool: the local sandbox
@pytest.mark.parametrize("system", ["critique-revise", "tool-use"])
def test_convert_names_the_turn_a_conversational_layout_cannot_write_and_the_way_out(sim, problems, tmp_path, system):
    out = tmp_path / "out"
    made = run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--system", system,
        "--samples-per-prompt", "4", "--reward", "exact", "--seed", "1",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr.decode()
    refused = run_cli("convert", str(out), "--to", "sft", "-o", str(tmp_path / "sft"))
    line = last_line(refused.stderr)
    assert refused.returncode == 2 and ", turn 1: its prompt holds the conversation so far" in line, line
    assert "--tokenizer" not in line and "use --layout standard" in line  # the run's tokenizer is the one used
    standard = run_cli("convert", str(out), "--to", "sft", "-o", str(tmp_path / "sft"), "--layout", "standard")
    assert standard.returncode == 0, standard.stderr.decode()
    dpo = run_cli("convert", str(out), "--to", "nemo-rl-dpo", "-o", str(tmp_path / "nemo"))
    if dpo.returncode:  # a format without --layout standard says its own way out
        assert "use --to dpo --layout standard" in last_line(dpo.stderr)


HIDE_TORCH = "import sys\nsys.modules['torch'] = None  # a machine without PyTorch, as `pip install agentroll` makes\n"
BANNER = "PyTorch was not found"


def shell_env() -> dict[str, str]:
    """A user's shell: no TRANSFORMERS_VERBOSITY (this test process may have set one by loading a tokenizer)."""
    return {k: v for k, v in user_env().items() if k != "TRANSFORMERS_VERBOSITY"}


def as_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`agentroll ...` as the installed command starts (`agentroll.cli.main`), on a machine without PyTorch."""
    probe = f"{HIDE_TORCH}sys.argv = ['agentroll', *sys.argv[1:]]\nfrom agentroll.cli import main\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=timeout, env=shell_env()
    )


def serve_sim_stderr(*args: str, preamble: str = "import sys\n") -> str:
    """What `agentroll serve-sim --port 0 ARGS` says on stderr up to its listening line, as the command starts."""
    probe = f"{preamble}sys.argv = ['agentroll', 'serve-sim', '--port', '0', *{list(args)!r}]\n"
    with subprocess.Popen(
        [sys.executable, "-c", probe + "from agentroll.cli import main\nmain()\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=shell_env(),
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and "listening on http://127.0.0.1:" in proc.stdout.readline()
        finally:
            proc.terminate()
        return proc.communicate(timeout=60)[1]


def test_serve_sim_says_no_transformers_banner_on_a_machine_without_torch():
    stderr = serve_sim_stderr(preamble=HIDE_TORCH)
    assert BANNER not in stderr, stderr


def test_a_run_is_quiet_about_what_needs_no_action_and_verbose_says_it(sim, problems, tmp_path):
    tools = tmp_path / "my_tools.py"
    doc = '    """Look it up.\n\n    Args:\n        query: what\n    """\n'
    tools.write_text(f"def search(query: str) -> str:\n{doc}    return query\n")
    args = [
        "generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER,
        "--system", "tool-use", "--system-option", f"tools={tools}:search", "--limit", "2", "--reward", "exact",
    ]  # fmt: skip
    plain = as_command(*args)
    assert plain.returncode == 0, plain.stderr
    assert BANNER not in plain.stderr and "does not take a request priority" not in plain.stderr
    assert [line for line in plain.stderr.splitlines() if " INFO " in line and "progress:" not in line] == []
    verbose = as_command(*args, "--verbose", "--overwrite")
    assert verbose.returncode == 0, verbose.stderr
    assert BANNER in verbose.stderr and "does not take a request priority" in verbose.stderr


@pytest.mark.parametrize("answers", [False, True], ids=["no answers", "answers"])
def test_serve_sim_says_at_start_that_without_answers_every_answer_is_graded_wrong(problems, answers):
    stderr = serve_sim_stderr(*(["--answers", str(problems)] if answers else []))
    said = "no --answers: the simulated model knows no label, so every answer it writes is graded wrong"
    assert (said in stderr) is not answers, stderr


def test_a_follower_ends_naming_the_runs_exit_when_it_ended_for_good_and_waits_while_a_writer_holds_it(
    tmp_path, problems
):
    from agentroll import RunEnded, read_groups
    from agentroll.folder import Layout, Manifest
    from agentroll.folder.lock import release, take

    out = tmp_path / "out"
    made = generate_against(problems, out, Faults(error_rate=0.4), "--max-retries", "0", "--system", "single", "-q")
    assert made.returncode == 8
    read: list[str] = []
    with pytest.raises(RunEnded) as ended:
        for group in read_groups(out, follow=True, poll_s=0.05, timeout_s=60):
            read.append(group.problem_id)
    assert ended.value.exit_code == 8 and "ended with exit 8 (" in str(ended.value)
    assert "groups could not be produced" in str(ended.value) and "run the same generate command again" in str(
        ended.value
    )
    assert len(read) == Manifest.load(out).groups > 0  # every group on disk first
    held = take(Layout(out).lock, "busy")  # a rerun has begun: its groups are to come
    try:
        with pytest.raises(TimeoutError):
            list(read_groups(out, follow=True, poll_s=0.05, timeout_s=0.3))
    finally:
        release(held)


def test_stats_says_a_folder_is_not_complete_and_how_its_run_ended(tmp_path, problems):
    out = tmp_path / "out"
    generate_against(problems, out, Faults(error_rate=0.4), "--max-retries", "0", "--system", "single", "-q")
    for args in ([], ["--json"]):
        shown = run_cli("stats", str(out), *args)
        assert shown.returncode == 0
        said = shown.stderr.decode()
        assert "warning: " in said and "the run is not complete: its last run ended with exit 8" in said, said
    data = json.loads(run_cli("stats", str(out), "--json").stdout)
    assert data["complete"] is False and "exit 8" in data["unfinished"]
    checked = run_cli("validate", str(out))
    assert b"its last run ended with exit 8" in checked.stdout


def test_doctor_says_its_verdicts_on_stdout_and_as_json(sim, tmp_path):
    plain = run_cli("doctor", "--base-url", sim.url, "--tokenizer", TOKENIZER)
    assert plain.returncode == 0 and plain.stderr == b""
    assert [line.split(":")[0] for line in plain.stdout.decode().splitlines()][:2] == [
        "ok   server",
        "ok   max_model_len",
    ]
    shown = run_cli("doctor", "--base-url", sim.url, "--tokenizer", TOKENIZER, "--json")
    report = json.loads(shown.stdout)
    assert shown.returncode == 0 and report["ok"] is True and report["base_url"] == sim.url
    assert {c["verdict"] for c in report["checks"]} <= {"ok", "warn"} and len(report["checks"]) >= 6
    assert [c["name"] for c in report["checks"]][:2] == ["server", "max_model_len"]
    dead = run_cli("doctor", "--base-url", f"http://127.0.0.1:{closed_port()}", "--json")
    report = json.loads(dead.stdout)
    assert dead.returncode == 1 and report["ok"] is False and report["checks"][0]["verdict"] == "fail"


@pytest.mark.bwrap  # --reward code makes the local sandbox at start
def test_a_refused_value_is_named_in_jsons_words_as_the_user_wrote_it(sim, tmp_path):
    from agentroll.errors import InputError
    from agentroll.inputs import problem_from_row

    with pytest.raises(InputError, match="expected a JSON object, got an array"):
        problem_from_row([1], 2, "in.jsonl")
    with pytest.raises(InputError, match=r"field 'label': must be a string or a number .*, got null"):
        problem_from_row({"prompt": "p", "label": None}, 3, "in.jsonl")
    rows = tmp_path / "code.jsonl"
    rows.write_text('{"prompt": "Write f.", "label": "5"}\n')
    args = ["-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--reward", "code"]
    proc = run_cli("generate", str(rows), *args)
    assert proc.returncode == 3
    assert "got the string '5' (JSON for an integer)" in last_line(proc.stderr)  # not "got int"


def test_a_file_given_for_a_folder_is_said_to_be_a_file_by_every_folder_tool(problems, tmp_path):
    from agentroll import OutputError, read_groups

    said = f"{problems} is a file, not a folder"
    for args in (["stats"], ["validate"], ["inspect"], ["report", "-o", str(tmp_path / "r.html")]):
        proc = run_cli(*args, str(problems))
        assert proc.returncode == 6 and said in (proc.stdout + proc.stderr).decode(), args
        assert "Not a directory" not in (proc.stdout + proc.stderr).decode()
    proc = run_cli("convert", str(problems), "--to", "sft", "-o", str(tmp_path / "sft"))
    assert proc.returncode == 6 and said in last_line(proc.stderr)
    with pytest.raises(OutputError, match="is a file, not a folder"):
        next(read_groups(problems, follow=True, timeout_s=60))  # at once: no run can ever write there


def test_quiet_with_every_row_invalid_names_the_first_rows_fault(sim, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"}\n')
    args = ["-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "--skip-invalid", "-q"]
    proc = run_cli("generate", str(rows), *args)
    assert proc.returncode == 3
    line = last_line(proc.stderr)
    assert "every row read (2) was invalid (the first: " in line and "field 'prompt': missing" in line, line
    assert "warnings above" not in line  # -q printed none
