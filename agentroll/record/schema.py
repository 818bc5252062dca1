"""The on-disk record: one JSON line per LLM call. `docs/schema.md` documents it (a test keeps the two in step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 6  # 2: groups are whole; problem_hash. 3: sampling per record, ranks, top-k, weight versions, routes.
# 4: pluggable systems: trainable, turn, continues, history_mask, history_logprobs. 5: tool use: tool_calls.
# 6: problem (the row's prompt as given: what a reward saw, so that rescore gives it the same)

# Fields added to schema 6 after folders were written with it (the agent system's, head to head's, a teacher's):
# a record written before them lacks them and reads as null there (`Sample`'s default), no less valid for it
OPTIONAL_FIELDS = frozenset(
    {
        *("branched_from", "rerendered", "agent_answer", "agent_reward", "agent_error"),
        "policy",
        *("teacher_logprobs", "teacher_ranks", "teacher_top_ids", "teacher_top_logprobs"),
        *("judge", "reward_components"),
    }
)

STAGES = ("solver", "rewriter", "selector")  # the three-stage system's, in order; other systems name their own

# vLLM's finish_reason -> our status. The client retries any other reason ("abort": vLLM stopped the request),
# and a call that never finishes fails its group, so "aborted" is only a safety net and is never written.
STATUS_BY_FINISH_REASON = {"stop": "completed", "length": "truncated", "abort": "aborted"}


def status_for(finish_reason: str | None) -> str:
    return STATUS_BY_FINISH_REASON.get(finish_reason or "", "aborted")


@dataclass(slots=True)
class Sample:
    """One LLM call of one execution: everything a trainer needs, token-exact.

    `response_token_ids` and `response_logprobs` are the server's own values, index for index; a stop token
    the model emitted (EOS) is included, because the model is trained to emit it.
    """

    problem_id: str
    problem_hash: str  # hash of the row's prompt and label: its identity (the default id), checked on resume
    rollout_id: str
    sample_index: int
    group_size: int
    stage: str
    worker: int
    prompt: str
    prompt_token_ids: list[int]
    response: str
    response_token_ids: list[int]
    response_logprobs: list[float]
    loss_mask: list[int]
    status: str
    finish_reason: str | None
    stop_reason: int | str | None
    content: str | None
    raw_reward: float
    reward: float
    label: Any
    model: str
    endpoint: str
    latency_s: float
    attempts: int
    rollout_size: int = 0  # records in this execution: a loader can check it holds the whole rollout
    # selector: the parsed K of "Judgment: K" (1-based, as written) and whether it pointed at a listed rewrite;
    # rewriter: its 1-based position in the selector's list, or None when it had no content.
    judgment: int | None = None
    listed_as: int | None = None
    reward_info: str | None = None
    # the execution's outcome (the selector's raw_reward; 0 when it stopped before selection) and figures over
    # the problem's group of executions, written with the group
    final_reward: float = 0.0
    group_reward_mean: float | None = None
    group_reward_std: float | None = None
    group_pass_at_k: float | None = None
    # the (problem, stage) group: this stage's samples over the problem's K executions, the GRPO baseline
    stage_group_size: int | None = None
    stage_group_reward_mean: float | None = None
    stage_group_reward_std: float | None = None
    # how this call was sampled, as sent (every parameter is sent, so a model's generation_config.json cannot
    # change one behind our back): seed, temperature, top_p, top_k, min_p, max_tokens
    sampling: dict[str, Any] = field(default_factory=dict)
    # rank of each sampled token in the server's distribution (1 = most likely), where the server says it
    response_ranks: list[int | None] | None = None
    # --logprobs K: the K most likely tokens at each response position, in rank order (ids, logprobs)
    top_token_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    # --teacher (distillation): a teacher model's scores of the same response ids, in the same context (vLLM's
    # prompt_logprobs over prompt + response): each token's logprob and rank under the teacher, and with
    # --teacher-logprobs K the teacher's K most likely tokens at each position, in rank order
    teacher_logprobs: list[float] | None = None
    teacher_ranks: list[int] | None = None
    teacher_top_ids: list[list[int]] | None = None
    teacher_top_logprobs: list[list[float]] | None = None
    # which policy version produced which response tokens: [{"version", "start", "end"}] over response indexes
    weight_versions: list[dict[str, Any]] | None = None
    # --return-routed-experts: in memory the server's .npy bytes, shape (prompt + response - 1, layers, top-k);
    # on disk a reference into the shard's routes sidecar (docs/schema.md)
    routed_experts: Any = None
    # --return-sampling-mask: per response token the vocabulary ids vLLM kept under top-k / top-p / min-p (the
    # support the token was sampled from, ascending); in memory a list of lists, on disk a reference into the
    # shard's sidecar ({"counts", "ids"}: docs/routed-experts.md)
    sampling_mask: Any = None
    # False: a frozen stage (e.g. a judge served by another model): its samples are kept for analysis, not trained
    trainable: bool = True
    # multi-turn: `turn` 0 is a first call; a later turn continues the record at position `continues` of the same
    # execution by token ids (its prompt + response + the template's turn-separator tokens + the new messages).
    # Over prompt_token_ids, `history_mask` is 1 where the model sampled the token in an earlier turn and 0 where
    # the template, the system or a user injected it; `history_logprobs` holds those tokens' sampled logprobs
    # (0.0 where injected). The whole trajectory is the last turn: prompt + response, history_mask + loss_mask.
    turn: int = 0
    continues: int | None = None
    history_mask: list[int] | None = None
    history_logprobs: list[float] | None = None
    # tool use: the calls this turn's response made, in order, each {"id" (the tool_call_id its result went back
    # with, or would have: a call not run), "name", "arguments", "result" (what the model was shown, cut to
    # max_tool_output; null when not run), "duration_s", "error" (null when it went well), "status" (ok,
    # malformed, unknown, failed, timeout, not_run)}; null when the response made none
    tool_calls: list[dict[str, Any]] | None = None
    # the agent system (`--system agent`): a call whose messages hold earlier assistant turns that it does not
    # continue by ids had that history rendered from text (`rerendered`: true; false when its history is the
    # model's own ids or it has none): a new branch (the agent edited or dropped a message, stripped the
    # thinking), and `branched_from` is the position of the call it shares the most leading messages with.
    # `agent_answer` is the agent's final answer and `agent_reward` the reward it reported (null: none), on every
    # call of its execution. `agent_error`: why the agent failed (crashed, exited non-zero, ran out of time) when
    # its execution was kept as the model's failure (`on_error=score`), on every call; null when it finished.
    # All null for other systems.
    branched_from: int | None = None
    rerendered: bool | None = None
    # `--system-option sampling=run`: the sampling the agent's request asked for (the keys it set: temperature,
    # top_p, top_k, min_p, max_tokens), where `sampling` is what was sent (the run's); null otherwise
    agent_sampling: dict[str, Any] | None = None
    agent_answer: str | None = None
    agent_reward: float | None = None
    agent_error: str | None = None
    # the input row's prompt exactly as given (a string, or the list of chat messages): what the rewards were
    # given as `prompt` (and the statement derived from it), so that `rescore` gives them the same ("" before 6)
    problem: str | list[dict[str, Any]] = ""
    # a head-to-head run (`generate --policy NAME=URL ...`): the name of the policy (model) that made this
    # execution; each policy has K executions in the problem's group. None in a run of one model
    policy: str | None = None
    # --reward judge: what the judge said of this sample, {"model", "score" (as it wrote it), "verdict" (its reply,
    # the last 2000 characters), "prompt_tokens", "completion_tokens"} (group mode adds "answer", "of"), or
    # {"model", "failed": why} when it gave no verdict (then the sample has no reward: see docs/rewards.md)
    judge: dict[str, Any] | None = None
    # --reward-component: each component's {"value" (its raw reward), "weight"} by name; raw_reward is the sum
    # of value x weight. None with a single reward
    reward_components: dict[str, dict[str, float]] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
