"""The converter defects found by running the output through each trainer's own code (issue 23), one test each,
held to the trainer's definition as read at the commits named in docs/convert.md:

- TRL f2cd57710ae345ea6428ae95363267fcf38a3dc8 (installed 1.16.0): GRPOTrainer passes each prompt
  `num_generations` times (its RepeatSampler), one completion is expected per copy.
- Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/rl/rl_utils.py: `calculate_grpo_advantages`
  stacks a step's rewards as one (groups x size) array, zero-turn rollouts are placeholders;
  `single_turn_termination_ok`; `align_unpacked_inference_logprobs` (logprobs of the generated positions only).
- slime 624b824a898ab0ec1fcb4d373004c7f3852bf515: slime/utils/dp_schedule.py `build_dp_schedule` asserts a
  step has at least `global_batch_size` rollouts (by rollout id) and drops the rollouts past a whole number of
  steps; slime/utils/types.py `rollout_routed_experts` of shape (len(tokens) - 1, layers, topk).

The TRL trainer runs (GRPO's replay, DPO's token-exact recipe, the recorded logprobs GRPO ignores) are in
tests/test_convert_trl.py.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentroll.convert import convert
from agentroll.errors import UsageError

from . import convert_support, synthetic
from .convert_support import EOS, doc_code, edited_copy, executions_of, frozen_critic, lines, stage_groups

folder, records = convert_support.folder, convert_support.records  # the fixtures

# ------------------------------------------------------------------------------------------------- 1. TRL GRPO


def test_the_replay_rollout_func_gives_one_row_per_prompt_copy_as_trl_passes_them(folder, records, tmp_path):
    convert(folder, "trl", tmp_path / "o", stages="solver")
    namespace: dict[str, Any] = {}
    exec(doc_code("replay").replace("out-trl/trl.jsonl", str(tmp_path / "o" / "trl.jsonl")), namespace)

    class Trainer:
        num_generations = 9  # 3 executions x 3 solvers: every solver group

    groups = stage_groups([r for r in records if r["stage"] == "solver"])
    keys = [f"{pid}/{stage}" for pid, stage in list(groups)[:2]]
    prompts = [key for key in keys for _ in range(Trainer.num_generations)]  # what GRPOTrainer passes
    output = namespace["rollout_func"](prompts, Trainer())
    assert {len(v) for v in output.values()} == {len(prompts)}  # one completion per prompt copy
    expected = [r for key in list(groups)[:2] for r in groups[key]]
    assert output["completion_ids"] == [r["response_token_ids"] for r in expected]
    assert output["prompt_ids"] == [r["prompt_token_ids"] for r in expected]
    with pytest.raises(ValueError, match="num_generations"):  # a group smaller than the copies asked for
        namespace["rollout_func"]([keys[0]] * 10, Trainer())


# --------------------------------------------------------------------------------------- 2. Megatron group sizes


def megatron_advantages(rewards: list[list[float]], num_turns: list[list[int]]) -> list[float]:
    """calculate_grpo_advantages as rl_utils.py defines it: one (groups x size) array (np.asarray raises on
    ragged groups), statistics over the real (num_turns > 0) rollouts, population std + 1e-4, placeholders 0."""
    r = np.asarray(rewards, dtype=np.float64)
    real = np.asarray(num_turns, dtype=np.int64) > 0
    counts = np.maximum(real.sum(axis=-1, keepdims=True), 1)
    means = np.where(real, r, 0.0).sum(axis=-1, keepdims=True) / counts
    stds = np.sqrt((np.where(real, r - means, 0.0) ** 2).sum(axis=-1, keepdims=True) / counts)
    return np.where(real, (r - means) / (1e-4 + stds), 0.0).flatten().tolist()


@pytest.mark.parametrize("stages", [None, "rewriter", "selector"])
def test_megatron_pads_every_group_to_one_size_with_placeholders(folder, records, tmp_path, stages):
    summary = convert(folder, "megatron", tmp_path / "o", stages=stages)
    groups = lines(tmp_path / "o" / "megatron.jsonl")
    sizes = {len(g["rollouts"]) for g in groups}
    assert len(sizes) == 1, sizes  # calculate_grpo_advantages needs one (groups x size) array
    rewards = [[t["reward"] for t in g["rollouts"]] for g in groups]
    turns = [[len(t["trajectory"]) for t in g["rollouts"]] for g in groups]
    found = megatron_advantages(rewards, turns)
    want = {key: members for key, members in stage_groups(records).items() if stages is None or key[1] == stages}
    assert len(groups) == len(want)
    placeholders = 0
    flat = iter(found)
    for g, members in zip(groups, want.values(), strict=True):
        real = [t for t in g["rollouts"] if t["trajectory"]]
        assert [t["logprobs"] for t in real] == [[r["response_logprobs"]] for r in members]
        mean, std = statistics.fmean(r["reward"] for r in members), statistics.pstdev(r["reward"] for r in members)
        for t in g["rollouts"]:
            advantage = next(flat)
            if not t["trajectory"]:
                placeholders += 1
                assert t["rollout_status"] == "placeholder" and advantage == 0.0
                continue
            # the real rollouts get their (problem, stage) group's baseline, the placeholders change nothing
            assert math.isclose(advantage, (t["reward"] - mean) / (1e-4 + std), rel_tol=1e-9, abs_tol=1e-9)
    assert placeholders == sum(len(g["rollouts"]) for g in groups) - sum(len(m) for m in want.values())
    assert summary["placeholders"] == placeholders
    assert stages is not None or placeholders > 0  # the sizes differ across stages


# ---------------------------------------------------------------------------- 5. multi-turn prompts as one message


MULTI_TURN = (
    "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    "<|im_start|>user\nAnd 2+2?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.parametrize("to", ["sft", "dpo"])
def test_a_multi_turn_prompt_is_refused_by_the_conversational_layout_not_taken_as_one_message(folder, tmp_path, to):
    def edit(found: list[dict[str, Any]]) -> None:
        for r in found:
            if r["stage"] == "solver":
                r["prompt"] = MULTI_TURN  # the rendering of several messages, as a later turn's prompt is

    edited = edited_copy(folder, tmp_path / "edited", edit)
    with pytest.raises(UsageError, match="--layout standard") as caught:
        convert(edited, to, tmp_path / "o")
    assert "\n" not in str(caught.value)
    assert convert(edited, to, tmp_path / "o2", layout="standard")["rows"] > 0


# ---------------------------------------------------------------------------------------- 6. SFT frozen records


def test_sft_trains_a_frozen_stages_correct_calls_which_it_keeps_by_default(tmp_path):
    folder = frozen_critic(tmp_path / "cr")
    critics = [r for e in executions_of(folder) for r in e if r["stage"] == "critic"]
    assert critics and all(r["loss_mask"] == [0] * len(r["loss_mask"]) for r in critics)  # as generated
    convert(folder, "sft", tmp_path / "o", layout="standard")
    rows = [r for r in lines(tmp_path / "o" / "sft.jsonl") if r["stage"] == "critic"]
    correct = [r for r in critics if r["raw_reward"] == 1.0]
    assert len(rows) == len(correct) == 2
    for row, source in zip(rows, correct, strict=True):
        prompt, response = source["prompt_token_ids"], source["response_token_ids"]
        assert row["labels"] == [-100] * len(prompt) + response  # the frozen model's answer is the target


# ---------------------------------------------------------------------------------- 7. slime's last short file


def test_slime_files_each_hold_a_whole_step_and_the_problems_left_over_are_counted(folder, records, tmp_path):
    torch = pytest.importorskip("torch")
    summary = convert(folder, "slime", tmp_path / "o", advantage="grpo", groups_per_file=3)
    pts = sorted((tmp_path / "o").glob("rollout_*.pt"))
    assert [p.name for p in pts] == ["rollout_0.pt", "rollout_1.pt"]  # 8 problems: two steps of 3, 2 left over
    assert summary["left_over_problems"] == 2
    executions = len({r["rollout_id"] for r in records}) // len({r["problem_id"] for r in records})
    per_file = []
    for path in pts:
        samples = torch.load(path, weights_only=True)["samples"]
        # build_dp_schedule counts rollouts by rollout id: every step the same number, 3 problems x K executions
        per_file.append(len({s["rollout_id"] for s in samples}))
    assert per_file == [3 * executions] * 2
    kept = {s["metadata"]["agentroll"]["problem_id"] for s in lines(tmp_path / "o" / "slime.jsonl")}
    assert len(kept) == 6 and kept == set(list(dict.fromkeys(r["problem_id"] for r in records))[:6])
    with pytest.raises(UsageError, match="--groups-per-file 9") as caught:
        convert(folder, "slime", tmp_path / "o9", groups_per_file=9)  # more than the folder has: no whole step
    assert "8 problems" in str(caught.value)


# ------------------------------------------------------------------------------------------- 8. slime routes


def routed_folder(path: Path) -> Path:
    from .test_routes import LAYERS, TOP_K, Model, group, write

    write(path, [group("a", Model(0)), group("b", Model(1))]).close(complete=True)
    assert (LAYERS, TOP_K) == (3, 2)
    return path


def test_slime_carries_routed_experts_for_routing_replay(tmp_path):
    torch = pytest.importorskip("torch")
    from agentroll.folder import read_records

    folder = routed_folder(tmp_path / "routed")
    convert(folder, "slime", tmp_path / "o")
    samples = torch.load(tmp_path / "o" / "rollout_0.pt", weights_only=True)["samples"]
    source = list(read_records(folder, routes=True))
    assert len(samples) == len(source) == 12
    by_tokens = {tuple(r["prompt_token_ids"] + r["response_token_ids"]): r for r in source}
    for sample in samples:
        record = by_tokens[tuple(sample["tokens"])]
        experts = sample["rollout_routed_experts"]
        # slime/utils/types.py: (len(tokens) - 1, num_layers, moe_router_topk), int32 as slime decodes them
        assert isinstance(experts, torch.Tensor) and experts.dtype == torch.int32
        assert tuple(experts.shape) == (len(sample["tokens"]) - 1, 3, 2)
        assert np.array_equal(experts.numpy(), record["routed_experts"].astype(np.int32))
    jsonl = lines(tmp_path / "o" / "slime.jsonl")
    assert [s["rollout_routed_experts"] for s in jsonl] == [s["rollout_routed_experts"].tolist() for s in samples]
    convert(folder, "megatron", tmp_path / "m")  # formats without routes still read such a folder
    assert "routed" not in (tmp_path / "m" / "megatron.jsonl").read_text()


# --------------------------------------------------------------------------------- 9. Megatron frozen truncated


def termination_ok(rollout: dict[str, Any], seq_len: int) -> bool:
    """rl_utils.single_turn_termination_ok, as defined there."""
    turn = rollout["trajectory"][-1]
    if len(turn) == seq_len or (turn and turn[-1] == EOS):
        return True
    if rollout["generation_cap"] is None or not rollout["generation_mask"]:
        return False
    return sum(rollout["generation_mask"][-1]) == rollout["generation_cap"]


def test_megatron_kept_frozen_records_are_generated_tokens_and_pass_the_termination_check(tmp_path):
    def truncate(found: list[dict[str, Any]]) -> None:
        for r in found:
            if r["stage"] == "critic":
                r["status"], r["finish_reason"] = "truncated", "length"  # stopped at max_tokens, no EOS

    folder = edited_copy(frozen_critic(tmp_path / "cr"), tmp_path / "truncated", truncate)
    convert(folder, "megatron", tmp_path / "o", include_frozen=True, trajectories=False)
    rollouts = [t for g in lines(tmp_path / "o" / "megatron.jsonl") for t in g["rollouts"] if t["trajectory"]]
    critics = [t for t in rollouts if t["env_id"] == "agentroll/critic"]
    assert len(critics) == 3
    for t in critics:
        assert termination_ok(t, seq_len=4096)
        prompt_len = len(t["trajectory"][0]) - t["generation_cap"]
        assert t["generation_mask"][0] == [False] * prompt_len + [True] * t["generation_cap"]
        assert len(t["logprobs"][0]) == sum(t["generation_mask"][0])  # align_unpacked_inference_logprobs


def test_megatron_logprobs_cover_exactly_the_generated_positions(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")  # the solvers' responses have a forced token (mask 0)
    convert(folder, "megatron", tmp_path / "o", trajectories=False)
    rollouts = [t for g in lines(tmp_path / "o" / "megatron.jsonl") for t in g["rollouts"] if t["trajectory"]]

    def has_gap(mask: list[bool]) -> bool:  # a False after the first True: a token the model did not sample
        return not all(mask[mask.index(True) :])

    assert any(has_gap(t["generation_mask"][0]) for t in rollouts)
    for t in rollouts:
        assert len(t["logprobs"][0]) == sum(t["generation_mask"][0])


# ------------------------------------------------------------------------------------ 10. Megatron's advantage


def test_megatron_refuses_an_advantage_it_would_never_read(folder, tmp_path):
    with pytest.raises(UsageError, match="Megatron computes its GRPO advantages from reward") as caught:
        convert(folder, "megatron", tmp_path / "o", advantage="grpo")
    assert "\n" not in str(caught.value) and not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ std per trainer


@pytest.mark.parametrize(
    ("to", "std", "pick"),
    [
        ("trl", None, statistics.stdev),  # TRL's nanstd: Bessel-corrected
        ("trl", "population", statistics.pstdev),
        ("slime", None, statistics.stdev),  # torch.std
        ("slime", "population", statistics.pstdev),
    ],
)
def test_grpo_advantages_use_the_trainers_std_unless_told(folder, records, tmp_path, to, std, pick):
    if to == "slime":
        pytest.importorskip("torch")
    summary = convert(folder, to, tmp_path / "o", advantage="grpo", std=std)
    assert summary["std"] == (std or "sample")
    rows = lines(tmp_path / "o" / f"{to}.jsonl")
    got = [r["advantage"] if to == "trl" else r["reward"] for r in rows]
    want, scaled = [], 0
    for members in stage_groups(records).values():
        rewards = [r["reward"] for r in members]
        mean = statistics.fmean(rewards)
        spread = pick(rewards) if len(rewards) > 1 else 0.0
        eps = {"trl": 1e-4, "slime": 1e-6}[to]  # the trainer's own damping of the std (docs/convert.md)
        want += [(x - mean) / (spread + eps) if spread > 0 else x - mean for x in rewards]
        scaled += spread > 0 and len(rewards) > 1
    assert scaled > 0 and len(got) == len(want)
    assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12) for a, b in zip(got, want, strict=True))


def test_std_is_for_grpo_advantages_only(folder, tmp_path):
    with pytest.raises(UsageError, match="--std is for --advantage grpo"):
        convert(folder, "trl", tmp_path / "o", std="sample")
    with pytest.raises(UsageError, match="--std takes one of sample, population"):
        convert(folder, "trl", tmp_path / "o", advantage="grpo", std="bessel")


def test_the_sample_std_of_a_group_of_one_is_zero_spread():
    from agentroll.convert import advantages

    assert advantages([0.7], "grpo", "sample") == [0.0]
    assert advantages([1.0, 0.0], "grpo", "sample") == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)])
    assert Counter(advantages([1.0, 0.0], "grpo", "population")) == Counter([1.0, -1.0])
