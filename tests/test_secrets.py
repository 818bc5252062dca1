"""The API key: a key on the command line is visible to every process of the machine (`ps`, /proc), so
`--api-key-file` reads it from a file, `$OPENAI_API_KEY` is read as before, and `--api-key` works but warns."""

from __future__ import annotations

import uuid

import pytest

from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_process, write_problems

WARNING = "--api-key on the command line is visible to every process on this machine"


@pytest.fixture
def keyed(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    key = f"sk-{uuid.uuid4().hex}"
    server = SimServer(script=Script.from_jsonl(problems), api_key=key, record=False)
    server.start()
    yield problems, key, server.url
    server.stop()


def generate(problems, out, url, *args, env=None):
    extra = ["--system", "single", "--samples-per-prompt", "2", "--tokenizer", TOKENIZER]
    return run_process("generate", str(problems), "-o", str(out), "--base-url", url, *extra, *args, env=env)


def test_a_key_read_from_a_file_reaches_the_server_and_is_not_warned_about(keyed, tmp_path):
    problems, key, url = keyed
    secret = tmp_path / "key.txt"
    secret.write_text(key + "\n")
    done = generate(problems, tmp_path / "out", url, "--api-key-file", str(secret))
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert len(read_records(tmp_path / "out")) == 4 and WARNING not in done.stderr.decode()


def test_a_key_on_the_command_line_works_and_is_warned_about_once(keyed, tmp_path):
    problems, key, url = keyed
    done = generate(problems, tmp_path / "out", url, "--api-key", key)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stderr.decode().count(WARNING) == 1
    assert key not in done.stderr.decode()


def test_a_key_in_the_environment_is_read_as_before_without_a_warning(keyed, tmp_path):
    problems, key, url = keyed
    done = generate(problems, tmp_path / "out", url, env={"OPENAI_API_KEY": key})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert WARNING not in done.stderr.decode()


def test_a_missing_or_doubly_given_key_file_is_a_one_line_error(keyed, tmp_path):
    problems, key, url = keyed
    missing = generate(problems, tmp_path / "a", url, "--api-key-file", str(tmp_path / "nope.txt"))
    said = missing.stderr.decode().strip().splitlines()
    assert missing.returncode == 2 and len(said) == 1 and "nope.txt" in said[0], said
    (tmp_path / "key.txt").write_text(key)
    both = generate(problems, tmp_path / "b", url, "--api-key", key, "--api-key-file", str(tmp_path / "key.txt"))
    said = both.stderr.decode().strip().splitlines()
    assert both.returncode == 2 and len(said) == 1 and "--api-key-file" in said[0], said


TEACHER_WARNING = "--teacher-api-key on the command line is visible to every process on this machine"


@pytest.fixture
def keyed_teacher(tmp_path):
    """An open student and a teacher (the same simulated model) that answers only with its key."""
    problems = write_problems(tmp_path / "problems.jsonl", 2)
    key = f"sk-{uuid.uuid4().hex}"
    student = SimServer(script=Script.from_jsonl(problems), record=False)
    teacher = SimServer(script=Script.from_jsonl(problems), api_key=key, record=False, max_model_len=8192)
    student.start()
    teacher.start()
    yield problems, key, student.url, teacher.url
    teacher.stop()
    student.stop()


def test_the_teachers_key_is_read_from_a_file_by_generate_and_distill_and_warned_about_on_the_command_line(
    keyed_teacher, tmp_path
):
    problems, key, url, teacher = keyed_teacher
    secret = tmp_path / "teacher-key.txt"
    secret.write_text(key + "\n")
    taught = generate(problems, tmp_path / "taught", url, "--teacher", teacher, "--teacher-api-key-file", str(secret))
    assert taught.returncode == 0, taught.stderr.decode()[-2000:]
    assert TEACHER_WARNING not in taught.stderr.decode()
    assert all(r["teacher_logprobs"] for r in read_records(tmp_path / "taught"))
    typed = generate(problems, tmp_path / "typed", url, "--teacher", teacher, "--teacher-api-key", key)
    assert typed.returncode == 0 and typed.stderr.decode().count(TEACHER_WARNING) == 1, typed.stderr.decode()
    assert key not in typed.stderr.decode()
    plain = generate(problems, tmp_path / "plain", url)
    assert plain.returncode == 0, plain.stderr.decode()[-2000:]
    distilled = run_process(
        "distill", str(tmp_path / "plain"), "-o", str(tmp_path / "new"), "--teacher", teacher,
        "--teacher-api-key-file", str(secret),
    )  # fmt: skip
    assert distilled.returncode == 0 and TEACHER_WARNING not in distilled.stderr.decode(), distilled.stderr.decode()
    new = read_records(tmp_path / "new")
    assert new and all(len(r["teacher_logprobs"]) == len(r["response_token_ids"]) for r in new)
    unkeyed = generate(problems, tmp_path / "unkeyed", url, "--teacher", teacher)
    assert unkeyed.returncode == 4, unkeyed.stderr.decode()[-2000:]  # the teacher refuses a call without its key


def test_a_missing_or_doubly_given_teacher_key_file_is_a_one_line_error(keyed_teacher, tmp_path):
    problems, key, url, teacher = keyed_teacher
    for command in ("generate", "distill"):
        missing = ["--teacher", teacher, "--teacher-api-key-file", str(tmp_path / "nope.txt")]
        (tmp_path / "key.txt").write_text(key)
        both = ["--teacher", teacher, "--teacher-api-key", key, "--teacher-api-key-file", str(tmp_path / "key.txt")]
        for args, named in ((missing, "nope.txt"), (both, "--teacher-api-key-file")):
            if command == "generate":
                done = generate(problems, tmp_path / "a", url, *args)
            else:
                done = run_process("distill", str(tmp_path), "-o", str(tmp_path / "b"), *args)
            said = done.stderr.decode().strip().splitlines()
            assert done.returncode == 2 and len(said) == 1 and named in said[0], (command, said)
            assert key not in said[0]
