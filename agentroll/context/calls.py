"""What one token-exact call derives and makes, apart from `Context`'s orchestration of it (budget, replay,
retries through the client, failure): its seed, its journal key, and the `Sample` a completion becomes.

Pure functions of their arguments, so that what a record holds (seed, sampling as sent, loss mask, status) can
be read in one place and tested without a server.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

import orjson

from agentroll.client.wire import Completion
from agentroll.context.stages import Stage, SystemConfig
from agentroll.context.turns import continue_turn
from agentroll.inputs import Problem
from agentroll.record.parsing import answer_content
from agentroll.record.schema import Sample, status_for
from agentroll.settings.sampling import Sampling

History = tuple[list[int], list[float]]  # a continued turn's history mask and logprobs


def call_seed(seed: int, *parts: object) -> int:
    """A distinct, reproducible seed per call: one seed for all N parallel solvers would make them identical."""
    key = "/".join(map(str, parts)).encode()
    return (seed * 1_000_003 + zlib.crc32(key)) % (2**31 - 1)


def call_key(
    problem: Problem,
    sample_index: int,
    attempt: int,
    stage: str,
    worker: int,
    sent: tuple[list[int], dict[str, Any], str, int],
    policy: str | None = None,
) -> tuple[str, str]:
    """A call's identity (problem, execution, attempt, stage, worker: what makes its seed; and its policy in a
    head-to-head run) and a digest of what it sends (ids, params, model, alternatives): a journaled answer is
    replayed only for exactly this request, and only to the policy that was asked."""
    parts: tuple[object, ...] = (problem.id, problem.content_hash, sample_index, attempt, stage, worker)
    key = "\x1f".join(map(str, (*parts, *((policy,) if policy is not None else ()))))
    body = orjson.dumps(list(sent), option=orjson.OPT_SORT_KEYS)
    return key, hashlib.blake2b(body, digest_size=12).hexdigest()


def sampling_record(sampling: Sampling, seed: int | None, max_tokens: int) -> dict[str, Any]:
    """The sampling a record says it was made with: as sent, max_tokens capped to the context left."""
    return {
        "seed": seed,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": sampling.min_p,
        "max_tokens": max_tokens,
    }


def sample_of(
    done: Completion,
    runtime: Stage,
    cfg: SystemConfig,
    problem: Problem,
    *,
    rollout_id: str,
    sample_index: int,
    worker: int,
    prompt: tuple[str, list[int]],
    response: str,
    sampled: dict[str, Any],
) -> Sample:
    """A server's completion as a record: the stage's tokens train (loss mask 1) unless the stage is frozen;
    reward 0 until the context scores it."""
    text, ids = prompt
    return Sample(
        problem_id=problem.id,
        problem_hash=problem.content_hash,
        rollout_id=rollout_id,
        sample_index=sample_index,
        group_size=cfg.samples_per_prompt,
        stage=runtime.name,
        worker=worker,
        prompt=text,
        prompt_token_ids=ids,
        response=response,
        response_token_ids=done.token_ids,
        response_logprobs=done.logprobs,
        loss_mask=[int(runtime.trainable)] * len(done.token_ids),
        status=status_for(done.finish_reason),
        finish_reason=done.finish_reason,
        stop_reason=done.stop_reason,
        content=answer_content(response, think=cfg.think),
        raw_reward=0.0,
        reward=0.0,
        label=problem.label,
        model=cfg.model,
        endpoint=done.endpoint,
        latency_s=round(done.latency_s, 4),
        attempts=done.attempts,
        problem=problem.prompt,
        metadata=problem.metadata,
        sampling=sampled,
        response_ranks=done.ranks,
        top_token_ids=done.top_token_ids,
        top_logprobs=done.top_logprobs,
        weight_versions=done.weight_versions,
        routed_experts=done.routed_experts if cfg.routes else None,
        sampling_mask=done.sampling_mask if cfg.masks else None,
        trainable=runtime.trainable,
    )


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """The tools a prompt was rendered with, as a key of the prompt cache."""
    return "" if not tools else hashlib.blake2b(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)).hexdigest()


def appended(after: Sample, injected: list[int], runtime: Stage) -> tuple[str, list[int], History]:
    """`after`'s prompt and response ids, then `injected`: the next prompt, its text, and its history. A frozen
    stage's tokens (another model's: loss mask 0) count as injected in the trajectory."""
    turn = continue_turn(
        after.prompt_token_ids,
        after.history_mask,
        after.history_logprobs,
        after.response_token_ids,
        after.response_logprobs,
        after.loss_mask,
        injected,
    )
    text = runtime.encoder.tokenizer.decode(turn.ids, skip_special_tokens=False)
    return text, turn.ids, (turn.mask, turn.logprobs)
