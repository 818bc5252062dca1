"""`agentroll convert DIR --to FORMAT -o OUT`: an output folder as a trainer's own input, token for token.

Every id and logprob is copied from the records; nothing is tokenized again. Formats (docs/convert.md says
which fields each has and which source of the target they were checked against):

- `dpo`: preference pairs within a (problem, stage) group, in TRL's preference layout plus the token ids;
- `sft`: the correct samples, chat messages plus `input_ids` / `labels` (-100 on the prompt);
- `trl`: per sample, what TRL's GRPO `rollout_func` returns;
- `slime`: `torch.save` files that slime's `--load-debug-rollout-data` loads;
- `megatron`: Megatron-LM's `RolloutGroup` / `TokenRollout` records;
- `verl`, `openrlhf`, `prime-rl`, `nemo-rl`, `nemo-rl-dpo`, `verifiers`, `skyrl`: what those trainers take
  (`formats.py`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..folder.manifest import Manifest
from ..tools.system import system_of, words
from .common import (
    ADVANTAGES,
    LAYOUTS,
    STDS,
    advantages,
    baseline,
    check_source,
    check_stages,
    discard,
    prepare_out,
    read_problems,
)
from .formats import FORMATS, SPECS, Options
from .messages import load_messages

__all__ = ["ADVANTAGES", "FORMATS", "LAYOUTS", "STDS", "advantages", "baseline", "convert"]


def convert(
    src: str | os.PathLike[str],
    to: str,
    out: str | os.PathLike[str],
    *,
    advantage: str | None = None,
    std: str | None = None,
    max_pairs_per_group: int | None = None,
    stages: list[str] | str | None = None,
    layout: str | None = None,
    tokenizer: str | None = None,
    groups_per_file: int | None = None,
    ranks: int | None = None,
    include_frozen: bool | None = None,
    trajectories: bool | None = None,
    policy: str | None = None,
    across_policies: bool = False,
    loss: str | None = None,
    teacher_topk: bool | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Converts the folder `src` into `out` (a folder) and returns a summary: format, records read, rows
    written, files, and what was left out or added (`skipped_frozen`, `dropped_overlong`: the samples
    `--overlong-filter drop` took out of training, never converted; `folded_turns`, `placeholders`,
    `left_over_problems`). Every option is checked before anything is written (`UsageError`, one line); a
    refusal found while reading (a prompt the conversational layout cannot recover) leaves no file, and no
    folder the conversion created.

    `advantage` (the formats whose trainer takes one): `none`, `grpo` (a conversation's reward minus its (problem,
    stage) group's mean over the K executions' conversations, over its std + the trainer's epsilon if not 0; every
    record of the conversation carries it: `agentroll.record.group`) or `mean` (minus the mean only); the default is the
    format's (`none`, or `mean` for prime-rl and verifiers, whose trainers need one). `std` (with `grpo`): `sample`
    (Bessel-corrected, `torch.std`: the default, as slime, TRL, OpenRLHF use it) or `population`. `stages`: the
    stages converted (all of the folder's system's by default). `max_pairs_per_group` (dpo, nemo-rl-dpo): most
    pairs per (problem, stage) group. `layout` (dpo, sft): `conversational` (default: chat messages, recovered
    from the rendered prompt with `tokenizer`, by default the run's) or `standard` (the prompt as text).
    `groups_per_file` (slime, prime-rl): problems per training step. `ranks` (prime-rl): data-parallel ranks.
    `include_frozen`: convert the records of frozen stages (`trainable: false`) too (default: no for the RL
    formats, yes for dpo, sft, nemo-rl-dpo); never those the overlong filter dropped. `trajectories` (the
    formats that take whole conversations; default on): a multi-turn conversation is one sample, from its last
    turn (docs/convert.md). A head-to-head folder (`generate --policy`): each policy's samples are groups of
    their own; `policy` converts one policy's records only; `across_policies` (dpo, nemo-rl-dpo) pairs a chosen
    and a rejected response of two different policies on the same prompt (docs/head-to-head.md). `loss`
    (prime-rl): `rl` (default), `ref_kl` (on-policy distillation on the teacher's scores alone: prime-rl's opd) or
    `rl+ref_kl`. `teacher_topk` (verl): the teacher's top k per row (default when the records hold them) or the
    next token's logprob alone. `overwrite`: replace this format's files.
    """
    src_path, out_path = Path(src), Path(out)
    spec = SPECS.get(to)
    if spec is None:
        raise UsageError(f"--to takes one of {', '.join(FORMATS)}, not {to!r}")
    advantage = spec.check(
        advantage, std, max_pairs_per_group, layout, tokenizer, groups_per_file, ranks, trajectories, loss, teacher_topk
    )
    if stages is not None:
        check_stages(stages, None)  # the names' form, before anything is read
    manifest = check_source(src_path, out_path)
    system = system_of(manifest)
    chosen_stages = check_stages(stages, system.stages)
    vocabulary, _ = words(system, warn=False)
    problems_in = manifest.groups
    if groups_per_file is not None and groups_per_file > problems_in:
        raise UsageError(
            f"--groups-per-file {groups_per_file}: {src_path} has {problems_in} problems, not enough "
            "for one whole training step"
        )
    across = check_policies(manifest, src_path, spec, policy, across_policies, system.stages)
    keep_frozen = include_frozen if include_frozen is not None else not spec.rl
    whole = spec.whole and trajectories is not False
    spec.require()
    chat = None
    if spec.chat and (layout or "conversational") == "conversational":
        chat = load_messages(
            manifest,
            tokenizer,
            None if spec.layout else f"use --to dpo --layout standard ({to} takes chat messages only)",
        )
    created = prepare_out(out_path, spec.names, spec.stale, overwrite)

    counts: dict[str, int] = {}
    chosen_std = std or "sample"

    def read() -> Any:
        counts.clear()
        return read_problems(
            src_path,
            chosen_stages,
            advantage,
            counts,
            include_frozen=keep_frozen,
            whole_conversations=whole,
            std=chosen_std,
            routes=spec.routes,
            policy=policy,
            whole_stage=vocabulary.whole_stage,
            epsilon=spec.epsilon,
        )

    options = Options(
        out_path,
        keep_frozen,
        chat,
        max_pairs_per_group,
        groups_per_file,
        ranks or 1,
        dict(manifest.settings or {}),
        across,
        loss or "rl",
        teacher_topk,
    )
    try:
        rows, files, extra = spec.write(read, options)
    except BaseException:  # refused while reading (a prompt the layout cannot recover...): leave nothing
        discard(out_path, spec.names, spec.stale, created)
        raise
    summary = {
        "format": to,
        "source": str(src_path),
        "complete": manifest.complete,
        "records": counts.get("records", 0),
        "rows": rows,
        "files": [str(f) for f in files],
        "stages": None if chosen_stages is None else list(chosen_stages),
        "advantage": advantage,
        **({"policy": policy} if policy is not None else {}),
        **({"across_policies": True} if across is not None else {}),
    }
    if advantage == "grpo":
        summary["std"] = chosen_std
    if loss is not None:
        summary["loss"] = loss
    left_out = ("held_by_judge", "skipped_frozen", "dropped_overlong", "folded_turns")
    summary.update({key: counts[key] for key in left_out if key in counts})
    if spec.rl and spec.advantage is None and counts.get("split_conversations"):
        summary["split_conversations"] = counts["split_conversations"]  # its trainer's baseline counts each per row
    summary.update(extra)
    return summary


