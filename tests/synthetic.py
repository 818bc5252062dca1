"""Output folders written by hand, for the systems the simulated server's runs do not cover in every shape:
multi-turn conversations (`turn`, `continues`, `history_mask`, `history_logprobs`), frozen stages
(`trainable: false`), user systems with their own stage names, a folder made before systems (no `system`).

Every record is an `agentroll.record.schema.Sample` (so exactly its fields), the figures are computed here from the
definitions in docs/schema.md, and the manifest's sizes and hashes are the bytes written. `edit` lets a test
damage records and keep the manifest true, so that only the damage is reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentroll.record.schema import SCHEMA_VERSION, STAGES, Sample

Record = dict[str, Any]

CRITIQUE_REVISE = {"name": "critique-revise", "stages": ["solver", "critic", "reviser"], "options": {}}
SINGLE = {"name": "single", "stages": ["solver"], "options": {}}
DEBATE = {"name": "debate.py:Debate", "stages": ["proposer", "judge"], "options": {"rounds": 1}}
THREE_STAGE = {"name": "three-stage", "stages": list(STAGES), "options": {}}


def call(
    pid: str,
    rid: str,
    k: int,
    size: int,
    stage: str,
    prompt: list[int],
    response: list[int],
    *,
    raw: float = 0.0,
    worker: int = 0,
    loss_mask: list[int] | None = None,
    trainable: bool = True,
    logprob: float = -0.25,
) -> Record:
    """One call as a record (figures filled in by `execution` and `folder`). Logprobs differ per token, so a
    shifted copy would not match."""
    logprobs = [logprob - i / 64 for i in range(len(response))]
    sample = Sample(
        problem_id=pid,
        problem_hash=f"h-{pid}",
        rollout_id=rid,
        sample_index=k,
        group_size=size,
        stage=stage,
        worker=worker,
        prompt=f"<{stage} prompt {' '.join(map(str, prompt[-3:]))}>",
        prompt_token_ids=list(prompt),
        response=f"<{stage} says {raw}>",
        response_token_ids=list(response),
        response_logprobs=logprobs,
        loss_mask=list(loss_mask) if loss_mask is not None else [1] * len(response),
        status="completed",
        finish_reason="stop",
        stop_reason=None,
        content=f"\\boxed{{{int(raw)}}}",
        raw_reward=raw,
        reward=raw,
        label="1",
        model="m",
        endpoint="http://e",
        latency_s=0.1,
        attempts=1,
        trainable=trainable,
    )
    return dataclasses.asdict(sample)


def continued(earlier: Record, injected: list[int], **kwargs: Any) -> Record:
    """The next turn of `earlier`'s conversation: its prompt + response + `injected` (the template's turn
    separator and the new message), the history marking the model's tokens of every earlier turn. `kwargs`:
    `call`'s, with `stage`, `response` and `position` (of `earlier` in the execution) required."""
    position = kwargs.pop("position")
    stage, response = kwargs.pop("stage"), kwargs.pop("response")
    prompt = earlier["prompt_token_ids"] + earlier["response_token_ids"] + injected
    record = call(
        earlier["problem_id"],
        earlier["rollout_id"],
        earlier["sample_index"],
        earlier["group_size"],
        stage,
        prompt,
        response,
        **kwargs,
    )
    before = earlier["history_mask"] or [0] * len(earlier["prompt_token_ids"])
    before_logprobs = earlier["history_logprobs"] or [0.0] * len(earlier["prompt_token_ids"])
    sampled = [x if m else 0.0 for x, m in zip(earlier["response_logprobs"], earlier["loss_mask"], strict=True)]
    record.update(
        turn=earlier["turn"] + 1,
        continues=position,
        history_mask=before + earlier["loss_mask"] + [0] * len(injected),
        history_logprobs=before_logprobs + sampled + [0.0] * len(injected),
    )
    return record


