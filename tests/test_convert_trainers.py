"""The converters for verl, OpenRLHF, prime-rl, NeMo-RL, verifiers and SkyRL (and Megatron's whole-conversation
rollouts), each held to its trainer's definition as read in its source at the commit docs/convert.md names:

- verl b178a3cd56f58b2d502255daba591e92833930a7: verl/experimental/agent_loop/agent_loop.py (`AgentLoopOutput`,
  `AgentLoopMetrics`), verl/trainer/ppo/core_algos.py (`compute_grpo_outcome_advantage`, grouped by `uid`);
- OpenRLHF 3c3be6234e0cb353e76bb8019947db9dfe99fca7: openrlhf/utils/agent.py (the executor's dict),
  openrlhf/trainer/ppo_utils/samples_generator.py (`_process_response_into_experience`);
- prime-rl 559b44772e471d1538537b8805cc77f3824a5e64: src/prime_rl/transports/rollouts/types.py (`MicroBatch`,
  `RoutedExperts`, msgspec, array_like), filesystem.py / base.py (`rank_R.bin`, `Decoder(type=list[MicroBatch])`),
  src/prime_rl/trainer/batch.py (`prepare_sample`'s alignment assertions);
- NeMo-RL 7ea279abfbeb698b092856d0dab61e7cf39bc909: nemo_rl/data/interfaces.py (`DatumSpec`),
  nemo_rl/algorithms/grpo.py (`add_grpo_token_loss_masks_and_generation_logprobs`),
  nemo_rl/data/processors.py (`preference_preprocessor`);
- verifiers a60a606ecc4d309247edf9ff92c3eabca362781f: verifiers/legacy/types.py (`RolloutOutput`,
  `TrajectoryStep`, `TrajectoryStepTokens`, `GenerateMetadata`), verifiers/legacy/rubrics/rubric.py (advantage);
- SkyRL a9564572eb8e91076be43c1bd5e4615e3de17265: skyrl/train/generators/base.py (`GeneratorOutput`,
  `TrajectoryID`);
- Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/rl/rl_utils.py (`_is_collapsible_rollout`,
  `prepare_trajectories`, `align_unpacked_inference_logprobs`).

None of these trainers installs from PyPI without CUDA in this project's environment (verl pins transformers
< 5.11, OpenRLHF needs flash-attn and deepspeed, NeMo-RL's PyPI name is a placeholder, SkyRL's types need Python
3.12, prime-rl and Megatron's RL package are not on PyPI): the definitions are declared here, field for field,
and prime-rl's files are decoded with msgspec as prime-rl decodes them. OpenRLHF's executor base class is used
when importable (`pip install --no-deps openrlhf pylatexenc`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter
from typing_extensions import NotRequired, TypedDict

from agentroll.convert import convert

from . import convert_support, synthetic
from .convert_support import conversations, doc_code, frozen_critic, lines, stage_groups

folder, records, tokenizer = convert_support.folder, convert_support.records, convert_support.tokenizer

WHOLE = ["megatron", "verl", "openrlhf", "prime-rl", "nemo-rl", "verifiers", "skyrl"]


# ------------------------------------------------------------------- each trainer's view of its own input, as it
# reads it: (tokens, mask, logprobs, group id) per trained sequence


def megatron_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for line, g in enumerate(lines(out / "megatron.jsonl")):
        for t in g["rollouts"]:
            if not t["trajectory"]:
                continue
            turns = t["trajectory"]
            for prev, cur in itertools.pairwise(turns):  # _is_collapsible_rollout: a prefix chain
                assert cur[: len(prev)] == prev
            for k, (m, lp) in enumerate(zip(t["generation_mask"], t["logprobs"], strict=True)):
                assert sum(m) == len(lp), k  # every turn's logprobs match its generated tokens
            tokens = turns[-1]
            mask = [0] * len(tokens)
            for m in t["generation_mask"]:  # prepare_trajectories: the union of the turns' masks
                for pos, on in enumerate(m):
                    mask[pos] = mask[pos] or int(on)
            logprobs = [0.0] * len(tokens)
            positions = [pos for pos, on in enumerate(mask) if on]
            for pos, lp in zip(positions, [x for turn in t["logprobs"] for x in turn], strict=True):
                logprobs[pos] = lp
            found.append(
                {
                    "tokens": tokens,
                    "mask": mask,
                    "logprobs": logprobs,
                    "group": line,
                    "reward": t["reward"],
                    "turns": len(turns),
                }
            )
    return found


def verl_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for row in lines(out / "verl.jsonl"):
        output = AgentLoopOutput.model_validate(row)
        p = len(output.prompt_ids)
        assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs or [])
        found.append(
            {
                "tokens": output.prompt_ids + output.response_ids,
                "mask": [0] * p + output.response_mask,
                "logprobs": [0.0] * p + (output.response_logprobs or []),
                "group": row["uid"],
                "reward": output.reward_score,
                "turns": output.num_turns // 2,
            }
        )
    return found


def openrlhf_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for row in lines(out / "openrlhf.jsonl"):
        tokens = row["observation_tokens"]
        mask = [0] * len(tokens)
        for start, end in row["action_ranges"]:  # _process_response_into_experience's action mask
            mask[start:end] = [1] * (end - start)
        assert len(row["rollout_log_probs"]) == len(tokens)
        assert all(lp == 0.0 for lp, m in zip(row["rollout_log_probs"], mask, strict=True) if not m)
        found.append(
            {
                "tokens": tokens,
                "mask": mask,
                "logprobs": row["rollout_log_probs"],
                "group": row["group"],
                "reward": row["scores"],
                "turns": None,
            }
        )
    return found


def prime_rl_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((out / "rollouts").glob("step_*/rank_*.bin")):
        for mb in decode_micro_batches(path):
            assert mb.sequence_lengths == mb.seq_lens == [len(mb.input_ids)]
            if not any(mb.loss_mask):
                continue  # a rank's zero-loss padding
            found.append(
                {
                    "tokens": mb.input_ids,
                    "mask": [int(m) for m in mb.loss_mask],
                    "logprobs": mb.inference_logprobs,
                    "group": None,
                    "reward": None,
                    "turns": None,
                    "advantage": {a for a, m in zip(mb.advantages, mb.loss_mask, strict=True) if m},
                }
            )
    return found


def nemo_rl_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for row in lines(out / "nemo_rl.jsonl"):
        assert set(row) >= set(DatumSpec.__annotations__) - {"task_name", "stop_strings", "__extra__"}
        tokens, mask, logprobs = [], [], []
        for message in row["message_log"]:
            ids = message["token_ids"]
            # add_grpo_token_loss_masks_and_generation_logprobs: assistant messages with generation_logprobs train
            trained = message["role"] == "assistant" and "generation_logprobs" in message
            tokens += ids
            mask += [int(trained)] * len(ids)
            logprobs += message.get("generation_logprobs", [0.0] * len(ids))
            assert len(message.get("generation_logprobs", ids)) == len(ids)
        assert row["length"] == len(tokens)
        found.append(
            {
                "tokens": tokens,
                "mask": mask,
                "logprobs": logprobs,
                "group": tuple(row["message_log"][0]["token_ids"]),
                "reward": row["total_reward"],
                "turns": None,
            }
        )
    return found


def verifiers_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for row in lines(out / "results.jsonl"):
        RESULT.validate_python(row)
        last = row["trajectory"][-1]["tokens"]
        tokens = last["prompt_ids"] + last["completion_ids"]
        mask, logprobs = [0] * len(tokens), [0.0] * len(tokens)
        for step in row["trajectory"]:
            t = step["tokens"]
            begin = len(t["prompt_ids"])
            assert tokens[: begin + len(t["completion_ids"])] == t["prompt_ids"] + t["completion_ids"]
            assert t["prompt_mask"] == [0] * begin
            mask[begin : begin + len(t["completion_ids"])] = t["completion_mask"]
            logprobs[begin : begin + len(t["completion_ids"])] = t["completion_logprobs"]
        found.append(
            {
                "tokens": tokens,
                "mask": mask,
                "logprobs": logprobs,
                "group": row["example_id"],
                "reward": row["reward"],
                "turns": len(row["trajectory"]),
                "advantage": row["advantage"],
            }
        )
    return found


def skyrl_view(out: Path) -> list[dict[str, Any]]:
    found = []
    for row in lines(out / "skyrl.jsonl"):
        assert set(row) <= set(GENERATOR_OUTPUT)
        p = len(row["prompt_token_ids"])
        assert len(row["response_ids"]) == len(row["loss_masks"]) == len(row["rollout_logprobs"])
        found.append(
            {
                "tokens": row["prompt_token_ids"] + row["response_ids"],
                "mask": [0] * p + row["loss_masks"],
                "logprobs": [0.0] * p + row["rollout_logprobs"],
                "group": row["trajectory_ids"]["instance_id"],
                "reward": row["rewards"],
                "turns": None,
            }
        )
    return found


VIEWS = {
    "megatron": megatron_view,
    "verl": verl_view,
    "openrlhf": openrlhf_view,
    "prime-rl": prime_rl_view,
    "nemo-rl": nemo_rl_view,
    "verifiers": verifiers_view,
    "skyrl": skyrl_view,
}


def same(view: dict[str, Any], want: dict[str, Any]) -> None:
    assert view["tokens"] == want["tokens"]
    assert view["mask"] == want["mask"]
    on = [i for i, m in enumerate(want["mask"]) if m]
    assert [view["logprobs"][i] for i in on] == [want["logprobs"][i] for i in on]
    if view["reward"] is not None:
        assert view["reward"] == want["record"]["reward"]
    if view["turns"] is not None:
        assert view["turns"] == want["turns"]


def by_tokens(found: list[dict[str, Any]]) -> dict[tuple[int, ...], dict[str, Any]]:
    keyed = {tuple(v["tokens"]): v for v in found}
    assert len(keyed) == len(found)
    return keyed


# ----------------------------------------------------------------------- multi-turn, frozen, per call: all formats


@pytest.mark.parametrize("to", WHOLE)
def test_a_conversation_is_one_trained_sequence_token_for_token(tmp_path, to):
    folder = synthetic.critique_revise(tmp_path / "cr")
    summary = convert(folder, to, tmp_path / "o")
    want = conversations(folder)
    assert len(want) == 4 and summary["folded_turns"] == 5
    found = by_tokens(VIEWS[to](tmp_path / "o"))
    assert len(found) == len(want)
    for w in want:
        same(found[tuple(w["tokens"])], w)
    assert any(w["turns"] == 3 for w in want)  # a three-call conversation is in there


@pytest.mark.parametrize("to", WHOLE)
def test_frozen_turns_are_untrained_unless_included_then_trained_as_generated(tmp_path, to):
    folder = frozen_critic(tmp_path / "cr")
    skipped = convert(folder, to, tmp_path / "o")
    want = conversations(folder)
    assert skipped["skipped_frozen"] == 3
    found = by_tokens(VIEWS[to](tmp_path / "o"))
    for w in want:
        same(found[tuple(w["tokens"])], w)
    assert any(w["turns"] == 3 and 0 in w["mask"][14:18] for w in want)  # a critic's 4 tokens, untrained
    everything = convert(folder, to, tmp_path / "all", include_frozen=True)
    want = conversations(folder, train_frozen=True, frozen=True)
    assert "skipped_frozen" not in everything
    found = by_tokens(VIEWS[to](tmp_path / "all"))
    for w in want:
        same(found[tuple(w["tokens"])], w)
    assert any(w["record"]["stage"] == "critic" for w in want)


@pytest.mark.parametrize("to", WHOLE)
def test_without_trajectories_every_call_is_its_own_sequence(tmp_path, to):
    folder = synthetic.critique_revise(tmp_path / "cr")
    summary = convert(folder, to, tmp_path / "o", trajectories=False)
    calls = [r for e in convert_support.executions_of(folder) for r in e]
    assert len(calls) == 9 and "folded_turns" not in summary
    found = VIEWS[to](tmp_path / "o")
    assert sorted(v["tokens"] for v in found) == sorted(r["prompt_token_ids"] + r["response_token_ids"] for r in calls)


@pytest.mark.parametrize("to", WHOLE)
def test_a_three_stage_folder_converts_every_record_with_its_groups(folder, records, tmp_path, to):
    convert(folder, to, tmp_path / "o")
    found = VIEWS[to](tmp_path / "o")
    assert len(found) == len(records)
    keyed = (
        by_tokens(found)
        if len({tuple(r["prompt_token_ids"] + r["response_token_ids"]) for r in records}) == len(records)
        else None
    )
    groups = stage_groups(records)
    if keyed is not None:
        for (pid, stage), members in groups.items():
            ids = {keyed[tuple(r["prompt_token_ids"] + r["response_token_ids"])]["group"] for r in members}
            if to in ("verl", "skyrl", "openrlhf"):
                assert ids == {f"{pid}/{stage}"}  # the id its trainer groups by is the (problem, stage) group
            elif to in ("megatron", "verifiers"):
                assert len(ids) == 1  # one RolloutGroup line, one example_id per (problem, stage) group
    if to in ("megatron", "verifiers"):
        assert len({v["group"] for v in found}) == len(groups)


# ---------------------------------------------------------------------------------------------------------- verl


class AgentLoopMetrics(BaseModel):
    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    num_preempted: int = -1


class AgentLoopOutput(BaseModel):
    """verl's AgentLoopOutput (agent_loop.py at b178a3c), fields and types; pydantic's default ignores extras."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None
    num_turns: int = 0
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}


