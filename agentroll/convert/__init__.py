"""`agentroll convert DIR --to FORMAT -o OUT`: an output folder as a trainer's own input, token for token.

Every id and logprob is copied from the records; nothing is tokenized again. Formats (docs/convert.md says
which fields each has and which source of the target they were checked against):

- `dpo`: preference pairs within a (problem, stage) group, in TRL's preference layout plus the token ids;
- `sft`: the correct samples, chat messages plus `input_ids` / `labels` (-100 on the prompt);
- `trl`: per sample, what TRL's GRPO `rollout_func` returns;
- `slime`: `torch.save` files that slime's `--load-debug-rollout-data` loads;
- `megatron`: Megatron-LM's `RolloutGroup` / `TokenRollout` records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..tools.system import system_of
from . import dpo, megatron, sft, slime, trl
from .common import (
    ADVANTAGES,
    LAYOUTS,
    advantages,
    baseline,
    check_source,
    check_stages,
    load_messages,
    prepare_out,
    read_problems,
)

__all__ = ["ADVANTAGES", "FORMATS", "LAYOUTS", "advantages", "baseline", "convert"]

FORMATS = ("dpo", "sft", "trl", "slime", "megatron")
_FILES = {"dpo": dpo.FILE, "sft": sft.FILE, "trl": trl.FILE, "slime": slime.FILE, "megatron": megatron.FILE}


RL_FORMATS = ("trl", "slime", "megatron")  # a frozen stage's samples are not the policy's: skipped by default


def convert(src: str | os.PathLike[str], to: str, out: str | os.PathLike[str], *, advantage: str = "none",
            max_pairs_per_group: int | None = None, stages: list[str] | str | None = None,
            layout: str | None = None, tokenizer: str | None = None, groups_per_file: int | None = None,
            include_frozen: bool | None = None, trajectories: bool | None = None,
            overwrite: bool = False) -> dict[str, Any]:
    """Converts the folder `src` into `out` (a folder) and returns a summary: format, records read, rows
    written, files (and, for trl, slime and megatron, `skipped_frozen`; for slime, `folded_turns`). Every
    option is checked before anything is written (`UsageError`, one line).

    `advantage` (trl, slime, megatron): `none`, `grpo` (reward minus its (problem, stage) group's mean, over
    the group's population std when that is not 0) or `mean` (minus the mean only). `stages`: the stages
    converted (all of the folder's system's by default). `max_pairs_per_group` (dpo): most pairs per (problem,
    stage) group. `layout` (dpo, sft): `conversational` (default: chat messages, recovered from the rendered
    prompt with `tokenizer`, by default the run's) or `standard` (the prompt as text). `groups_per_file`
    (slime): problems per .pt file, one file per training step. `include_frozen`: convert the records marked
    `trainable: false` too (default: no for trl, slime and megatron, yes for dpo and sft). `trajectories`
    (slime, default on): a multi-turn conversation is one sample, from its last turn (docs/convert.md).
    `overwrite`: replace this format's files already in `out`.
    """
    src_path, out_path = Path(src), Path(out)
    _check_options(to, advantage, max_pairs_per_group, layout, tokenizer, groups_per_file)
    if trajectories is not None and to != "slime":
        raise UsageError(f"trajectories is for --to slime, not {to}")
    if stages is not None:
        check_stages(stages, None)  # the names' form, before anything is read
    manifest = check_source(src_path, out_path)
    system = system_of(manifest)
    chosen_stages = check_stages(stages, system.stages)
    keep_frozen = include_frozen if include_frozen is not None else to not in RL_FORMATS
    whole = to == "slime" and trajectories is not False
    if to == "slime":
        slime.require_torch()
    chat = None
    if to in ("dpo", "sft") and (layout or "conversational") == "conversational":
        chat = load_messages(manifest, tokenizer)
    prepare_out(out_path, [_FILES[to]], slime.PT_PATTERN if to == "slime" else None, overwrite)

    counts: dict[str, int] = {}
    problems = read_problems(src_path, chosen_stages, advantage, counts, include_frozen=keep_frozen,
                             whole_conversations=whole)
    files = [out_path / _FILES[to]]
    if to == "dpo":
        rows = dpo.write(problems, out_path, chat, max_pairs_per_group)
    elif to == "sft":
        rows = sft.write(problems, out_path, chat)
    elif to == "trl":
        rows = trl.write(problems, out_path)
    elif to == "megatron":
        rows = megatron.write(problems, out_path)
    else:
        rows, files = slime.write(problems, out_path, groups_per_file)
    summary = {"format": to, "source": str(src_path), "complete": manifest.complete,
               "records": counts.get("records", 0), "rows": rows, "files": [str(f) for f in files],
               "stages": None if chosen_stages is None else list(chosen_stages), "advantage": advantage}
    summary.update({key: counts[key] for key in ("skipped_frozen", "folded_turns") if key in counts})
    return summary


def _check_options(to: str, advantage: str, max_pairs: int | None, layout: str | None, tokenizer: str | None,
                   groups_per_file: int | None) -> None:
    if to not in FORMATS:
        raise UsageError(f"--to takes one of {', '.join(FORMATS)}, not {to!r}")
    if advantage not in ADVANTAGES:
        raise UsageError(f"--advantage takes one of {', '.join(ADVANTAGES)}, not {advantage!r}")
    if advantage != "none" and to in ("dpo", "sft"):
        raise UsageError(f"--advantage is for trl, slime and megatron: {to} rows carry rewards, not advantages")
    only = {"--max-pairs-per-group": (max_pairs, ("dpo",)), "--layout": (layout, ("dpo", "sft")),
            "--tokenizer": (tokenizer, ("dpo", "sft")), "--groups-per-file": (groups_per_file, ("slime",))}
    for flag, (value, formats) in only.items():
        if value is not None and to not in formats:
            raise UsageError(f"{flag} is for --to {' and '.join(formats)}, not {to}")
    for flag, number in (("--max-pairs-per-group", max_pairs), ("--groups-per-file", groups_per_file)):
        if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
            raise UsageError(f"{flag} takes a whole number of at least 1, not {number!r}")
    if layout is not None and layout not in LAYOUTS:
        raise UsageError(f"--layout takes one of {', '.join(LAYOUTS)}, not {layout!r}")
    if tokenizer is not None and layout == "standard":
        raise UsageError("--tokenizer is for --layout conversational (it recovers the chat messages)")
