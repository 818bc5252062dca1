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