def conversation(
    pid: str, k: int, size: int, turns: int, raws: list[float], *, frozen_critic: bool = False, masked: bool = True
) -> list[Record]:
    """A critique-revise execution of `turns` records (1: the solver only; 3: solver, critic, reviser), one
    conversation. `masked`: the solver's response has a token outside its loss mask (a forced token), which the
    later turns' history must leave 0."""
    rid = f"{pid}-r{k}"
    base = 100 * (k + 1)
    solver = call(
        pid,
        rid,
        k,
        size,
        "solver",
        [1, 2, 3, 4, 5],
        [base + i for i in range(6)],
        raw=raws[0],
        loss_mask=[1, 1, 0, 1, 1, 1] if masked else None,
    )
    records = [solver]
    if turns >= 2:
        records.append(
            continued(
                solver,
                [7, 8, 9],
                position=0,
                stage="critic",
                response=[base + 20 + i for i in range(4)],
                raw=raws[1],
                trainable=not frozen_critic,
                logprob=-1.5,
            )
        )
    if turns >= 3:
        records.append(
            continued(
                records[1],
                [7, 10],
                position=1,
                stage="reviser",
                response=[base + 40 + i for i in range(5)],
                raw=raws[2],
                logprob=-0.5,
            )
        )
    return execution(records, final=records[-1]["raw_reward"])


def execution(records: list[Record], final: float) -> list[Record]:
    for r in records:
        r["rollout_size"], r["final_reward"] = len(records), final
    return records


def group(executions: list[list[Record]]) -> list[Record]:
    """The group figures of docs/schema.md on every record: over the executions' final rewards (mean, std,
    pass@k), and each stage's (problem, stage) baseline over its conversations (a stage's records of one
    execution chained by `continues`, each counted once, by its last record's reward)."""
    finals = [e[0]["final_reward"] for e in executions]
    mean = sum(finals) / len(finals)
    std = (sum((f - mean) ** 2 for f in finals) / len(finals)) ** 0.5
    passed = float(any(f == 1.0 for f in finals))
    chats: dict[str, list[list[Record]]] = {}
    for e in executions:
        root = list(range(len(e)))
        for i, r in enumerate(e):
            c = r.get("continues")
            if isinstance(c, int) and 0 <= c < i and e[c]["stage"] == r["stage"]:
                root[i] = root[c]
        own: dict[int, list[Record]] = {}
        for i, r in enumerate(e):
            own.setdefault(root[i], []).append(r)
        for chat in own.values():
            chats.setdefault(chat[0]["stage"], []).append(chat)
    records = [r for e in executions for r in e]
    for stage_chats in chats.values():
        members = [chat[-1]["reward"] for chat in stage_chats]
        stage_mean = sum(members) / len(members)
        for r in (r for chat in stage_chats for r in chat):
            r.update(
                group_reward_mean=mean,
                group_reward_std=std,
                group_pass_at_k=passed,
                stage_group_size=len(members),
                stage_group_reward_mean=stage_mean,
                stage_group_reward_std=(sum((x - stage_mean) ** 2 for x in members) / len(members)) ** 0.5,
            )
    return records


