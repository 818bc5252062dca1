"""`agentroll doctor`, and generate's refusal to run on a chat template that differs from the server's."""

from __future__ import annotations

import json
import shutil

from agentroll.resources import sim_tokenizer_dir

from .conftest import TOKENIZER, run_cli


def test_doctor_passes_every_check_against_a_matching_server(sim):
    proc = run_cli("doctor", "--base-url", sim.url + "/v1", "--tokenizer", TOKENIZER)
    out = proc.stderr.decode()
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


def test_a_different_chat_template_fails_the_doctor_and_stops_generate(sim, problems, tmp_path):
    folder = other_template(tmp_path)
    doctor = run_cli("doctor", "--base-url", sim.url, "--tokenizer", str(folder))
    assert doctor.returncode == 1 and "fail chat template: prompt 1" in doctor.stderr.decode()
    args = ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer",
            str(folder), "--reward", "exact"]
    calls = len(sim.log)  # the doctor's own probe completion
    refused = run_cli(*args)
    assert refused.returncode == 2 and b"does not render prompts as the server does" in refused.stderr
    assert not (tmp_path / "out").exists() and len(sim.log) == calls
    assert run_cli(*args, "--no-template-check").returncode == 0


def test_doctor_on_a_dead_server_fails(tmp_path):
    proc = run_cli("doctor", "--base-url", "http://127.0.0.1:9", "--tokenizer", TOKENIZER)
    assert proc.returncode == 1 and "fail server: cannot reach" in proc.stderr.decode()