def test_verl_groups_by_uid_and_verls_grpo_gives_the_per_stage_baseline(folder, records, tmp_path):
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception, match="verl computes its GRPO advantages"):
        convert(folder, "verl", tmp_path / "x", advantage="grpo")
    convert(folder, "verl", tmp_path / "o")
    rows = lines(tmp_path / "o" / "verl.jsonl")
    assert all(row["num_turns"] == 2 and row["routed_experts"] is None for row in rows)  # single calls
    # compute_grpo_outcome_advantage over index = uid: torch.std (Bessel), eps 1e-6; our groups, any size
    scores = torch.tensor([row["reward_score"] for row in rows])
    uids = [row["uid"] for row in rows]
    for (pid, stage), members in stage_groups(records).items():
        picked = scores[[i for i, u in enumerate(uids) if u == f"{pid}/{stage}"]]
        assert picked.tolist() == [r["reward"] for r in members]
        if len(picked) > 1:  # verl's group statistics are those of the (problem, stage) group
            assert float(torch.mean(picked)) == pytest.approx(statistics.fmean(r["reward"] for r in members))
            assert float(torch.std(picked)) == pytest.approx(statistics.stdev(r["reward"] for r in members))


# -------------------------------------------------------------------------------------------------------- OpenRLHF


def test_openrlhf_rows_carry_the_advantage_as_reward_and_the_reward_as_scores(folder, records, tmp_path):
    convert(folder, "openrlhf", tmp_path / "o", advantage="grpo")
    rows = lines(tmp_path / "o" / "openrlhf.jsonl")
    expected = [r for group in stage_groups(records).values() for r in group]
    for row, source in zip(rows, expected, strict=True):
        assert row["scores"] == source["reward"] and row["truncated"] == (source["status"] == "truncated")
        assert row["prompt"] == source["prompt"] and row["label"] == str(source["label"])
        assert row["extra_logs"] == {}
    for members in stage_groups(records).values():
        rewards = [r["reward"] for r in members]
        if len(set(rewards)) > 1:
            mean, std = statistics.fmean(rewards), statistics.stdev(rewards)  # OpenRLHF's group_norm: torch std
            want = [(x - mean) / std for x in rewards]
            got = [
                row["reward"]
                for row in rows
                if (row["problem_id"], row["stage"]) == (members[0]["problem_id"], members[0]["stage"])
            ]
            assert got == pytest.approx(want)


