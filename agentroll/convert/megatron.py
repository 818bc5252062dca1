"""`--to megatron`: one `RolloutGroup` per (problem, stage) group and line, its rollouts `TokenRollout`s, as
Megatron-LM's RL agent API declares them (megatron/rl/types/rollout.py; megatron/rl/agent/api.py before).

A rollout is a conversation with one trajectory entry per turn, as Megatron's own multi-turn agent makes it
(megatron/rl/agent/reward_only_agent.py): entry j is turn j's prompt and response ids (each turn's ids start
with the previous turn's, so `prepare_trajectories` collapses them into one training row), its
`generation_mask` true on the tokens turn j generated (the loss mask), its `logprobs` those tokens' logprobs, so
that each turn's logprob count equals its generated-token count (`_is_collapsible_rollout`,
`align_unpacked_inference_logprobs`). A single call is a one-turn rollout; `trajectories=False` makes every call
one.

Megatron computes GRPO advantages itself from `reward` over each `RolloutGroup`
(`rl_utils.calculate_grpo_advantages`), stacking a step's rewards as one (groups x size) array: every group must
have the same size. Ours differ (K*N solvers, up to K*N rewriters, K selectors per problem), so each group is
padded to the conversion's largest with placeholders, empty-trajectory rollouts that Megatron leaves out of the
group statistics and trains nothing on (its own placeholders for failed episodes). Megatron never reads an
advantage, so `--advantage` is refused.

`policy_epoch` comes from the record's `weight_versions` (vLLM's generate API: which policy version made which
response tokens): Megatron's sparse `(start token index, epoch)` boundaries over the whole sequence, the prompt
stamped with the version that made the first response token. A version must be a whole number ("default", what
vLLM names weights never updated, is 0). Without weight versions (/v1/completions) every token is epoch 0.
`kv_cache_epoch` follows `policy_epoch`: vLLM does not say when a cached prefix was computed. No evictions.

Frozen records (`trainable: false`) are left out, and their tokens inside a conversation untrained, unless
`include_frozen`, which trains them as generated (so a truncated frozen call passes Megatron's termination check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import JsonlWriter, Problem, Record
from .trajectory import Trajectory

FILE = "megatron.jsonl"


def token_rollout(found: Trajectory) -> dict[str, Any]:
    """The conversation (or call) as a `TokenRollout`, one trajectory entry per turn."""
    record = found.record
    trajectory, masks, logprobs, epochs = [], [], [], []
    for turn, (begin, end) in zip(found.chain, found.spans(), strict=True):
        mask = [bool(found.mask[k]) for k in range(begin, end)]
        trajectory.append(turn["prompt_token_ids"] + turn["response_token_ids"])  # = found.tokens[:end]
        masks.append([False] * begin + mask)
        logprobs.append([found.logprobs[k] for k in range(begin, end) if found.mask[k]])
        epochs.append(policy_epochs(turn))
    generated = sum(masks[-1])
    return {
        "trajectory": trajectory,
        "reward": record["reward"],
        "generation_mask": masks,
        "logprobs": logprobs,  # the generated tokens only, as Megatron's inference returns them
        "env_id": f"agentroll/{record['stage']}",
        "problem_id": record["problem_id"],
        "policy_epoch": epochs,  # per turn, (first token index, epoch) boundaries
        "kv_cache_epoch": epochs,
        "num_evictions": [0] * len(trajectory),
        # rl_utils.single_turn_termination_ok: a single turn ends in EOS, fills the context, or generated exactly its
        # stamped cap; a truncated response stopped at the cap it was given
        "generation_cap": generated if record["status"] == "truncated" else None,
        "rollout_status": "ok",
    }


def placeholder(problem_id: str, stage: str) -> dict[str, Any]:
    """An empty-trajectory rollout: Megatron's placeholder (`num_turns` 0), left out of the group's statistics."""
    return {
        "trajectory": [],
        "reward": 0.0,
        "generation_mask": [],
        "logprobs": [],
        "env_id": f"agentroll/{stage}",
        "problem_id": problem_id,
        "policy_epoch": [],
        "kv_cache_epoch": [],
        "num_evictions": [],
        "generation_cap": None,
        "rollout_status": "placeholder",
    }


def _epoch(version: object, record: Record) -> int:
    if version == "default":
        return 0
    try:
        return int(str(version))
    except ValueError:
        raise UsageError(
            f"problem {record['problem_id']}: weight version {version!r} is not a whole number, which "
            "Megatron's policy_epoch needs"
        ) from None


def policy_epochs(record: Record) -> list[tuple[int, int]]:
    """`weight_versions` spans (over response token indexes) as boundaries over prompt + response indexes."""
    spans = sorted(record.get("weight_versions") or [], key=lambda s: s["start"])
    offset = len(record["prompt_token_ids"])
    out: list[tuple[int, int]] = []
    for span in spans:
        epoch = _epoch(span.get("version"), record)
        if not out:
            out.append((0, epoch))
        elif out[-1][1] != epoch:
            out.append((offset + int(span["start"]), epoch))
    return out or [(0, 0)]


def write(read: Callable[[], Iterable[Problem]], out: Path, include_frozen: bool) -> tuple[int, int]:
    """Rows and placeholders written. `read` gives the problems afresh: once to find the largest group, once to
    write (the folder is streamed twice rather than held in memory)."""
    size = max((len(g.records) for problem in read() for g in problem.groups), default=0)
    placeholders = 0
    with JsonlWriter(out / FILE) as writer:
        for problem in read():
            for index_in_batch, group in enumerate(problem.groups):
                rollouts = [token_rollout(found) for _, found, _ in group.items(include_frozen)]
                padding = size - len(rollouts)
                rollouts += [placeholder(group.problem_id, group.stage) for _ in range(padding)]
                placeholders += padding
                writer.write(
                    {
                        "rollouts": rollouts,
                        "batch_id": problem.index,
                        "index_in_batch": index_in_batch,
                        "uid": group.name,
                    }
                )
    return writer.rows, placeholders
