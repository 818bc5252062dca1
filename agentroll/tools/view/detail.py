"""One group as the page draws it: its executions in the system's shape, every record's tokens as text pieces.

Each execution lists its stages in the system's order (then any other), each under the system's `heading`, each
record under its `label` and `mark` (three-stage: the rewrite each was listed as, the judgment made and the
rewrite it picked), with the system's findings on it and the labels its charts
count. A record carries what a person checks: its response token by token (id, piece, logprob, loss mask,
and the teacher's logprob and top-k when the folder has them), its status and finish reason, reward and why,
tool calls, sampling, where it is (file and line). Prompts are stored once per conversation: a turn that
continues an earlier one has the earlier's prompt and response as its prompt's head, so the group keeps the
longest prompt of each conversation decoded, and each record says how much of it is its own prompt, with its
`history_mask` and `history_logprobs` (which tokens an earlier turn sampled, which were injected).
"""

from __future__ import annotations

from typing import Any

from ...folder.places import Place
from ...record.group import Group
from ...record.parsing import last_boxed
from ...record.schema import Sample
from .audit import Audit
from .rows import Words, execution_policies, gap
from .tokens import Decoder

SHOWN = (  # fields a record shows as they are
    "stage",
    "worker",
    "status",
    "finish_reason",
    "stop_reason",
    "raw_reward",
    "reward",
    "reward_info",
    "content",
    "judgment",
    "listed_as",
    "turn",
    "continues",
    "trainable",
    "policy",
    "tool_calls",
    "latency_s",
    "attempts",
    "model",
    "endpoint",
    "sampling",
    "rollout_id",
    "sample_index",
    "response",
    "weight_versions",
)


KNOWN = frozenset(  # fields shown otherwise (tokens, prompts, the group's figures), or not a record's own
    (
        *SHOWN,
        *("prompt", "prompt_token_ids", "response_token_ids", "response_logprobs", "loss_mask", "history_mask"),
        *("history_logprobs", "top_token_ids", "top_logprobs", "teacher_logprobs", "teacher_ranks", "teacher_top_ids"),
        *(
            "teacher_top_logprobs",
            "response_ranks",
            "routed_experts",
            "sampling_mask",
            "problem_id",
            "problem_hash",
            "group_size",
        ),
        *("rollout_size", "final_reward", "group_reward_mean", "group_reward_std", "group_pass_at_k"),
        *("stage_group_size", "stage_group_reward_mean", "stage_group_reward_std", "label", "problem", "metadata"),
        "schema_version",
    )
)
MOST_EXTRA = 32  # items of a list in a field the page does not know (a per-token list is left to the raw JSON)


