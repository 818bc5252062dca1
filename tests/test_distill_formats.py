"""A teacher's scores where each trainer reads them: prime-rl's `ref_logprobs` (and its loss routing), verl's
`teacher_ids` / `teacher_logprobs`, TRL's and SFT's columns, the PyTorch dataset; over single calls and over
whole multi-turn conversations, read back the way each trainer reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentroll.convert import convert
from agentroll.errors import UsageError

from .conftest import read_records, run_cli
from .teacher_support import teacher_server
from .test_convert_trainers import decode_micro_batches

KEY = ("problem_id", "sample_index", "stage", "worker")


@pytest.fixture
def teacher(problems):
    server = teacher_server(problems, max_model_len=8192)
    yield server
    server.stop()


def make(problems: Path, out: Path, sim, teacher, *extra: str) -> list[dict]:
    proc = run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", sim.url, "--teacher", teacher.url,
        "--samples-per-prompt", "2", "--num-parallel", "2", "--seed", "5", "--max-tokens", "200", "-q", *extra,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    return read_records(out)


def conversation(records: list[dict], last: dict) -> list[dict]:
    """The turns `last` ends, first turn first (`continues`: positions among its execution's records)."""
    execution = [r for r in records if r["rollout_id"] == last["rollout_id"]]
    chain = [last]
    while chain[-1]["continues"] is not None:
        chain.append(execution[chain[-1]["continues"]])
    return chain[::-1]


def test_prime_rl_carries_ref_logprobs_and_routes_the_loss_as_its_orchestrator_does(sim, teacher, problems, tmp_path):
    records = make(problems, tmp_path / "f", sim, teacher, "--teacher-logprobs", "2")
    by_ids = {tuple(r["prompt_token_ids"] + r["response_token_ids"]): r for r in records}
    grpo: dict[tuple, list[float]] = {}
    for loss in ("rl", "ref_kl", "rl+ref_kl"):
        out = tmp_path / loss.replace("+", "_")
        summary = convert(tmp_path / "f", "prime-rl", out, loss=loss, advantage=None)
        assert summary["advantage"] == ("none" if loss == "ref_kl" else "mean")
        batches = [mb for mb in decode_micro_batches(out / "rollouts" / "step_0" / "rank_0.bin") if any(mb.loss_mask)]
        assert len(batches) == len(records)
        for mb in batches:
            record = by_ids[tuple(mb.input_ids)]
            p = len(record["prompt_token_ids"])
            assert len(mb.ref_logprobs) == len(mb.input_ids)  # prime-rl's prepare_sample asserts it
            assert mb.ref_logprobs[p:] == record["teacher_logprobs"] and set(mb.ref_logprobs[:p]) <= {0.0}
            trained = [1.0 if m else 0.0 for m in mb.loss_mask]
            if loss == "rl":
                assert mb.ref_kl_weights is None and mb.rl_weights is None  # GRPO's wire, unchanged
                grpo[tuple(mb.input_ids)] = mb.advantages
            elif loss == "ref_kl":  # opd: no rl component, ref_kl on every trained token
                assert mb.rl_weights == [0.0] * len(mb.input_ids) and mb.ref_kl_weights == trained
                assert set(mb.advantages) == {0.0}
            else:
                assert mb.rl_weights is None and mb.ref_kl_weights == trained
                assert mb.advantages == grpo[tuple(mb.input_ids)]  # the rl component as it was
    with pytest.raises(UsageError, match="no --advantage"):
        convert(tmp_path / "f", "prime-rl", tmp_path / "x", loss="ref_kl", advantage="grpo")
    with pytest.raises(UsageError, match="--loss is for --to prime-rl"):
        convert(tmp_path / "f", "verl", tmp_path / "y", loss="ref_kl")


def test_prime_rl_refuses_ref_kl_where_a_trained_token_has_no_score(sim, teacher, problems, tmp_path):
    make(problems, tmp_path / "f", sim, teacher, "--stage", "rewriter.teacher=none")
    with pytest.raises(UsageError, match="needs a teacher's score on every trained token"):
        convert(tmp_path / "f", "prime-rl", tmp_path / "o", loss="ref_kl")
    assert not (tmp_path / "o").exists()  # refused while writing: nothing left behind
    convert(tmp_path / "f", "prime-rl", tmp_path / "o", loss="ref_kl", stages=["solver", "selector"])


def verl_teacher_rows(row: dict) -> tuple[list, list]:
    """What verl's trainer reads for the response from a row: `AgentLoopOutput.as_dict` moves `teacher_ids` and
    `teacher_logprobs` out of `extra_fields`; `no_padding_2_padding` then takes rows P-1 .. P+R-2 of the sequence
    (1dda039, verl/workers/utils/padding.py: the model output shifted left by one)."""
    extra = dict(row["extra_fields"])
    ids, logprobs = extra.pop("teacher_ids"), extra.pop("teacher_logprobs")
    p, r = len(row["prompt_ids"]), len(row["response_ids"])
    assert len(ids) == len(logprobs) == p + r  # teacher_manager asserts a row per token of the sequence
    return ids[p - 1 : p + r - 1], logprobs[p - 1 : p + r - 1]


@pytest.mark.parametrize("system", ["three-stage", "critique-revise"])
def test_verl_rows_hold_the_teacher_where_its_teacher_loop_puts_it(sim, teacher, problems, tmp_path, system):
    records = make(problems, tmp_path / "f", sim, teacher, "--teacher-logprobs", "2", "--system", system)
    for topk in (None, False):
        out = tmp_path / f"o{topk}"
        convert(tmp_path / "f", "verl", out, teacher_topk=topk)
        rows = [json.loads(line) for line in (out / "verl.jsonl").read_text().splitlines()]
        assert rows
        for row in rows:
            tokens = row["prompt_ids"] + row["response_ids"]
            last = next(r for r in records if r["prompt_token_ids"] + r["response_token_ids"] == tokens)
            ids, logprobs = verl_teacher_rows(row)
            p = len(row["prompt_ids"])
            width = 2 if topk is None else 1
            expected_ids, expected_logprobs = [[0] * width for _ in ids], [[0.0] * width for _ in ids]
            for turn in conversation(records, last):
                begin = len(turn["prompt_token_ids"]) - p
                for j, token in enumerate(turn["response_token_ids"]):
                    if topk is None:
                        expected_ids[begin + j] = turn["teacher_top_ids"][j]
                        expected_logprobs[begin + j] = turn["teacher_top_logprobs"][j]
                    else:
                        expected_ids[begin + j] = [token]
                        expected_logprobs[begin + j] = [turn["teacher_logprobs"][j]]
            assert ids == expected_ids and logprobs == expected_logprobs
    plain = run_cli("convert", str(tmp_path / "f"), "--to", "verl", "-o", str(tmp_path / "cli"), "--teacher-sampled")
    assert plain.returncode == 0, plain.stderr.decode()


def test_trl_sft_and_the_torch_dataset_carry_the_teachers_column(sim, teacher, problems, tmp_path):
    records = make(problems, tmp_path / "f", sim, teacher, "--teacher-logprobs", "2")
    by_key = {tuple(r[k] for k in KEY): r for r in records}
    convert(tmp_path / "f", "trl", tmp_path / "trl")
    for row in map(json.loads, (tmp_path / "trl" / "trl.jsonl").read_text().splitlines()):
        record = next(
            r
            for r in records
            if r["prompt_token_ids"] + r["response_token_ids"] == row["prompt_ids"] + row["completion_ids"]
        )
        assert row["teacher_logprobs"] == record["teacher_logprobs"]
        assert len(row["teacher_logprobs"]) == len(row["completion_ids"])
        assert row["teacher_top_ids"] == record["teacher_top_ids"]
    convert(tmp_path / "f", "sft", tmp_path / "sft", layout="standard")
    for row in map(json.loads, (tmp_path / "sft" / "sft.jsonl").read_text().splitlines()):
        assert len(row["teacher_logprobs"]) == len(row["input_ids"])
    torch = pytest.importorskip("torch")
    from agentroll.torch import RolloutDataset, collate

    items = list(RolloutDataset(tmp_path / "f"))
    assert len(items) == len(by_key)
    for item in items:
        tokens = item["input_ids"].tolist()
        record = next(r for r in records if r["prompt_token_ids"] + r["response_token_ids"] == tokens)
        p = len(record["prompt_token_ids"])
        assert item["teacher_logprobs"][p:].tolist() == pytest.approx(record["teacher_logprobs"])
        assert not item["teacher_logprobs"][:p].any()
    batch = collate(items[:4])
    assert (
        batch["teacher_logprobs"].shape == batch["input_ids"].shape and batch["teacher_logprobs"].dtype == torch.float32
    )