def test_the_openrlhf_replay_executor_serves_each_group_as_openrlhf_calls_it(folder, records, tmp_path):
    pytest.importorskip("openrlhf.utils.agent")  # pip install --no-deps openrlhf pylatexenc
    from openrlhf.utils.agent import AgentExecutorBase

    convert(folder, "openrlhf", tmp_path / "o", stages="solver")
    namespace: dict[str, Any] = {}
    exec(
        doc_code("openrlhf-replay").replace("out-openrlhf/openrlhf.jsonl", str(tmp_path / "o" / "openrlhf.jsonl")),
        namespace,
    )
    executor_cls = namespace["AgentExecutor"]
    assert issubclass(executor_cls, AgentExecutorBase)  # what _load_agent_executor asserts
    executor = executor_cls()
    key = next(f"{p}/{s}" for p, s in stage_groups(records) if s == "solver")

    async def generate_responses(n: int) -> list[dict[str, Any]]:  # vllm_engine.generate_responses: n concurrent
        return await asyncio.gather(
            *(
                executor.execute(
                    prompt=key, label="", sampling_params=None, max_length=4096, hf_tokenizer=None, llm_engine=None
                )
                for _ in range(n)
            )
        )

    got = asyncio.run(generate_responses(9))
    group = stage_groups(records)[tuple(key.rsplit("/", 1))]  # type: ignore[index]
    assert [r["observation_tokens"] for r in got] == [s["prompt_token_ids"] + s["response_token_ids"] for s in group]


