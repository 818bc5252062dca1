"""`agentroll audit` end to end, in process: a tiny random Llama built here samples the records itself (its own
logprobs, raw or processed, computed one step at a time as an engine does), so auditing them with that model
passes; a copy with a few logprobs shifted fails and names exactly those records."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentroll.cli import app
from agentroll.render.chat import ChatEncoder

from . import synthetic
from .conftest import TOKENIZER
from .test_audit import oracle

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STOP_IDS = frozenset(range(300, 330))  # stop_token_ids of the runs here: the random model hits them now and then


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A random-weight Llama over the simulator's tokenizer (the shape the real-vLLM tier serves)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    out = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class Engine:
    """Samples from the model a token at a time, recording each token's logprob the way a vLLM server does."""

    def __init__(self, path: Path, mode: str, seed: int = 0) -> None:
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.encoder = ChatEncoder(self.tokenizer)
        self.mode, self.rng = mode, random.Random(seed)

    @torch.inference_mode()
    def sample(self, prompt: list[int], sampling: dict, max_tokens: int) -> tuple[list[int], list[float], str, object]:
        ids, out, logprobs = list(prompt), [], []
        t, k, p, m = sampling["temperature"], sampling["top_k"], sampling["top_p"], sampling["min_p"]
        for _ in range(max_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1].double().tolist()
            kept = oracle(logits, t, k, p, m)
            token = self.rng.choices(list(kept), weights=[math.exp(v) for v in kept.values()])[0]
            top = max(logits)
            raw = logits[token] - top - math.log(sum(math.exp(x - top) for x in logits))
            out.append(token)
            logprobs.append(raw if self.mode == "raw_logprobs" else kept[token])
            ids.append(token)
            if token == self.tokenizer.eos_token_id:
                return out, logprobs, "stop", None
            if token in STOP_IDS:
                return out, logprobs, "stop", token
        return out, logprobs, "length", None


def record(
    engine: Engine,
    pid: str,
    k: int,
    stage: str,
    worker: int,
    messages: list[dict] | None,
    sampling: dict,
    max_tokens: int,
    earlier: dict | None = None,
    position: int | None = None,
) -> dict:
    if earlier is None:
        assert messages is not None
        text, prompt = engine.encoder.encode(messages)
    else:  # the next turn, by ids: earlier prompt + response + the template's separator and a user message
        injected = engine.tokenizer.encode(
            "\n<|im_start|>user\nCheck it.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )
        prompt = earlier["prompt_token_ids"] + earlier["response_token_ids"] + injected
        text = engine.tokenizer.decode(prompt)
    ids, logprobs, finish, stop = engine.sample(prompt, sampling, max_tokens)
    r = synthetic.call(pid, f"{pid}-r{k}", k, 2, stage, prompt, ids, worker=worker)
    r.update(
        prompt=text,
        response=engine.tokenizer.decode(ids),
        response_logprobs=logprobs,
        model="tiny",
        finish_reason=finish,
        stop_reason=stop,
        status="completed" if finish == "stop" else "truncated",
        sampling={**sampling, "seed": None, "max_tokens": max_tokens},
    )
    if earlier is not None:
        before = earlier["history_mask"] or [0] * len(earlier["prompt_token_ids"])
        before_lp = earlier["history_logprobs"] or [0.0] * len(earlier["prompt_token_ids"])
        pad = len(prompt) - len(before) - len(earlier["response_token_ids"])
        r.update(
            turn=earlier["turn"] + 1,
            continues=position,
            history_mask=before + earlier["loss_mask"] + [0] * pad,
            history_logprobs=before_lp + earlier["response_logprobs"] + [0.0] * pad,
        )
    return r


def folder(path: Path, tiny: Path, mode: str, sampling: dict, system: str = "three-stage", problems: int = 3) -> Path:
    """A folder of `problems` problems x 2 executions sampled from the tiny model: three-stage (2 solvers, 1
    rewriter, a selector per execution) or critique-revise (one conversation of three turns)."""
    engine = Engine(tiny, mode)
    groups = []
    for i in range(problems):
        pid = f"q{i}"
        executions = []
        for k in range(2):
            user = [{"role": "user", "content": f"What is {i} plus {k + 3}?"}]
            if system == "three-stage":
                records = [record(engine, pid, k, "solver", w, user, sampling, 10) for w in range(2)]
                records.append(
                    record(
                        engine, pid, k, "rewriter", 0, [{"role": "system", "content": "Rewrite."}, *user], sampling, 8
                    )
                )
                records.append(
                    record(engine, pid, k, "selector", 0, [{"role": "user", "content": f"Pick {i}."}], sampling, 6)
                )
            else:
                solver = record(engine, pid, k, "solver", 0, user, sampling, 8)
                critic = record(engine, pid, k, "critic", 0, None, sampling, 6, earlier=solver, position=0)
                reviser = record(engine, pid, k, "reviser", 0, None, sampling, 6, earlier=critic, position=1)
                records = [solver, critic, reviser]
            executions.append(synthetic.execution(records, final=0.0))
        groups.append(synthetic.group(executions))
    stages = {"three-stage": ["solver", "rewriter", "selector"], "critique-revise": ["solver", "critic", "reviser"]}
    out = synthetic.write(path, [groups], {"name": system, "stages": stages[system], "options": {}})
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["settings"].update(
        model="tiny",
        sampling={**sampling, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0},
        max_context_len=512,
        chat_template_kwargs={},
    )
    manifest["servers"] = [{"api": "generate", "logprobs_mode": mode}]
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


PLAIN = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
SHAPED = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.02}


