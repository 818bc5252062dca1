"""Sampling masks (`--return-sampling-mask`) in the exports, each in its trainer's own field as its code reads
it: prime-rl's `MicroBatch` (last field, int32 `ids` / `counts` bytes: its sampling-replay branch d09488d),
verifiers' `KeptTokens` (base64 int32, counts per completion token: a60a606's `_attribute_kept_tokens`), the
PyTorch dataset's `sampling_mask`; and `audit`'s logprobs renormalised over the recorded sets."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentroll.convert import convert
from agentroll.folder import read_records
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, run_cli, write_problems
from .test_audit_cli import tiny  # noqa: F401 - a fixture

msgspec = pytest.importorskip("msgspec")
torch = pytest.importorskip("torch")


class SamplingMask(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """prime-rl's sampling-replay mask (`KeptTokens` on its branch, d09488d): int32 bytes."""

    ids: bytes
    counts: bytes


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """prime-rl's MicroBatch with the sampling mask appended last (array_like: the order is the wire format)."""

    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    sequence_lengths: list[int]
    temperatures: list[float]
    env_names: list[str]
    seq_lens: list[int]
    ref_logprobs: list[float] | None = None
    routed_experts: Any = None
    mm_kwargs: Any = None
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    sampling_mask: SamplingMask | None = None


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("masked")
    problems = write_problems(root / "p.jsonl", 3)
    server = SimServer(script=Script.from_jsonl(problems), enable_scale_out=True, return_sampling_mask=True)
    server.start()
    try:
        out = root / "out"
        proc = run_cli(
            *("generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER),
            *("--reward", "exact", "--top-k", "6", "--top-p", "0.9", "--temperature", "0.8", "--seed", "1"),
            *("--return-sampling-mask", "--samples-per-prompt", "2"),
        )
        assert proc.returncode == 0, proc.stderr.decode()
    finally:
        server.stop()
    return out


def by_tokens(folder: Path) -> dict[tuple[int, ...], dict[str, Any]]:
    return {tuple(r["prompt_token_ids"] + r["response_token_ids"]): r for r in read_records(folder, masks=True)}


def test_prime_rl_carries_the_kept_sets_as_int32_ids_and_counts_per_position(masked, tmp_path):
    convert(masked, "prime-rl", tmp_path / "o")
    batches = msgspec.msgpack.Decoder(type=list[MicroBatch]).decode(
        (tmp_path / "o" / "rollouts" / "step_0" / "rank_0.bin").read_bytes()
    )
    source = by_tokens(masked)
    assert len(batches) == len(source)
    for mb in batches:
        record = source[tuple(mb.input_ids)]
        counts = np.frombuffer(mb.sampling_mask.counts, dtype=np.int32)
        ids = np.frombuffer(mb.sampling_mask.ids, dtype=np.int32)
        assert len(counts) == len(mb.input_ids) and int(counts.sum()) == len(ids)
        start = len(record["prompt_token_ids"])
        assert not counts[:start].any()  # the prompt was not sampled
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for at, trained in enumerate(mb.loss_mask):
            got = ids[offsets[at] : offsets[at + 1]].tolist()
            assert got == (record["sampling_mask"][at - start] if trained else [])
            if trained:
                assert mb.input_ids[at] in got


def test_verifiers_steps_carry_kept_tokens_as_its_generate_client_does(masked, tmp_path):
    convert(masked, "verifiers", tmp_path / "o")
    source = by_tokens(masked)
    steps = 0
    for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines():
        for step in json.loads(line)["trajectory"]:
            tokens = step["tokens"]
            record = source[tuple(tokens["prompt_ids"] + tokens["completion_ids"])]
            kept = tokens["kept_tokens"]
            counts = np.frombuffer(base64.b64decode(kept["counts"]), dtype=np.int32)
            ids = np.frombuffer(base64.b64decode(kept["ids"]), dtype=np.int32)
            assert len(counts) == len(tokens["completion_ids"]) and int(counts.sum()) == len(ids)
            assert ids.tolist() == [t for s in record["sampling_mask"] for t in s]
            steps += 1
    assert steps == len(source)


def test_the_dataset_gives_a_padded_sampling_mask_per_position(masked):
    from agentroll.torch import RolloutDataset, collate

    source = by_tokens(masked)
    items = list(RolloutDataset(masked))
    assert len(items) == len(source)
    for item in items:
        record = source[tuple(item["input_ids"].tolist())]
        kept = item["sampling_mask"]
        assert kept.shape[0] == len(item["input_ids"])
        start = len(record["prompt_token_ids"])
        assert (kept[:start] == -1).all()
        for j, step in enumerate(record["sampling_mask"]):
            row = kept[start + j]
            assert row[row >= 0].tolist() == (step if record["loss_mask"][j] else [])
    batch = collate(items[:3])
    assert batch["sampling_mask"].shape[:2] == batch["input_ids"].shape
    assert batch["sampling_mask"][~batch["attention_mask"].bool()].eq(-1).all()


def test_audit_renormalises_over_the_recorded_kept_set():
    from agentroll.audit.logprobs import OK, OUTSIDE, Sampling, replayed, sampled_logprobs

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=generator)
    tokens = torch.tensor([3, 7, 7, 10])
    kept = [[3, 9, 20], [7], [1, 2, 7, 40], [11, 12]]  # the last token is outside its set
    sampling = Sampling(temperature=0.5, top_p=0.9, top_k=4)
    values, codes = replayed(logits, tokens, sampling, kept)
    for row in range(3):
        scaled = logits[row] / 0.5
        expected = scaled[tokens[row]] - torch.logsumexp(scaled[kept[row]], dim=0)
        assert values[row].item() == pytest.approx(expected.item(), abs=1e-5)
    assert values[1].item() == pytest.approx(0.0, abs=1e-6)  # a set of one: probability 1
    assert codes.tolist() == [OK, OK, OK, OUTSIDE] and values[3].item() == float("-inf")
    same = sampled_logprobs(logits, tokens, "processed_logprobs", sampling, 1e-3, 1e-2, kept)
    assert torch.equal(same[0], values)


