"""`agentroll doctor`, and generate's refusal to run on a chat template that differs from the server's."""

from __future__ import annotations

import json
import shutil
import urllib.request

from agentroll.process.resources import sim_tokenizer_dir
from agentroll.render.templates import Templates

from .conftest import TOKENIZER, read_records, run_cli


def test_doctor_passes_every_check_against_a_matching_server(sim):
    proc = run_cli("doctor", "--base-url", sim.url + "/v1", "--tokenizer", TOKENIZER)
    out = proc.stdout.decode()  # the verdicts are the command's data
    assert proc.returncode == 0, out
    for name in ("server", "max_model_len", "return_token_ids", "chat template"):
        assert f"ok   {name}:" in out
    assert "3 stage prompts render to the same ids" in out and "4096" in out


def other_template(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(sim_tokenizer_dir(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("<|im_start|>assistant\n", "<|im_start|>bot\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def server_ids(sim, messages) -> list[int]:
    request = urllib.request.Request(
        f"{sim.url}/tokenize",
        method="POST",
        headers={"content-type": "application/json"},
        data=json.dumps({"messages": messages, "add_generation_prompt": True}).encode(),
    )
    return json.loads(urllib.request.urlopen(request, timeout=10).read())["tokens"]


def test_a_different_chat_template_fails_the_doctor_and_generate_renders_on_the_server(sim, problems, tmp_path):
    folder = other_template(tmp_path)
    doctor = run_cli("doctor", "--base-url", sim.url, "--tokenizer", str(folder))
    assert doctor.returncode == 1 and "fail chat template: prompt 1" in doctor.stdout.decode()
    args = [
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        sim.url,
        "--tokenizer",
        str(folder),
        "--reward",
        "exact",
        "--num-parallel",
        "2",
        "--limit",
        "2",
    ]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"does not render prompts as the server does" in proc.stderr and b"/tokenize" in proc.stderr
    first = json.loads(problems.read_text().splitlines()[0])
    solver = next(r for r in read_records(tmp_path / "out") if r["stage"] == "solver" and r["problem_id"] == "p000")
    messages = Templates().messages("solver", first["prompt"])
    assert solver["prompt_token_ids"] == server_ids(sim, messages)  # the server's template, not ours
    assert solver["prompt"].endswith("<|im_start|>assistant\n")
    local = run_cli(*args[:3], str(tmp_path / "local"), *args[4:], "--chat-render", "local")
    assert local.returncode == 0 and b"/tokenize" not in local.stderr
    ours = next(r for r in read_records(tmp_path / "local") if r["stage"] == "solver" and r["problem_id"] == "p000")
    assert ours["prompt"].endswith("<|im_start|>bot\n")


def test_doctor_on_a_dead_server_fails(tmp_path):
    proc = run_cli("doctor", "--base-url", "http://127.0.0.1:9", "--tokenizer", TOKENIZER)
    assert proc.returncode == 1 and "fail server: cannot reach" in proc.stdout.decode()


def test_the_doctor_finds_the_tokenizer_where_generate_does_in_the_servers_model_root(sim):
    proc = run_cli("doctor", "--base-url", sim.url)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out
    assert "ok   chat template: 3 stage prompts render to the same ids" in out


def test_a_tokenize_that_keeps_failing_ends_the_run_instead_of_switching_the_check_off(sim, problems, tmp_path):
    folder = other_template(tmp_path)  # a mismatch the check must not miss
    sim.faults.tokenize_error_rate = 1.0
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        sim.url,
        "--tokenizer",
        str(folder),
        "--num-parallel",
        "1",
        "--reward",
        "exact",
        "--max-retries",
        "1",
    )
    assert proc.returncode == 4, proc.stderr.decode()
    assert b"error: the chat-template check could not ask the server" in proc.stderr
    assert sim.completions == 0 and b"Traceback" not in proc.stderr


def test_a_chat_template_that_rejects_the_stage_prompts_is_one_usage_line(sim, problems, tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(sim_tokenizer_dir(), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('this template needs a system message') }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    base = [
        "generate",
        str(problems),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        sim.url,
        "--tokenizer",
        str(folder),
        "--num-parallel",
        "1",
        "--reward",
        "exact",
    ]
    for extra in ([], ["--chat-render", "local", "--skip-invalid"]):
        proc = run_cli(*base, *extra)
        assert proc.returncode == 2, proc.stderr.decode()
        assert b"the chat template rejects the" in proc.stderr and b"needs a system message" in proc.stderr
        assert b"Traceback" not in proc.stderr and sim.completions == 0