def audit(folder: Path, tiny: Path, *flags: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["audit", str(folder), "--model", str(tiny), "--json", "--device", "cpu", *flags])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def raw_folder(tiny, tmp_path_factory) -> Path:
    return folder(tmp_path_factory.mktemp("raw") / "out", tiny, "raw_logprobs", SHAPED)


@pytest.fixture(scope="module")
def processed_folder(tiny, tmp_path_factory) -> Path:
    return folder(tmp_path_factory.mktemp("processed") / "out", tiny, "processed_logprobs", SHAPED)


def shift(path: Path, picks: list[tuple[str, int, str, int]], by: float = 0.5) -> list[tuple]:
    """Shift one logprob of each picked record (problem, execution, stage, worker); their names as reported."""
    named = []

    def change(records):
        for pid, k, stage, worker in picks:
            r = next(
                r
                for r in records
                if (r["problem_id"], r["sample_index"], r["stage"], r["worker"]) == (pid, k, stage, worker)
            )
            r["response_logprobs"][len(r["response_logprobs"]) // 2] += by
            named.append((r["problem_id"], r["rollout_id"], r["stage"], r["turn"]))

    synthetic.edit(path, change)
    return named


def names(report: dict) -> set[tuple]:
    return {(r["problem_id"], r["rollout_id"], r["stage"], r["turn"]) for r in report["failed"]}


@pytest.mark.parametrize("fixture", ["raw_folder", "processed_folder"])
def test_records_of_the_models_own_logprobs_pass_and_shifted_ones_fail_by_name(fixture, tiny, request, tmp_path):
    path = request.getfixturevalue(fixture)
    code, report = audit(path, tiny)
    assert code == 0, report["failed"]
    assert report["ok"] and report["overall"]["records"] == 24 and report["overall"]["records_failed"] == 0
    assert report["overall"]["max_abs"] < 1e-4 and report["overall"]["kl_k3"] < 1e-8
    assert list(report["stages"]) == ["solver", "rewriter", "selector"]
    assert report["templates"]["solver"] == {"match": 12, "mismatch": 0, "unrecoverable": 0}
    assert report["faults"] == {}
    # a copy with a few logprobs shifted by 0.5
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in path.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    named = shift(damaged, [("q0", 1, "solver", 1), ("q2", 0, "selector", 0)])
    code, report = audit(damaged, tiny)
    assert code == 10 and not report["ok"]
    assert names(report) == set(named) and report["overall"]["records_failed"] == 2
    assert all(r["max_abs"] == pytest.approx(0.5, abs=1e-3) for r in report["failed"])
    assert report["overall"]["max_abs"] == pytest.approx(0.5, abs=1e-3)


def test_the_logprobs_mode_decides_what_is_compared(raw_folder, processed_folder, tiny):
    """Sampled at temperature 0.7 with top-k, top-p and min-p: raw values are not processed ones, and the other way
    round; told the wrong mode, the audit fails every record."""
    code, report = audit(raw_folder, tiny, "--logprobs-mode", "processed_logprobs")
    assert (
        code == 10
        and report["overall"]["records_failed"] == 24
        and report["logprobs_mode_source"] == ("--logprobs-mode")
    )
    code, report = audit(processed_folder, tiny, "--logprobs-mode", "raw_logprobs")
    assert code == 10 and report["overall"]["records_failed"] == 24


def test_a_multi_turn_conversation_is_audited_whole_turn_by_turn(tiny, tmp_path):
    path = folder(tmp_path / "cr", tiny, "processed_logprobs", SHAPED, system="critique-revise", problems=2)
    code, report = audit(path, tiny)
    assert code == 0, report["failed"]
    assert report["units"] == {"total": 4, "audited": 4}  # one forward pass per conversation
    assert {s: f["records"] for s, f in report["stages"].items()} == {"solver": 4, "critic": 4, "reviser": 4}
    assert report["templates"] == {"solver": {"match": 4, "mismatch": 0, "unrecoverable": 0}}  # first turns only
    named = shift(path, [("q1", 0, "critic", 0)])
    code, report = audit(path, tiny)
    assert code == 10 and names(report) == set(named) and named[0][3] == 1
    # the reviser's history holds the critic's old value: a history fault on it, named too
    code, report = audit(path, tiny, "--worst", "5")
    assert report["faults"] == {"history": 1}


def test_sample_is_stratified_and_deterministic(raw_folder, tiny):
    code, first = audit(raw_folder, tiny, "--sample", "5", "--seed", "3")
    assert code == 0 and first["units"] == {"total": 24, "audited": 5}
    counts = {s: f["records"] for s, f in first["stages"].items()}
    assert counts == {"solver": 3, "rewriter": 1, "selector": 1}  # 12, 6, 6 of 24
    _, again = audit(raw_folder, tiny, "--sample", "5", "--seed", "3", "--worst", "5")
    assert [r["rollout_id"] for r in again["worst"]] == [r["rollout_id"] for r in first["worst"]]


def test_stages_and_text_output(raw_folder, tiny):
    result = CliRunner().invoke(app, ["audit", str(raw_folder), "--model", str(tiny), "--stages", "rewriter"])
    assert result.exit_code == 0, result.output
    assert "ok: 6 records" in result.stdout and "rewriter" in result.stdout
    assert "not audited (solver): 12 stage not asked for" in result.stdout
    result = CliRunner().invoke(app, ["audit", str(raw_folder), "--model", str(tiny), "--stages", "judge"])
    assert result.exit_code == 2 and "--stages judge" in result.stderr


def test_a_template_fault_and_a_wrong_ending_are_named(raw_folder, tiny, tmp_path):
    path = tmp_path / "copy"
    path.mkdir()
    for f in raw_folder.iterdir():
        (path / f.name).write_bytes(f.read_bytes())

    def change(records):
        solver = records[0]
        solver["prompt"] = solver["prompt"].replace("What is", "What's")  # the text no longer gives these ids
        cut = next(r for r in records if r["finish_reason"] == "length" and r["stage"] != "solver")
        cut["status"], cut["finish_reason"] = "completed", "stop"  # a truncated response said stopped on EOS
        stopped.append(cut["stage"])

    stopped: list[str] = []
    synthetic.edit(path, change)
    code, report = audit(path, tiny)
    assert code == 10
    kinds = {(r["stage"], f["kind"]) for r in report["failed"] for f in r["faults"]}
    assert kinds == {("solver", "template"), (stopped[0], "eos")}
    assert report["templates"]["solver"]["mismatch"] == 1


def test_without_torch_the_command_says_how_to_get_it(raw_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails as if it were not installed
    result = CliRunner().invoke(app, ["audit", str(raw_folder), "--model", "x"])
    assert result.exit_code == 2
    assert "pip install 'agentroll[torch]'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_logprobs_mode_or_model_is_a_usage_error(raw_folder, tiny, tmp_path):
    path = tmp_path / "copy"
    path.mkdir()
    for f in raw_folder.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["servers"][-1]["logprobs_mode"] = "unknown"
    (path / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(app, ["audit", str(path), "--model", str(tiny)])
    assert result.exit_code == 2 and "pass --logprobs-mode" in result.stderr
    result = CliRunner().invoke(app, ["audit", str(raw_folder), "--model", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "cannot load model" in result.stderr


def test_batches_of_any_size_give_the_same_figures_and_the_bar_counts_every_conversation(raw_folder, tiny):
    import io

    from rich.console import Console

    from agentroll.audit import AuditOptions
    from agentroll.audit import audit as run_audit
    from agentroll.cli.audit import Bar

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = Bar(console)
    one = run_audit(raw_folder, AuditOptions(model=str(tiny), device="cpu", batch_tokens=1), bar)
    assert bar.bar.tasks[0].total == bar.bar.tasks[0].completed == 24
    whole = run_audit(raw_folder, AuditOptions(model=str(tiny), device="cpu", batch_tokens=100_000))
    assert one["ok"] and whole["ok"]
    assert one["overall"]["tokens"] == whole["overall"]["tokens"] > 0
    assert abs(one["overall"]["mean_abs"] - whole["overall"]["mean_abs"]) < 1e-6  # padding moves float noise only


def test_a_tokenizer_other_than_the_runs_is_a_warning_and_a_missing_folder_exit_6(raw_folder, tiny, tmp_path):
    path = tmp_path / "copy"
    path.mkdir()
    for f in raw_folder.iterdir():
        (path / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["servers"][-1]["tokenizer_sha256"] = "0" * 64
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, report = audit(path, tiny)
    assert code == 0 and report["warnings"] == [
        "the model's tokenizer is not the run's (tokenizer_sha256 differs from the manifest's)"
    ]
    result = CliRunner().invoke(app, ["audit", str(tmp_path / "nothing"), "--model", str(tiny)])
    assert result.exit_code == 6 and "nothing" in result.stderr