def test_audit_compares_every_token_over_the_kept_sets_a_folder_records(tiny, tmp_path):  # noqa: F811
    """Sampled from the tiny model under top-k, top-p and min-p in processed mode, each record keeping the set its
    tokens were drawn from: the audit compares every token (no ambiguous cut) and passes; the same folder with
    one id dropped from each wide set fails, its recorded values no longer the renormalisation over them."""
    from . import test_audit_cli as cli
    from .test_audit import oracle

    kept_sets: list[list[int]] = []

    class Keeping(cli.Engine):
        def sample(self, prompt, sampling, max_tokens):  # type: ignore[no-untyped-def]
            ids, logprobs, finish, stop = super().sample(prompt, sampling, max_tokens)
            context = list(prompt)
            for token in ids:  # the kept set at each step, as the engine's oracle drew from it
                logits = self.model(torch.tensor([context])).logits[0, -1].double().tolist()
                t, k, p, m = (sampling[key] for key in ("temperature", "top_k", "top_p", "min_p"))
                kept_sets.append(sorted(oracle(logits, t, k, p, m)))
                context.append(token)
            return ids, logprobs, finish, stop

    original = cli.Engine
    cli.Engine = Keeping
    try:
        out = cli.folder(tmp_path / "out", tiny, "processed_logprobs", cli.SHAPED, problems=1)
    finally:
        cli.Engine = original
    shard = out / "rollouts-00000.jsonl"
    records = [json.loads(line) for line in shard.read_text().splitlines()]
    at = 0
    for r in records:
        r["sampling_mask"] = kept_sets[at : at + len(r["response_token_ids"])]
        at += len(r["response_token_ids"])
    assert at == len(kept_sets)

    def rewrite(rows: list[dict[str, Any]]) -> None:
        import hashlib

        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
        shard.write_bytes(data)
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (out / "manifest.json").write_text(json.dumps(manifest))

    rewrite(records)
    code, report = cli.audit(out, tiny)
    assert code == 0, report["failed"]
    assert report["overall"]["records_failed"] == 0 and report["overall"]["max_abs"] < 1e-4
    assert not any(stage.get("tokens_skipped") for stage in report["stages"].values())
    for r in records:
        for step, token in zip(r["sampling_mask"], r["response_token_ids"], strict=True):
            if len(step) > 1:
                step.remove(next(t for t in step if t != token))
    rewrite(records)
    code, report = cli.audit(out, tiny)
    assert code == 10 and report["overall"]["records_failed"] > 0
