"""Settings as values: one budget for every client of a run, sampling checked once, defaults declared once."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

import agentroll
from agentroll.cli import app
from agentroll.client.settings import Concurrency, Health, Retries, Timeouts
from agentroll.engine.options import GenerateOptions
from agentroll.rewards import RewardSettings
from agentroll.settings.sampling import Sampling
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, write_problems


def test_a_stage_on_its_own_server_gets_as_many_requests_at_once_as_the_budget_allows(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 6)
    main = SimServer(script=Script.from_jsonl(problems))
    judge = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=0.5))
    main.start()
    judge.start()
    try:
        result = CliRunner().invoke(
            app,
            [
                "generate",
                str(problems),
                "-o",
                str(tmp_path / "out"),
                "--base-url",
                main.url,
                "--tokenizer",
                TOKENIZER,
                "--reward",
                "exact",
                "--concurrency",
                "12",
                "--num-parallel",
                "4",
                "--samples-per-prompt",
                "3",
                "--stage",
                f"rewriter.base_url={judge.url}",
                "-q",
            ],
        )
        peak_judge, peak_main = judge.peak_in_flight, main.peak_in_flight
    finally:
        main.stop()
        judge.stop()
    assert result.exit_code == 0, result.output
    assert 9 < peak_judge <= 12  # its own pool once held 9 connections (concurrency 1 + 8 aux)
    assert peak_main <= 12


def test_sampling_is_checked_in_one_place_for_flags_stages_and_calls():
    for (key, value), message in (
        (("top_p", 0), "--top-p must be in (0, 1]"),
        (("temperature", -1), "--temperature"),
        (("top_k", -2), "--top-k must be at least 1"),
        (("max_tokens", 0), "--max-tokens"),
    ):
        with pytest.raises(agentroll.UsageError, match=re.escape(message)):
            Sampling(**{key: value})
        with pytest.raises(agentroll.UsageError, match=re.escape(f"--stage 'solver.{key}={value}': {message}")):
            GenerateOptions(base_url=["http://127.0.0.1:1"], stage=[f"solver.{key}={value}"])
    assert Sampling(top_k=0).top_k == -1
    assert GenerateOptions(base_url=["http://127.0.0.1:1"], stage=["solver.top_k=0"]).stage_settings() == {
        "solver": {"top_k": -1}
    }


def test_the_options_take_their_defaults_from_the_value_objects():
    o = GenerateOptions(base_url=["http://127.0.0.1:1"])
    client = o.client_settings()
    assert client.timeouts == Timeouts() and client.retries == Retries() and client.health == Health()
    assert client.concurrency == Concurrency(fixed=None) and o.sampling() == Sampling()
    rewards = o.reward_settings()
    assert dataclasses.replace(rewards, workers=RewardSettings().workers) == RewardSettings()
    config = o.system_config("m", 2048)
    assert config.sampling == Sampling() and config.max_context_len == 2048


def test_the_client_and_the_command_line_share_one_concurrency_default():
    from agentroll.client.settings import ClientSettings

    assert (
        GenerateOptions(base_url=["http://127.0.0.1:1"]).client_settings().concurrency == ClientSettings().concurrency
    )


@pytest.mark.parametrize(("flag", "value", "message"), [("--top-p", "0", "--top-p must be in (0, 1]")])
def test_doctor_checks_the_sampling_it_is_given_as_generate_does(flag, value, message):
    from .conftest import run_cli

    doctor = run_cli("doctor", "--base-url", "http://127.0.0.1:9", flag, value)
    generate = run_cli("generate", "-", "-o", "-", "--base-url", "http://127.0.0.1:9", flag, value)
    assert (doctor.returncode, generate.returncode) == (2, 2)
    assert message.encode() in doctor.stderr and message.encode() in generate.stderr


def test_doctor_takes_its_sampling_defaults_from_sampling():
    from typer.main import get_command

    doctor = get_command(app).commands["doctor"]  # type: ignore[attr-defined]
    defaults = {p.name: p.default for p in doctor.params if p.name in ("temperature", "top_p", "top_k", "min_p")}
    assert defaults == {k: getattr(Sampling(), k) for k in defaults} and len(defaults) == 4