def check_policies(
    manifest: Manifest, src: Path, spec: Any, policy: str | None, across: bool, stages: tuple[str, ...] | None
) -> str | None:
    """--policy and --across-policies against the folder: a head-to-head folder, a policy it has, pairs whose
    policies were given the same prompts. Returns the stage whose prompts `--across-policies` compares."""
    named = [p.get("name") for p in manifest.settings.get("policies") or [] if isinstance(p, dict)]
    if (policy is not None or across) and not named:
        flag = "--policy" if policy is not None else "--across-policies"
        raise UsageError(f"{flag}: {src} is not a head-to-head folder (made by generate --policy)")
    if policy is not None and policy not in named:
        raise UsageError(f"--policy {policy!r}: the folder's policies are {', '.join(map(str, named))}")
    if spec.name == "nemo-rl" and len(named) > 1 and policy is None:
        raise UsageError(
            f"--to nemo-rl: {src} holds {', '.join(map(str, named))}'s samples, and NeMo-RL's GRPO takes its "
            "baselines over the samples of identical prompt ids, which the policies share: one model's samples "
            "would be the other's baseline. Convert one policy at a time (--policy NAME)"
        )
    if not across:
        return None
    if not spec.pairs:
        raise UsageError(f"--across-policies is for --to dpo and nemo-rl-dpo (pairs), not {spec.name}")
    if policy is not None:
        raise UsageError("--across-policies pairs two policies: it does not go with --policy")
    differ = next((s for s in manifest.servers if s.get("prompt_ids") == "differ"), None)
    if differ is not None:
        raise UsageError(
            "--across-policies: the run that made the folder found that its policies render prompts differently "
            f"({', '.join(differ.get('policies') or {})}: their tokenizers or chat templates differ; manifest "
            "servers[].prompt_ids), so their prompt ids differ and no pair can share a prompt. Convert each policy "
            "on its own (--policy NAME)"
        )
    return stages[0] if stages else "solver"
