"""Issue 26, the last findings: an audit that compares nothing does not pass, a run template other than the
model's and prompts that cannot be re-rendered fail unless accepted, shards edited after generation are
noticed, and the smaller points (the text's skipped column, one `--batch-tokens` default, the float32 preset as
documented, pre-schema-2 sampling, the bar's clock)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentroll.audit.options import PRESETS, AuditOptions
from agentroll.cli import app

from . import synthetic
from .conftest import TOKENIZER
from .test_audit_cli import SHAPED, audit, processed_folder, raw_folder, tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

__all__ = ["processed_folder", "raw_folder", "tiny"]  # the fixtures
ROOT = Path(__file__).resolve().parent.parent


def copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    return dest


def settings(folder: Path, **changes: Any) -> Path:
    manifest = json.loads((folder / "manifest.json").read_text())
    for key, value in changes.items():
        manifest[key] = value(manifest[key]) if callable(value) else value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run(folder: Path, tiny: Path, *flags: str) -> Any:
    return CliRunner().invoke(app, ["audit", str(folder), "--model", str(tiny), "--device", "cpu", *flags])


# ---------------------------------------------------------------------------- 7. nothing compared is no pass


def greedy(records: list[dict[str, Any]]) -> None:
    for r in records:
        r["sampling"]["temperature"] = 0.0  # with top-k 40, top-p, min-p: not comparable in processed mode


def penalised(folder: Path) -> None:
    settings(folder, settings=lambda s: {**s, "sampling": {**s["sampling"], "presence_penalty": 0.5}})


def unmasked(records: list[dict[str, Any]]) -> None:
    for r in records:
        r["loss_mask"] = [0] * len(r["loss_mask"])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda f: synthetic.edit(f, greedy), "greedy with top-k/top-p/min-p"),
        (penalised, "penalties"),
        (lambda f: synthetic.edit(f, unmasked), "outside the loss mask"),
    ],
)
def test_an_audit_that_compares_no_token_fails_saying_why(processed_folder, tiny, tmp_path, damage, why):
    path = copy(processed_folder, tmp_path / "copy")
    damage(path)
    result = run(path, tiny)
    assert result.exit_code == 2, result.output
    line = " ".join(result.stderr.split())
    assert "nothing could be compared" in line and why in line and len(result.stderr.strip().splitlines()) == 1


def test_an_audit_that_skips_most_tokens_warns_loudly(processed_folder, tiny, tmp_path):
    path = copy(processed_folder, tmp_path / "copy")

    def mostly_unmasked(records: list[dict[str, Any]]) -> None:
        unmasked(records[1:])

    synthetic.edit(path, mostly_unmasked)
    code, report = audit(path, tiny)
    assert code == 0 and report["overall"]["tokens"] > 0
    warned = [w for w in report["warnings"] if "not compared" in w]
    assert warned and "outside the loss mask" in warned[0]
    result = run(path, tiny, "--json")  # machines read stdout; a person still sees it on stderr
    assert "not compared" in result.stderr


# --------------------------------------------------------------------------- 8. a template other than the model's


def default_system_tokenizer(dest: Path) -> Path:
    """The simulator's tokenizer whose template adds "You are a helpful assistant." when a conversation has no
    system message (as Qwen2.5's does)."""
    shutil.copytree(TOKENIZER, dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "{% endif %}" + config["chat_template"]
    )
    config_path.write_text(json.dumps(config))
    return dest


def true_logprobs(folder: Path, model_path: Path) -> None:
    """Every record's response_logprobs recomputed by the model (raw), as a server of that model would record."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path).eval()

    def fill(records: list[dict[str, Any]]) -> None:
        for r in records:
            ids = r["prompt_token_ids"] + r["response_token_ids"]
            with torch.inference_mode():
                logits = model(torch.tensor([ids])).logits[0].double()
            logprobs = torch.log_softmax(logits, -1)
            start = len(r["prompt_token_ids"])
            r["response_logprobs"] = [float(logprobs[start - 1 + j, t]) for j, t in enumerate(r["response_token_ids"])]

    synthetic.edit(folder, fill)


@pytest.fixture(scope="module")
def other_template(tiny, tmp_path_factory) -> Path:
    """The reviewer's repro: generated with `--tokenizer tok2 --chat-render local --system single` (tok2 injects a
    default system prompt), true logprobs filled in; the audit model's template does not inject it."""
    from agentroll.sim.script import Script
    from agentroll.sim.server import SimServer

    from .conftest import run_cli, write_problems

    tmp = tmp_path_factory.mktemp("template")
    tok2 = default_system_tokenizer(tmp / "tok2")
    problems = write_problems(tmp / "problems.jsonl", 2)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        out = tmp / "out"
        result = run_cli(
            *("generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", str(tok2)),
            *("--chat-render", "local", "--system", "single", "--samples-per-prompt", "2", "--reward", "exact"),
            *("--max-tokens", "40", "--seed", "1"),
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    finally:
        server.stop()
    first = synthetic.records_of(out)[0]
    assert "You are a helpful assistant." in first["prompt"]
    true_logprobs(out, tiny)
    return out


def test_a_run_template_other_than_the_models_fails_unless_accepted(other_template, tiny):
    code, report = audit(other_template, tiny, "--stages", "solver")
    assert code == 10 and not report["ok"]
    assert report["overall"]["records_failed"] == 0  # every logprob agrees: the template alone fails it
    kinds = [f["kind"] for f in report["folder_faults"]]
    assert kinds == ["template"] and "chat_template_sha256" in report["folder_faults"][0]["message"]
    code, report = audit(other_template, tiny, "--stages", "solver", "--accept-chat-template")
    assert code == 0 and report["ok"] and any("chat_template_sha256" in w for w in report["warnings"])
    result = run(other_template, tiny, "--stages", "solver")
    assert result.exit_code == 10 and "chat_template_sha256" in result.stdout


def test_prompts_that_cannot_be_re_rendered_fail_unless_accepted(raw_folder, tiny, tmp_path):
    path = copy(raw_folder, tmp_path / "copy")

    def several_messages(records: list[dict[str, Any]]) -> None:
        records[0]["prompt"] = (
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n" + (records[0]["prompt"])
        )

    synthetic.edit(path, several_messages)
    code, report = audit(path, tiny)
    assert code == 10 and report["overall"]["records_failed"] == 0
    assert [f["kind"] for f in report["folder_faults"]] == ["unrendered"]
    assert "1 first-turn prompt" in report["folder_faults"][0]["message"]
    code, report = audit(path, tiny, "--accept-unrendered")
    assert code == 0 and any("re-rendered" in w for w in report["warnings"])
    code, report = audit(path, tiny, "--no-template-check")
    assert code == 0


# ------------------------------------------------------------------------------ 9. shards edited after the run


def test_a_shard_edited_after_generation_is_a_warning(raw_folder, tiny, tmp_path):
    """An edit that keeps the shard's size passes the readers' checks (size, whole groups, counts): the audit
    warns on its sha256. One that changes the size is refused by the readers, as by every folder tool."""
    path = copy(raw_folder, tmp_path / "copy")
    manifest = json.loads((path / "manifest.json").read_text())
    shard = path / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    at = data.index(b'"latency_s":') + len(b'"latency_s":')  # an edit that changes no audited figure
    data[at] = ord("1") if data[at] != ord("1") else ord("2")
    shard.write_bytes(bytes(data))
    assert hashlib.sha256(shard.read_bytes()).hexdigest() != manifest["shards"][0]["sha256"]
    code, report = audit(path, tiny)
    assert code == 0
    edited = [w for w in report["warnings"] if shard.name in w]
    assert edited and "sha256" in edited[0] and "agentroll validate" in edited[0]
    _, clean = audit(raw_folder, tiny)
    assert not any("sha256" in w for w in clean["warnings"])
    shard.write_bytes(bytes(data) + b"\n")  # one byte more than the manifest says
    result = run(path, tiny)
    assert result.exit_code == 6 and shard.name in result.output


# ------------------------------------------------------------------------------------------------ 10. minor


def test_the_text_table_skips_only_skipped_tokens_and_names_why(processed_folder, tiny, tmp_path):
    result = run(processed_folder, tiny)
    assert result.exit_code == 0
    report = json.loads(run(processed_folder, tiny, "--json").stdout)
    skipped = report["overall"]["tokens_skipped"]
    assert skipped  # top-k 40 on a flat model: some ambiguous cuts
    text = " ".join(result.stdout.split())
    for reason, n in skipped.items():
        assert f"{n} {reason}" in text
    path = copy(processed_folder, tmp_path / "copy")

    def outside(records: list[dict[str, Any]]) -> None:  # a token the filters cannot keep: a failure, not a skip
        r = records[0]
        r["response_token_ids"][0] = 1000

    synthetic.edit(path, outside)
    result = run(path, tiny)
    report = json.loads(run(path, tiny, "--json").stdout)
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ all"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert report["overall"]["tokens_outside"] >= 1
    assert cells[-2] == str(sum(report["overall"]["tokens_skipped"].values()))
    assert cells[-1] == str(report["overall"]["tokens_outside"])


def test_batch_tokens_has_one_default():
    import inspect

    from agentroll.cli.audit import audit_command

    cli_default = inspect.signature(audit_command).parameters["batch_tokens"].default
    api_default = AuditOptions(model="m").batch_tokens
    doc = (ROOT / "docs" / "audit.md").read_text()
    assert cli_default == api_default
    assert f"| `--batch-tokens` | {api_default} |" in doc


def test_the_float32_preset_fails_one_token_off_by_more_than_its_threshold_as_documented():
    from agentroll.audit.report import Collector

    preset = PRESETS["float32"]
    collector = Collector(preset, 5)
    record = synthetic.call("p", "r", 0, 1, "solver", [1, 2], [3] * 100)
    off = [0.0] * 100
    off[7] = 2 * preset.threshold  # one token of a hundred, far below max_abs
    assert collector.add(
        record, [], [x + y for x, y in zip([-1.0] * 100, off, strict=True)], [-1.0] * 100, [0] * 100
    ).reasons
    doc = " ".join((ROOT / "docs" / "audit.md").read_text().split())
    assert "one token off by 0.01" not in doc
    assert "a single token off by more than 1e-3" in doc


def test_a_folder_without_per_record_sampling_uses_the_runs_settings_and_says_so(processed_folder, tiny, tmp_path):
    """Schema 2 folders have no `sampling` on records: the run's `settings.sampling` (temperature 0.7, top-k...)
    is what they were sampled with, not temperature 1."""
    path = copy(processed_folder, tmp_path / "copy")

    def old(records: list[dict[str, Any]]) -> None:
        for r in records:
            del r["sampling"]

    synthetic.edit(path, old)
    code, report = audit(path, tiny)
    assert code == 0, report["failed"]
    assert any("settings.sampling" in w for w in report["warnings"])


def test_the_bars_clock_starts_with_the_first_conversation_not_the_model_load():
    import io

    from rich.console import Console

    from agentroll.cli.audit import Bar

    bar = Bar(Console(file=io.StringIO(), force_terminal=True))
    assert bar.bar.tasks[0].start_time is None  # made before the model loads
    bar.start(3)
    assert bar.bar.tasks[0].start_time is not None
    bar.stop()


def test_processed_folders_still_pass_with_all_of_this(processed_folder, tiny):
    code, report = audit(processed_folder, tiny)
    assert code == 0 and report["folder_faults"] == [] and report["ok"]
    assert SHAPED["top_k"] == 40