def _prompts(records: list[dict[str, Any]], executions: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The group's distinct prompts (a conversation's longest, which every turn's prompt begins), and each
    record's prompt among them."""
    prompts: list[list[int]] = []
    known: dict[tuple[int, ...], int] = {}
    key = [0] * len(records)
    for members in executions:
        for position, at in enumerate(members):
            ids = list(records[at].get("prompt_token_ids") or [])
            earlier = records[at].get("continues")
            if type(earlier) is int and 0 <= earlier < position:
                mine = key[members[earlier]]
                if ids[: len(prompts[mine])] == prompts[mine] or prompts[mine][: len(ids)] == ids:
                    if len(ids) > len(prompts[mine]):
                        prompts[mine] = ids
                    key[at] = mine
                    continue
            found = known.get(tuple(ids))
            if found is None:
                found = known[tuple(ids)] = len(prompts)
                prompts.append(ids)
            key[at] = found
    return prompts, key


def _tokens(record: dict[str, Any], decoder: Decoder, alternatives: set[int]) -> dict[str, Any]:
    ids = list(record.get("response_token_ids") or [])
    out: dict[str, Any] = {
        "id": ids,
        "t": decoder.pieces(ids),
        "lp": record.get("response_logprobs"),
        "m": record.get("loss_mask"),
    }
    for name, short in (("teacher_logprobs", "tl"), ("teacher_ranks", "trank"), ("response_ranks", "rank")):
        if isinstance(record.get(name), list):
            out[short] = record[name]
    for ids_name, lps_name, short in (
        ("top_token_ids", "top_logprobs", "top"),
        ("teacher_top_ids", "teacher_top_logprobs", "ttop"),
    ):
        top_ids, top_lps = record.get(ids_name), record.get(lps_name)
        if isinstance(top_ids, list) and isinstance(top_lps, list):
            out[short] = [top_ids, top_lps]
            alternatives.update(i for row in top_ids if isinstance(row, list) for i in row if isinstance(i, int))
    kept = record.get("sampling_mask")  # per step, the number of tokens the sampler kept (index.py reads them)
    if isinstance(kept, list) and all(type(c) is int for c in kept):
        out["kept"] = kept
    gaps = gap(record.get("response_logprobs"), record.get("teacher_logprobs"))
    if gaps:
        out["gap"] = {"mean": sum(gaps) / len(gaps), "max": max(gaps)}
    return out


def _record(
    record: dict[str, Any], sample: Sample, samples: list[Sample], w: Words, line: int, prompt: int
) -> dict[str, Any]:
    label = w.vocabulary.label(sample, samples)
    out = {name: record.get(name) for name in SHOWN if name in record}
    content = record.get("content")
    out.update(
        line=line,
        label=label.text,
        mark=label.mark,
        answer=last_boxed(content) if isinstance(content, str) else None,
        prompt={
            "key": prompt,
            "n": len(record.get("prompt_token_ids") or ()),
            "text": record.get("prompt"),
            "hm": record.get("history_mask"),
            "hl": record.get("history_logprobs"),
        },
        findings=[],
        extra={  # a system's own fields (an answer it kept, a branch's origin) and fields added since
            k: v
            for k, v in record.items()
            if k not in KNOWN and v is not None and not (isinstance(v, list) and len(v) > MOST_EXTRA)
        },
    )
    return out


def detail(
    number: int,
    place: Place,
    records: list[dict[str, Any]],
    group: Group,
    w: Words,
    decoder: Decoder,
    audit: Audit | None = None,
) -> dict[str, Any]:
    """The page's data for one group (see the module's docstring)."""
    positions: list[list[int]] = []
    at = 0
    for samples in group.executions:
        positions.append(list(range(at, at + len(samples))))
        at += len(samples)
    prompts, keys = _prompts(records, positions)
    alternatives: set[int] = set()
    policies = execution_policies(records)
    executions = []
    for k, (samples, members) in enumerate(zip(group.executions, positions, strict=True)):
        shown = []
        for position, (sample, index) in enumerate(zip(samples, members, strict=True)):
            item = _record(records[index], sample, samples, w, place.line + index, keys[index])
            item["at"], item["tokens"] = position, _tokens(records[index], decoder, alternatives)
            if audit is not None:
                item["audit"] = audit.of(records[index])
            shown.append(item)
        for finding in w.check(samples):
            shown[finding.at if 0 <= finding.at < len(shown) else 0]["findings"].append(finding.message)
        stages = w.info.ordered([*(w.info.stages or ()), *(s.stage for s in samples)])
        head = samples[0]
        executions.append(
            {
                "index": head.sample_index,
                "rollout_id": head.rollout_id,
                "final_reward": head.final_reward,
                "policy": policies[k],
                "tags": w.tags_of(dict(w.vocabulary.tally(samples))),
                "stages": [
                    {
                        "stage": stage,
                        "heading": w.vocabulary.heading(stage, [s for s in samples if s.stage == stage], samples),
                        "records": [p for p, s in enumerate(samples) if s.stage == stage],
                    }
                    for stage in stages
                ],
                "records": shown,
            }
        )
    first = records[0]
    return {
        "n": number,
        "id": str(first.get("problem_id")),
        "hash": first.get("problem_hash"),
        "where": {"file": place.path.name, "line": place.line, "path": str(place.path), "zstd": place.zstd},
        "label": first.get("label"),
        "problem": first.get("problem"),
        "metadata": first.get("metadata"),
        "group_reward_mean": first.get("group_reward_mean"),
        "group_reward_std": first.get("group_reward_std"),
        "group_pass_at_k": first.get("group_pass_at_k"),
        "executions": executions,
        "prompts": [{"id": ids, "t": decoder.pieces(ids)} for ids in prompts],
        "vocab": {str(k): v for k, v in decoder.vocabulary(alternatives).items()},
        "special": sorted(decoder.special),
    }