# -------------------------------------------------------------------------------------------------------- prime-rl


try:
    import msgspec
except ImportError:  # the prime-rl tests skip
    msgspec = None
else:

    class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
        """prime-rl's types.py at 559b447, field for field (array_like: the order is the wire format)."""

        data: bytes
        shape: list[int]
        dtype: str

    class EncodedTensor(msgspec.Struct, array_like=True, gc=False):
        dtype: str
        shape: list[int]
        data: bytes

    class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
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
        routed_experts: RoutedExperts | None = None
        mm_kwargs: dict[str, EncodedTensor] | None = None
        mm_token_type_ids: list[int] | None = None
        rl_weights: list[float] | None = None
        ce_weights: list[float] | None = None
        ref_kl_weights: list[float] | None = None


def decode_micro_batches(path: Path) -> list[Any]:
    """A rank file decoded as prime-rl's receiver does: msgspec.msgpack.Decoder(type=list[MicroBatch])."""
    if msgspec is None:
        pytest.skip("msgspec is not installed (pip install msgspec)")
    batches = msgspec.msgpack.Decoder(type=list[MicroBatch]).decode(path.read_bytes())
    for mb in batches:  # prepare_sample's alignment assertion
        assert (
            len(mb.input_ids)
            == len(mb.advantages)
            == len(mb.loss_mask)
            == len(mb.position_ids)
            == len(mb.inference_logprobs)
            == len(mb.temperatures)
            == len(mb.env_names)
        )
        assert mb.position_ids == list(range(len(mb.input_ids)))
        if mb.routed_experts is not None:
            assert mb.routed_experts.shape[0] == len(mb.input_ids)
    return batches


