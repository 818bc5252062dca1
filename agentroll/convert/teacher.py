"""A teacher's scores (`--teacher`, `agentroll distill`) laid out where a trainer reads them.

A record's `teacher_logprobs` (and, with --teacher-logprobs K, `teacher_top_ids` / `teacher_top_logprobs`) are
per response token. Over a whole conversation (`trajectory.Trajectory`) each turn's scores sit at its response's
positions; what the template or the system put between turns was not sampled, so it has no score (0.0, as
trainers pad). `aligned` gives them index for index with the conversation's tokens (prime-rl's `ref_logprobs`,
a PyTorch dataset's column); `shifted` in verl's layout, where row i holds the teacher's prediction of token
i + 1 (vLLM's prompt_logprobs read as verl's teacher loop reads them: a row per token, the last one a pad).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .trajectory import Record, Trajectory


@dataclass(slots=True)
class Scores:
    """Over a conversation's tokens: `logprobs` (0.0 where nothing was scored), `scored` (1 where a teacher scored
    the token), and the top k per position when the records hold them (empty lists elsewhere)."""

    logprobs: list[float]
    scored: list[int]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


def aligned(found: Trajectory) -> Scores | None:
    """The teacher's scores of `found`'s tokens, index for index; None when no turn of it was scored."""
    turns = [(r, span) for r, span in zip(found.chain, found.spans(), strict=True) if r.get("teacher_logprobs")]
    if not turns:
        return None
    n = len(found.tokens)
    top = any(r.get("teacher_top_ids") is not None for r, _ in turns)
    out = Scores([0.0] * n, [0] * n, [[] for _ in range(n)] if top else None, [[] for _ in range(n)] if top else None)
    for record, (begin, end) in turns:
        end = min(end, n)
        out.logprobs[begin:end] = [float(x) for x in record["teacher_logprobs"][: end - begin]]
        out.scored[begin:end] = [1] * (end - begin)
        if out.top_ids is not None and out.top_logprobs is not None and record.get("teacher_top_ids") is not None:
            out.top_ids[begin:end] = record["teacher_top_ids"][: end - begin]
            out.top_logprobs[begin:end] = record["teacher_top_logprobs"][: end - begin]
    return out


def covering(record: Record, found: Trajectory, why: str) -> Scores:
    """`aligned`, refused (one line naming the record) unless every trained token has a teacher's score."""
    scores = aligned(found)
    if scores is None or any(m and not s for m, s in zip(found.mask, scores.scored, strict=True)):
        raise UsageError(
            f"problem {record['problem_id']}, {record['stage']} (rollout {record['rollout_id']}): {why} needs a "
            "teacher's score on every trained token, and this one has none (score the folder with agentroll "
            "distill, or convert only the stages a teacher scored: --stages)"
        )
    return scores


def shifted(found: Trajectory, topk: bool | None) -> tuple[list[list[int]], list[list[float]]] | None:
    """verl's `teacher_ids` and `teacher_logprobs`: one row per token of the conversation, row i the teacher's
    prediction of token i + 1, the last row a pad (ids 0, logprobs 0.0). Each row holds the top k (`topk`, the
    default when the records hold them: verl's top-k losses) or the next token itself and its logprob (its KL
    estimators, k1 ... k3); None when nothing of the conversation was scored."""
    scores = aligned(found)
    if scores is None:
        return None
    use_top = scores.top_ids is not None if topk is None else topk
    if use_top and scores.top_ids is None:
        raise UsageError(
            f"problem {found.record['problem_id']}, {found.record['stage']}: --teacher-topk, but the records hold "
            "no teacher top k (distill with --teacher-logprobs K)"
        )
    n = len(found.tokens)
    width = max((len(t) for t in scores.top_ids or ()), default=1) if use_top else 1
    ids, logprobs = [[0] * width for _ in range(n)], [[0.0] * width for _ in range(n)]
    for p in range(1, n):
        if not scores.scored[p]:
            continue
        if use_top:
            assert scores.top_ids is not None and scores.top_logprobs is not None
            row_ids, row_logprobs = scores.top_ids[p], scores.top_logprobs[p]
            ids[p - 1] = [*row_ids, *[0] * (width - len(row_ids))]
            logprobs[p - 1] = [*row_logprobs, *[0.0] * (width - len(row_logprobs))]
        else:
            ids[p - 1], logprobs[p - 1] = [found.tokens[p]], [scores.logprobs[p]]
    return ids, logprobs
