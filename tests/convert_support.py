"""What the converter tests share: a real output folder made through the simulated server, its records, the
simulated tokenizer, a tiny random causal LM built from it (for real trainer steps on CPU), folders with frozen
records as the generator writes them, and small readers of the converted files.

Import the fixtures into a test module (`from .convert_support import folder, records, ...`); each module then
makes its own folder once (a few seconds)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentroll.folder import read_records
from agentroll.record.schema import STAGES
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from . import synthetic
from .conftest import TOKENIZER, run_cli, write_problems

ROOT = Path(__file__).resolve().parent.parent
EOS = 2  # the simulated tokenizer's <|im_end|>, its EOS


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real output folder: 8 problems, 3 solvers and 3 rewriters per execution, 3 executions per problem,
    rewards 0, 0.5 (a correct answer in an execution whose selector picked wrong) or 1."""
    tmp = tmp_path_factory.mktemp("convert")
    problems = write_problems(tmp / "problems.jsonl", 8)
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        out = tmp / "rollouts"
        result = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "3",
            "--samples-per-prompt",
            "3",
            "--reward",
            "exact",
            "--seed",
            "7",
            "--incorrect-reward-weight",
            "0.5",
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
    finally:
        server.stop()
    return out


@pytest.fixture(scope="module")
def records(folder: Path) -> list[dict[str, Any]]:
    found = list(read_records(folder))
    assert {r["stage"] for r in found} == set(STAGES)
    assert {r["reward"] for r in found} == {0.0, 0.5, 1.0}  # the data exercises every case
    return found


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    """A random 2-layer Llama over the simulated tokenizer's vocabulary, saved with that tokenizer: what the
    trainers load by path. Built here in a second; never downloaded."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    path = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def stage_groups(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(problem, stage) -> its records in folder order; dict order = the converters' output order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pid in dict.fromkeys(r["problem_id"] for r in records):
        for stage in STAGES:
            members = [r for r in records if r["problem_id"] == pid and r["stage"] == stage]
            if members:
                groups[pid, stage] = members
    return groups


def rewrite(folder: Path, edit: Any) -> Path:
    """Applies `edit(records)` to the folder's records in place, keeping its manifest's sizes and hashes true."""
    manifest = json.loads((folder / "manifest.json").read_text())
    shards = [folder / s["file"] for s in manifest["shards"]]
    found = [[json.loads(line) for line in shard.read_text().splitlines()] for shard in shards]
    edit([r for shard in found for r in shard])
    for shard, entry, shard_records in zip(shards, manifest["shards"], found, strict=True):
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in shard_records).encode()
        shard.write_bytes(data)
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def edited_copy(folder: Path, dest: Path, edit: Any) -> Path:
    """A copy of the folder with `edit(records)` applied."""
    shutil.copytree(folder, dest)
    return rewrite(dest, edit)


def as_generated(found: list[dict[str, Any]]) -> None:
    """Frozen records as the generator writes them (agentroll/context/__init__.py): `loss_mask` 0 throughout, and a
    later turn's history 0 (logprob 0.0) over a frozen turn's tokens. tests/synthetic.py leaves both at 1."""
    by_execution: dict[str, list[dict[str, Any]]] = {}
    for r in found:
        by_execution.setdefault(r["rollout_id"], []).append(r)
    for execution in by_execution.values():
        for r in execution:
            if not r["trainable"]:
                r["loss_mask"] = [0] * len(r["response_token_ids"])
        for r in execution:
            if r["continues"] is None:
                continue
            earlier = execution[r["continues"]]
            while True:
                if not earlier["trainable"]:
                    begin = len(earlier["prompt_token_ids"])
                    for k in range(begin, begin + len(earlier["response_token_ids"])):
                        r["history_mask"][k], r["history_logprobs"][k] = 0, 0.0
                if earlier["continues"] is None:
                    break
                earlier = execution[earlier["continues"]]


def frozen_critic(folder: Path) -> Path:
    """The critique-revise folder of tests/synthetic.py with a frozen critic, its records as generated."""
    return rewrite(synthetic.critique_revise(folder, frozen_critic=True), as_generated)


def executions_of(folder: Path) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for r in synthetic.records_of(folder):
        if not out or out[-1][0]["rollout_id"] != r["rollout_id"]:
            out.append([])
        out[-1].append(r)
    return out


def doc_code(marker: str) -> str:
    """The Python block after `<!-- marker -->` in docs/convert.md."""
    import re

    found = re.search(
        rf"<!-- {re.escape(marker)} -->\n```python\n(.*?)```", (ROOT / "docs" / "convert.md").read_text(), re.S
    )
    assert found, f"docs/convert.md lost its {marker} example"
    return found.group(1)


def conversation(records: list[dict[str, Any]], last: int, train_frozen: bool = False) -> dict[str, Any]:
    """The conversation ending at records[last] (an execution's records) built turn by turn from the calls, as a
    trainer that takes whole conversations holds it: the first prompt, then each turn's injected tokens (not the
    model's) and response (the model's per its loss mask; a frozen turn's not, or all of it with
    `train_frozen`). `logprobs` are the sampled ones where `mask` is 1 (compare them there only)."""
    chain = [last]
    while records[chain[-1]]["continues"] is not None:
        chain.append(records[chain[-1]]["continues"])
    first = records[chain[-1]]
    tokens = list(first["prompt_token_ids"])
    mask = [0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    for i in reversed(chain):
        r = records[i]
        injected = r["prompt_token_ids"][len(tokens) :]
        assert r["prompt_token_ids"][: len(tokens)] == tokens  # each turn's prompt holds the earlier ones
        own = (
            ([1] * len(r["loss_mask"]) if train_frozen else [0] * len(r["loss_mask"]))
            if not r["trainable"]
            else r["loss_mask"]
        )
        tokens += injected + r["response_token_ids"]
        mask += [0] * len(injected) + own
        logprobs += [0.0] * len(injected) + r["response_logprobs"]
    return {
        "tokens": tokens,
        "start": len(first["prompt_token_ids"]),
        "mask": mask,
        "logprobs": logprobs,
        "turns": len(chain),
        "record": records[last],
    }


def conversations(folder: Path, train_frozen: bool = False, frozen: bool = False) -> list[dict[str, Any]]:
    """Every conversation of a folder of tests/synthetic.py, by its last (trainable, unless `frozen`) turn, in
    folder order of that turn."""
    out = []
    for execution in executions_of(folder):
        kept = [i for i, r in enumerate(execution) if frozen or r["trainable"]]
        inside = set()
        for i in kept:
            j = execution[i]["continues"]
            while j is not None:
                inside.add(j)
                j = execution[j]["continues"]
        out += [conversation(execution, i, train_frozen) for i in kept if i not in inside]
    return out