def test_prime_rl_steps_and_ranks_hold_every_sample_with_its_advantage(folder, records, tmp_path):
    summary = convert(folder, "prime-rl", tmp_path / "o", groups_per_file=3, ranks=2)
    steps = sorted(p.name for p in (tmp_path / "o" / "rollouts").iterdir())
    assert steps == ["step_0", "step_1", "step_2"]  # 8 problems, 3 a step (a shorter last step is fine here)
    assert summary["files"] == [str(tmp_path / "o" / "rollouts" / s / f"rank_{r}.bin") for s in steps for r in (0, 1)]
    found = []
    for step in steps:
        ranks = [decode_micro_batches(tmp_path / "o" / "rollouts" / step / f"rank_{r}.bin") for r in (0, 1)]
        assert len(ranks[0]) == len(ranks[1])  # FileSystemMicroBatchSender asserts equal lists
        found += [mb for rank in ranks for mb in rank if any(mb.loss_mask)]
    assert len(found) == len(records)
    temperature = records[0]["sampling"]["temperature"]
    by_ids = {tuple(mb.input_ids): mb for mb in found}
    for members in stage_groups(records).values():
        mean = statistics.fmean(r["reward"] for r in members)  # prime-rl's GRPO: reward minus the group mean
        for r in members:
            mb = by_ids[tuple(r["prompt_token_ids"] + r["response_token_ids"])]
            assert {a for a, m in zip(mb.advantages, mb.loss_mask, strict=True) if m} == {r["reward"] - mean}
            assert set(mb.temperatures) == {temperature} and set(mb.env_names) == {f"agentroll/{r['stage']}"}
    with pytest.raises(Exception, match="needs an advantage"):
        convert(folder, "prime-rl", tmp_path / "x", advantage="none")


def test_prime_rl_carries_routes_padded_to_every_token(tmp_path):
    import numpy as np

    from agentroll.folder import read_records

    from .test_convert_defects import routed_folder

    folder = routed_folder(tmp_path / "routed")
    convert(folder, "prime-rl", tmp_path / "o")
    batches = decode_micro_batches(tmp_path / "o" / "rollouts" / "step_0" / "rank_0.bin")
    source = {tuple(r["prompt_token_ids"] + r["response_token_ids"]): r for r in read_records(folder, routes=True)}
    assert len(batches) == len(source)
    for mb in batches:
        routes = source[tuple(mb.input_ids)]["routed_experts"]
        got = np.frombuffer(mb.routed_experts.data, dtype=mb.routed_experts.dtype).reshape(mb.routed_experts.shape)
        assert np.array_equal(got[:-1], routes) and not got[-1].any()  # the last position padded with zeros