def write(
    folder: Path,
    shards: list[list[list[Record]]],
    system: dict[str, Any] | None,
    stage_settings: dict[str, Any] | None = None,
) -> Path:
    """`shards`: per shard, its groups (each a list of records). `system` None: a folder made before systems
    were pluggable (no `system` in its settings)."""
    folder.mkdir(parents=True)
    settings: dict[str, Any] = {"samples_per_prompt": shards[0][0][0]["group_size"], "tokenizer": "t"}
    if system is not None:
        settings.update(system=system, stage_settings=stage_settings or {})
    entries = []
    for i, groups in enumerate(shards):
        records = [r for g in groups for r in g]
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        name = f"rollouts-{i:05d}.jsonl"
        (folder / name).write_bytes(data)
        entries.append(
            {
                "file": name,
                "records": len(records),
                "executions": len({r["rollout_id"] for r in records}),
                "groups": len(groups),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
    manifest = {
        "format": "agentroll.rollouts",
        "schema_version": SCHEMA_VERSION,
        "complete": True,
        "records": sum(e["records"] for e in entries),
        "executions": sum(e["executions"] for e in entries),
        "groups": sum(e["groups"] for e in entries),
        "shards": entries,
        "settings": settings,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def critique_revise(folder: Path, *, frozen_critic: bool = False, system: dict[str, Any] | None = None) -> Path:
    """Two problems of two executions, in two shards: whole conversations, one that stopped after the solver
    and one after the critic."""
    a = group(
        [
            conversation("a", 0, 2, 3, [1.0, 0.0, 1.0], frozen_critic=frozen_critic),
            conversation("a", 1, 2, 1, [0.0], frozen_critic=frozen_critic),
        ]
    )
    b = group(
        [
            conversation("b", 0, 2, 2, [1.0, 1.0], frozen_critic=frozen_critic),
            conversation("b", 1, 2, 3, [0.0, 1.0, 0.0], frozen_critic=frozen_critic, masked=False),
        ]
    )
    return write(folder, [[a], [b]], CRITIQUE_REVISE if system is None else system)


def three_stage(folder: Path, system: dict[str, Any] | None = None) -> Path:
    """One problem, two executions of the three-stage system: two solvers, two rewriters, a selector whose
    judgment picks the second rewrite. `system` None: a folder made before systems (no `system` key)."""
    executions = []
    for k in range(2):
        rid = f"t-{k}"
        records = [call("t", rid, k, 2, "solver", [1, 2], [30 + w, 2], raw=float(w), worker=w) for w in range(2)]
        records += [
            call("t", rid, k, 2, "rewriter", [1, 2, 3], [40 + w, 2], raw=float(w == k), worker=w) for w in range(2)
        ]
        for w, r in enumerate(records[2:]):
            r["listed_as"] = w + 1
        selector = call("t", rid, k, 2, "selector", [1, 2, 3, 4], [2], raw=records[3]["raw_reward"])
        selector["judgment"] = 2
        records.append(selector)
        executions.append(execution(records, final=selector["raw_reward"]))
    return write(folder, [[group(executions)]], system)


def debate(folder: Path) -> Path:
    """A user system with its own stage names: two proposers and a frozen judge per execution, one turn each."""
    groups = []
    for pid in ("p", "q"):
        executions = []
        for k in range(2):
            rid = f"{pid}-d{k}"
            raws = [float((k + w) % 2) for w in range(2)]
            records = [
                call(pid, rid, k, 2, "proposer", [1, 2, 3], [50 + w, 51, 52 + k], raw=raws[w], worker=w)
                for w in range(2)
            ]
            records.append(
                call(pid, rid, k, 2, "judge", [1, 2, 3, 50, 51, 52], [60 + k, 2], raw=raws[k % 2], trainable=False)
            )
            executions.append(execution(records, final=records[-1]["raw_reward"]))
        groups.append(group(executions))
    return write(folder, [groups], DEBATE)


def edit(folder: Path, change: Callable[[list[Record]], None]) -> Path:
    """Apply `change` to the folder's records (all shards, in order), keeping the manifest's sizes and hashes
    true, so that validate reports only what the change did to the records."""
    manifest = json.loads((folder / "manifest.json").read_text())
    found = [[json.loads(line) for line in (folder / e["file"]).read_text().splitlines()] for e in manifest["shards"]]
    change([r for shard in found for r in shard])
    for entry, records in zip(manifest["shards"], found, strict=True):
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        (folder / entry["file"]).write_bytes(data)
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def records_of(folder: Path) -> list[Record]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [json.loads(line) for e in manifest["shards"] for line in (folder / e["file"]).read_text().splitlines()]
