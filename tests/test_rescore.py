"""agentroll rescore: another reward over the same records, no model called, the system's own pick and shaping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentroll.folder import Manifest, read_records
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.validate import validate

from .conftest import TOKENIZER, generations, run_cli
from .synthetic import edit

SCORER = "def score(request):\n    return 1.0 if request.content and 'boxed' in request.content else 0.0\n"


def made(sim, problems, tmp_path, *extra: str):
    out = tmp_path / "src"
    proc = made_again(sim, problems, out, *extra)
    assert proc.returncode == 0, proc.stderr.decode()
    return out


def made_again(sim, problems, out, *extra: str):
    return run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        sim.url,
        "--tokenizer",
        TOKENIZER,
        "--reward",
        "exact",
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "2",
        "--seed",
        "4",
        "--correct-reward-weight",
        "2",
        *extra,
    )


@pytest.mark.parametrize("system", ["three-stage", "single", "critique-revise"])
def test_rescore_scores_every_record_again_token_for_token_with_the_systems_own_pick(sim, problems, tmp_path, system):
    src = made(sim, problems, tmp_path, "--system", system)
    calls = len(generations(sim))
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{scorer}:score")
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(generations(sim)) == calls  # no model called
    before, after = list(read_records(src)), list(read_records(out))
    assert len(before) == len(after)
    keep = (
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
        "loss_mask",
        "history_mask",
        "stage",
        "judgment",
        "listed_as",
        "rollout_id",
    )
    assert [{k: r[k] for k in keep} for r in before] == [{k: r[k] for k in keep} for r in after]
    by_rollout: dict[str, list[dict]] = {}
    for r in after:
        by_rollout.setdefault(r["rollout_id"], []).append(r)
        if r["stage"] in ("solver", "rewriter", "reviser"):
            assert r["raw_reward"] == (1.0 if r["content"] and "boxed" in r["content"] else 0.0)
    for rows in by_rollout.values():
        if system == "three-stage":
            selector = next((r for r in rows if r["stage"] == "selector"), None)
            listed = {r["listed_as"]: r for r in rows if r["stage"] == "rewriter" and r["listed_as"]}
            if selector is not None:
                picked = listed.get(selector["judgment"])
                assert selector["raw_reward"] == (picked["raw_reward"] if picked else 0.0)
                outcome = selector["raw_reward"]
            else:
                outcome = 0.0
        elif system == "critique-revise":  # the reviser's, the solver's when no revision was made
            outcome = rows[2]["raw_reward"] if len(rows) == 3 else rows[0]["raw_reward"]
            if len(rows) == 3:
                assert rows[1]["raw_reward"] == rows[2]["raw_reward"]
        else:
            outcome = rows[0]["raw_reward"]
        for r in rows:
            assert r["final_reward"] == outcome
            assert r["reward"] == r["raw_reward"] * (2.0 if outcome == 1 else 1.0)
    manifest = Manifest.load(out)
    assert manifest.complete and manifest.settings["reward"] == f"{scorer}:score"
    assert manifest.settings["derived_from"]["folder_id"] == Manifest.load(src).folder_id
    assert validate(out).ok
    report = manifest.last_run["stats"]["report"]
    assert report["system_accuracy"] == pytest.approx(
        sum(rows[0]["final_reward"] == 1 for rows in by_rollout.values()) / len(by_rollout)
    )


def test_rescore_filters_uniform_groups_and_resumes(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)
    zero = tmp_path / "zero.py"
    zero.write_text("def score(request):\n    return 0.0\n")
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{zero}:score", "--filter-uniform-groups")
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = Manifest.load(out)
    assert manifest.groups == 0 and manifest.filtered_groups == Manifest.load(src).groups  # every group uniform
    assert b"system accuracy 0.000" in proc.stderr
    again = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{zero}:score", "--filter-uniform-groups")
    assert again.returncode == 0 and b"8 done before" in again.stderr
    assert b"system accuracy -" in again.stderr  # nothing rescored by this run: no figure, not "None"
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_rescore_refuses_a_source_that_is_not_an_output_folder(tmp_path):
    (tmp_path / "x").mkdir()
    proc = run_cli("rescore", str(tmp_path / "x"), "-o", str(tmp_path / "y"), "--reward", "exact")
    assert proc.returncode == 6 and b"not an agentroll output folder" in proc.stderr


SEEN = (
    "import json\n"
    "def seen(request):\n"
    "    what = [request.problem, request.prompt, request.label, request.metadata, request.problem_id]\n"
    "    return {'reward': float(bool(request.content)), 'info': json.dumps(what)}\n"
)


def test_rescore_gives_the_reward_the_inputs_the_run_gave_it(tmp_path):
    """The statement (a chat row's last user message) and the row's prompt as given, not the rendered prompt:
    a reward model sent the rendered prompt would judge another text."""
    rows = [
        {
            "id": "chat",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 10 plus 7?"}],
            "label": "17",
            "topic": "chat",
        },
        {"id": "text", "prompt": "What is 11 plus 10?", "label": "21", "topic": "text"},
    ]
    problems = tmp_path / "rows.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scorer = tmp_path / "seen.py"
    scorer.write_text(SEEN)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        src = made(server, problems, tmp_path, "--reward", f"{scorer}:seen", "--system", "single")
    finally:
        server.stop()
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{scorer}:seen")
    assert proc.returncode == 0, proc.stderr.decode()
    before, after = list(read_records(src)), list(read_records(out))
    by_id = {r["id"]: r for r in rows}
    for record in before:
        row = by_id[record["problem_id"]]
        assert record["problem"] == row["prompt"]  # the row's prompt exactly as given, on every record
        statement = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]
        assert json.loads(record["reward_info"]) == [
            statement,
            row["prompt"],
            row["label"],
            {"topic": row["topic"]},
            row["id"],
        ]
    assert [r["reward_info"] for r in after] == [r["reward_info"] for r in before]
    assert b"rendered" not in proc.stderr  # a folder that has the row's prompt: no warning
    assert validate(out).ok and validate(src).ok


def test_rescoring_a_folder_made_before_problem_was_stored_says_once_what_the_reward_sees(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)

    def schema_5(records: list[dict]) -> None:
        for r in records:
            del r["problem"]
            r["schema_version"] = 5

    edit(src, schema_5)
    manifest = json.loads((src / "manifest.json").read_text())
    (src / "manifest.json").write_text(json.dumps({**manifest, "schema_version": 5}))
    resumed = made_again(sim, problems, src)
    assert resumed.returncode == 6
    assert f"{src} holds rollouts of schema 5 (this agentroll writes 6); use another --output, or --overwrite" in (
        resumed.stderr.decode()
    )
    scorer = tmp_path / "seen.py"
    scorer.write_text(SEEN)
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{scorer}:seen")
    assert proc.returncode == 0, proc.stderr.decode()
    warned = [line for line in proc.stderr.decode().splitlines() if "rendered" in line]
    assert len(warned) == 1 and "problem" in warned[0], proc.stderr.decode()
    for record in read_records(out):
        if record["stage"] == "solver":
            assert json.loads(record["reward_info"])[:2] == [record["prompt"], record["prompt"]]


def test_rescore_overwrite_starts_the_new_folder_over_as_its_refusal_says(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)
    zero, one = tmp_path / "zero.py", tmp_path / "one.py"
    zero.write_text("def score(request):\n    return 0.0\n")
    one.write_text("def score(request):\n    return 1.0\n")
    out = tmp_path / "new"
    assert run_cli("rescore", str(src), "-o", str(out), "--reward", f"{zero}:score").returncode == 0
    refused = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{one}:score")
    assert refused.returncode == 6 and b"--overwrite to start over" in refused.stderr
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", f"{one}:score", "--overwrite")
    assert proc.returncode == 0, proc.stderr.decode()
    assert {r["raw_reward"] for r in read_records(out) if r["stage"] != "selector"} == {1.0}
    assert Manifest.load(out).settings["reward"] == f"{one}:score"


class Fusion(ThreadingHTTPServer):
    """A SandboxFusion /run_code on loopback that prints 4 whatever it is given, and keeps each request."""

    def __init__(self) -> None:
        bodies: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                run = {"status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "4\n", "stderr": ""}
                data = json.dumps({"status": "Success", "message": "", "run_result": run, "files": {}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies = bodies
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_rescore_takes_generates_reward_options_so_code_can_be_scored_in_a_remote_sandbox(tmp_path):
    double = {"inputs": ["2\n", "5\n", "-1\n"], "outputs": ["4\n", "10\n", "-2\n"]}
    problems = tmp_path / "code.jsonl"
    problems.write_text(json.dumps({"id": "double", "prompt": "Read n and print 2n.", "label": double}) + "\n")
    zero = tmp_path / "zero.py"
    zero.write_text("def score(request):\n    return 0.0\n")
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        src = made(server, problems, tmp_path, "--reward", f"{zero}:score", "--system", "single")
    finally:
        server.stop()
    fusion = Fusion()
    try:
        out = tmp_path / "new"
        proc = run_cli(
            "rescore",
            str(src),
            "-o",
            str(out),
            "--reward",
            "code",
            "--sandbox-url",
            fusion.url,
            "--sandbox-memory-mb",
            "300",
            "--code-test-timeout",
            "3",
            "--code-partial-credit",
        )
    finally:
        fusion.shutdown()
        fusion.server_close()
    assert proc.returncode == 0, proc.stderr.decode()
    programs = [r for r in read_records(out) if r["content"] and "```python" in r["content"]]
    assert programs and fusion.bodies
    assert {(b["run_timeout"], b["memory_limit_MB"]) for b in fusion.bodies} == {(3.0, 300)}
    assert [r["raw_reward"] for r in programs] == pytest.approx([1 / 3] * len(programs))
    settings = Manifest.load(out).settings
    assert settings["reward"] == "code"
    assert settings["code_reward"] == {"code_test_timeout": 3.0, "code_partial_credit": True, "sandbox_memory_mb": 300}


def test_rescore_refuses_to_write_into_its_own_source_however_it_is_named(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    (tmp_path / "link").symlink_to(src)
    for target in (src, src / ".", tmp_path / "link"):
        for extra in ((), ("--overwrite",)):
            proc = run_cli("rescore", str(src), "-o", str(target), "--reward", "exact", *extra)
            assert proc.returncode == 2, proc.stderr.decode()
            assert b"rescoring writes a new folder, not into its source" in proc.stderr
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before  # not a byte touched


BLOCKING = """import fcntl, os, pathlib, threading
def score(request):
    with open({calls!r}, "a") as f:  # counted across the worker processes the function runs in
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("x")
        f.flush()
        n = os.path.getsize({calls!r})
    if n == {at} and pathlib.Path({block!r}).exists():
        pathlib.Path({marker!r}).write_text("blocked")
        threading.Event().wait()  # until the test kills the process
    return float(len(request.response) % 3 == 0)
"""


def test_rescore_killed_mid_run_resumes_to_the_records_of_a_clean_run(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)
    block, marker = tmp_path / "block", tmp_path / "blocked"
    scorer = tmp_path / "scorer.py"
    calls = str(tmp_path / "calls")
    scorer.write_text(BLOCKING.format(calls=calls, at=29, block=str(block), marker=str(marker)))  # 8 a group: the 4th
    block.touch()
    out, clean = tmp_path / "new", tmp_path / "clean"
    args = ["rescore", str(src), "-o", str(out), "--reward", f"{scorer}:score", "--reward-timeout", "600"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_"))}
    run = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a file the scorer writes: the condition, not a guess at timing
        assert marker.exists(), run.stderr.read().decode() if run.stderr else ""
        run.send_signal(signal.SIGKILL)
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if run.stderr is not None:
            run.stderr.close()
    assert not Manifest.load(out).complete
    block.unlink()
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr.decode()
    assert b"(0 filtered, 3 done before)" in again.stderr  # the 3 groups committed before the kill are kept
    assert run_cli("rescore", str(src), "-o", str(clean), "--reward", f"{scorer}:score").returncode == 0
    assert list(read_records(out)) == list(read_records(clean))
    assert Manifest.load(out).complete and validate(out).ok


def test_rescore_refuses_a_reward_that_cannot_score_the_folders_labels_before_writing(sim, problems, tmp_path):
    src = made(sim, problems, tmp_path)  # plain answers as labels: a math folder
    out = tmp_path / "new"
    proc = run_cli("rescore", str(src), "-o", str(out), "--reward", "code")
    stderr = proc.stderr.decode()
    assert proc.returncode == 3, stderr  # a bad row, as generate calls it: never a folder of zero rewards
    (line,) = stderr.strip().splitlines()
    assert str(src) in line and "field 'label'" in line and "for the code reward" in line and "--reward code" in line
    assert not out.exists()  # checked before the new folder is touched