# --------------------------------------------------------------------------------------------------------- NeMo-RL


class DatumSpec(TypedDict):
    """nemo_rl/data/interfaces.py at 7ea279a."""

    message_log: list[dict[str, Any]]
    length: int
    extra_env_info: dict[str, Any] | None
    loss_multiplier: float
    idx: int
    task_name: NotRequired[str]
    stop_strings: NotRequired[list[str]]
    __extra__: NotRequired[Any]


def test_nemo_rl_rows_are_datum_specs(folder, records, tmp_path):
    with pytest.raises(Exception, match="NeMo-RL computes its GRPO advantages"):
        convert(folder, "nemo-rl", tmp_path / "x", advantage="mean")
    convert(folder, "nemo-rl", tmp_path / "o")
    rows = lines(tmp_path / "o" / "nemo_rl.jsonl")
    adapter = TypeAdapter(DatumSpec)
    for i, row in enumerate(rows):
        adapter.validate_python(row)
        assert row["idx"] == i and row["message_log"][0]["role"] == "user"
    # NeMo-RL's baseline groups are identical prompt tokens: all solvers of a problem share theirs
    solver_prompts = {tuple(r["message_log"][0]["token_ids"]) for r in rows if r["task_name"] == "agentroll/solver"}
    assert len(solver_prompts) == len({r["problem_id"] for r in records})


def test_nemo_rl_dpo_rows_are_what_preference_preprocessor_takes(folder, tmp_path, tokenizer):
    convert(folder, "nemo-rl-dpo", tmp_path / "o", max_pairs_per_group=2)
    dpo = convert(folder, "dpo", tmp_path / "d", max_pairs_per_group=2)
    rows = lines(tmp_path / "o" / "nemo_rl_dpo.jsonl")
    assert len(rows) == dpo["rows"] > 0
    for row, pair in zip(rows, lines(tmp_path / "d" / "dpo.jsonl"), strict=True):
        assert len(row["completions"]) == 2  # preference_preprocessor: exactly two, lower rank preferred, no tie
        chosen, rejected = sorted(row["completions"], key=lambda c: c["rank"])
        assert chosen["rank"] < rejected["rank"]
        assert row["context"] == pair["prompt"] and chosen["completion"] == pair["chosen"]
        assert rejected["completion"] == pair["rejected"]
        assert row["chosen_token_ids"] == pair["chosen_token_ids"]
        rendered = tokenizer.apply_chat_template(row["context"], tokenize=False, add_generation_prompt=True)
        assert tokenizer(rendered, add_special_tokens=False)["input_ids"] == row["prompt_token_ids"]
    with pytest.raises(Exception, match="--layout is for --to dpo and sft"):
        convert(folder, "nemo-rl-dpo", tmp_path / "x", layout="standard")


# ------------------------------------------------------------------------------------------------------- verifiers


class TrajectoryStepTokens(TypedDict):
    prompt_ids: list[int]
    prompt_mask: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    completion_logprobs: list[float]
    overlong_prompt: bool
    is_truncated: bool
    routed_experts: dict[str, Any] | None


class TrajectoryStep(TypedDict):
    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    response: dict[str, Any]
    tokens: TrajectoryStepTokens | None
    reward: float | None
    advantage: float | None
    is_truncated: bool
    trajectory_id: str
    extras: dict[str, Any]


class Result(TypedDict):
    """RolloutOutput's required fields and the optional ones we write (verifiers/legacy/types.py at a60a606)."""

    example_id: int
    prompt: list[dict[str, Any]] | None
    completion: list[dict[str, Any]] | None
    reward: float
    timing: dict[str, Any]
    is_completed: bool
    is_truncated: bool
    metrics: dict[str, float]
    answer: str
    info: dict[str, Any]
    error: dict[str, Any] | None
    stop_condition: str | None
    trajectory: list[TrajectoryStep]


RESULT = TypeAdapter(Result)
GENERATE_METADATA = {
    "env_id",
    "name",
    "env_args",
    "model",
    "base_url",
    "num_examples",
    "rollouts_per_example",
    "shuffle",
    "shuffle_seed",
    "sampling_args",
    "date",
    "time",
    "avg_reward",
    "avg_metrics",
    "avg_error",
    "pass_at_k",
    "pass_all_k",
    "pass_threshold",
    "usage",
    "cost",
    "version_info",
    "state_columns",
    "path_to_save",
    "tools",
}
REQUIRED_METADATA = GENERATE_METADATA - {"name", "shuffle", "shuffle_seed", "cost", "date", "path_to_save"}


def test_verifiers_results_group_by_example_id_with_the_rubrics_advantage(folder, records, tmp_path):
    convert(folder, "verifiers", tmp_path / "o")
    rows = lines(tmp_path / "o" / "results.jsonl")
    metadata = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert set(metadata) == REQUIRED_METADATA  # save_metadata drops path_to_save and date
    groups = stage_groups(records)
    assert metadata["num_examples"] == len(groups) and metadata["state_columns"] == ["advantage"]
    by_example: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_example.setdefault(row["example_id"], []).append(row)
    assert [len(v) for v in by_example.values()] == [len(m) for m in groups.values()]
    for example, members in zip(by_example.values(), groups.values(), strict=True):
        mean = statistics.fmean(r["reward"] for r in members)  # rubric.py: reward minus the group's average
        assert [row["advantage"] for row in example] == pytest.approx([r["reward"] - mean for r in members])
        assert all(step["advantage"] == row["advantage"] for row in example for step in row["trajectory"])


# ----------------------------------------------------------------------------------------------------------- SkyRL


GENERATOR_OUTPUT = [
    "prompt_token_ids",
    "response_ids",
    "rewards",
    "loss_masks",
    "stop_reasons",
    "rollout_metrics",
    "rollout_logprobs",
    "trajectory_ids",
    "trajectory_generation_times",
    "trajectory_time_splits",
    "rollout_expert_indices",
    "is_last_step",
    "env_metrics",
    "pixel_values",
    "image_grid_thw",
]


def test_skyrl_rows_collect_into_a_generator_output(folder, records, tmp_path):
    convert(folder, "skyrl", tmp_path / "o")
    namespace: dict[str, Any] = {}
    exec(doc_code("skyrl-batch"), namespace)
    rows = lines(tmp_path / "o" / "skyrl.jsonl")
    batch = namespace["generator_output"](rows)
    assert set(batch) <= set(GENERATOR_OUTPUT) and len(batch["response_ids"]) == len(records)
    assert [t.instance_id for t in batch["trajectory_ids"]] == [row["trajectory_ids"]["instance_id"] for row in rows]
    assert set(batch["stop_reasons"]) == {"stop", "length"}
    with pytest.raises(Exception, match="SkyRL computes its GRPO advantages"):
        convert(folder, "skyrl", tmp_path / "x", advantage="grpo")


# ----------------------------------------------------------------------------------------------------------- CLI


def test_the_convert_command_takes_the_new_formats_and_options(folder, records, tmp_path):
    from typer.testing import CliRunner

    from agentroll.cli import app

    runner = CliRunner()
    out = tmp_path / "o"
    result = runner.invoke(
        app,
        [
            "convert",
            str(folder),
            "--to",
            "prime-rl",
            "-o",
            str(out),
            "--advantage",
            "grpo",
            "--std",
            "population",
            "--ranks",
            "2",
            "--groups-per-file",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{len(records)} records -> {len(records)} prime-rl rows" in result.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.bin")) == [
        f"rollouts/step_{s}/rank_{r}.bin" for s in (0, 1) for r in (0, 1)
    ]
    bad = runner.invoke(app, ["convert", str(folder), "--to", "verl", "-o", str(tmp_path / "v"), "--advantage", "grpo"])
    assert bad.exit_code == 2 and "verl computes its GRPO advantages" in bad.output
    assert not (tmp_path / "v").exists()
    frozen = frozen_critic(tmp_path / "cr")
    kept = runner.invoke(
        app,
        [
            "convert",
            str(frozen),
            "--to",
            "megatron",
            "-o",
            str(tmp_path / "m"),
            "--include-frozen",
            "--no-trajectories",
        ],
    )
    assert kept.exit_code == 0, kept.output
    assert "9 records -> " in kept.output and "placeholders" in kept.output
