"""The folder tools: merge, validate, stats, inspect, convert, report, view (follow: `cli.follow`). Each error
is one line and exit 6 on a broken folder (the folder package says what is wrong)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.text import Text

from ..errors import OutputError
from .console import err, folder_tool, log, out
from .help import Command, help_text

# what a conversion's line says it left out or added
LEFT_OUT = ("held_by_judge", "skipped_frozen", "dropped_overlong", "folded_turns", "placeholders", "left_over_problems")
FOLDER = typer.Argument(help="An output folder, or a merged one.", metavar="DIR", show_default=False)


def opt(*decls: str, help: str, metavar: str = "", **kwargs: object) -> typer.models.OptionInfo:
    """An option with our help kept as written, and a metavar only when it takes a value."""
    return typer.Option(*decls, help=help_text(help), metavar=metavar, **kwargs)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    for command in (merge, validate, stats, convert, report, view):
        app.command(cls=Command)(command)
    app.command("inspect", cls=Command)(inspect_command)


def merge(
    folders: Annotated[
        list[Path], typer.Argument(help="Output folders of a split job.", metavar="DIR...", show_default=False)
    ],
    output: Annotated[Path, opt("--output", "-o", help="Folder for the merged manifest.", metavar="DIR")],
    copy: Annotated[bool, opt("--copy", help="Copy the shards in, instead of pointing at them.")] = False,
    verify: Annotated[bool, opt("--verify", help="Check every shard's sha256 first.")] = False,
    allow_incomplete: Annotated[
        bool,
        opt("--allow-incomplete", help="Merge a folder whose run did not complete (the merged manifest says which)."),
    ] = False,
    overwrite: Annotated[bool, opt("--overwrite", help="Replace an earlier merge in OUT.")] = False,
) -> None:
    """Join the manifests of several output folders (e.g. --partition slices) into one dataset."""
    from ..folder import merge as merge_folders

    merged = folder_tool(
        lambda: merge_folders(
            folders, output, copy=copy, verify=verify, allow_incomplete=allow_incomplete, overwrite=overwrite
        )
    )
    for part in merged.merged_from or []:
        if not part.get("complete"):
            log.warning("%s: its run did not complete; the merged folder says so (complete: false)", part["folder"])
    err.print(
        Text(
            f"merged {len(folders)} folders: {len(merged.shards)} shards, {merged.records} records, "
            f"{merged.executions} executions -> {output / 'manifest.json'}"
        )
    )


def validate(
    folder: Annotated[Path, FOLDER],
    max_faults: Annotated[int, opt("--max-faults", help="Faults listed after the first.", metavar="N")] = 20,
    json_: Annotated[bool, opt("--json", help="The whole report as JSON.")] = False,
) -> None:
    """Check a folder: sha256 and sizes, every record's schema, aligned lengths, whole groups (exit 6 on a fault)."""
    from ..tools.validate import validate as validate_folder

    report = validate_folder(folder)
    if json_:
        sys.stdout.buffer.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        console = out()
        for line in report.lines(max_faults):
            console.print(Text(line), soft_wrap=True)
    raise typer.Exit(0 if report.ok else OutputError.exit_code)


def stats(
    folder: Annotated[Path, FOLDER],
    by: Annotated[str | None, opt("--by", help="Split the report by this metadata field.", metavar="FIELD")] = None,
    json_: Annotated[bool, opt("--json", help="JSON instead of a table.")] = False,
) -> None:
    """The system's report recomputed from the records: per stage, accuracies, pass@k, truncation, tokens."""
    from ..tools.headtohead import tables
    from ..tools.report import stats as folder_stats
    from ..tools.report import stats_table

    data = folder_tool(lambda: folder_stats(folder, by))
    if data.get("unfinished"):  # on stderr, as validate and report say it: --json's stdout stays the data
        err.print(
            Text(f"warning: {folder}: {data['unfinished']}; the figures are of the groups on disk"), soft_wrap=True
        )
    if json_:
        sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        out().print(stats_table(data))
        for table in tables(data):  # a head-to-head folder (generate --policy): the policies compared
            out().print(table)


def inspect_command(
    folder: Annotated[Path, FOLDER],
    problem: Annotated[
        str | None, opt("--problem", help="This problem's executions (default: the first group's first).", metavar="ID")
    ] = None,
) -> None:
    """Draw a rollout as a tree: the system's stages, with rewards, truncations and the judgment."""
    from ..tools.inspect import inspect as inspect_folder

    out().print(folder_tool(lambda: inspect_folder(folder, problem)))


def convert(
    folder: Annotated[Path, FOLDER],
    to: Annotated[
        str,
        opt(
            "--to",
            help="dpo | sft | trl | slime | megatron | verl | openrlhf | prime-rl | nemo-rl | "
            "nemo-rl-dpo | verifiers | skyrl",
            metavar="FORMAT",
        ),
    ],
    output: Annotated[Path, opt("--output", "-o", help="Folder for the converted files.", metavar="DIR")],
    advantage: Annotated[
        str | None,
        opt(
            "--advantage",
            help="none | grpo | mean, per (problem, stage), for the "
            "formats whose trainer takes one (default: the "
            "format's).",
            metavar="KIND",
            show_default=False,
        ),
    ] = None,
    std: Annotated[
        str | None,
        opt(
            "--std",
            help="--advantage grpo: sample (Bessel, torch.std: the default) | population.",
            metavar="STD",
            show_default=False,
        ),
    ] = None,
    stages: Annotated[
        str | None, opt("--stages", help="Comma-separated stages (default: all).", metavar="STAGES")
    ] = None,
    max_pairs_per_group: Annotated[
        int | None, opt("--max-pairs-per-group", help="dpo, nemo-rl-dpo: most pairs per (problem, stage).", metavar="N")
    ] = None,
    layout: Annotated[
        str | None, opt("--layout", help="dpo, sft: conversational (default) | standard.", metavar="LAYOUT")
    ] = None,
    tokenizer: Annotated[
        str | None,
        opt(
            "--tokenizer",
            help="dpo, sft, nemo-rl-dpo: to recover chat messages (default: the run's).",
            metavar="PATH|ID",
        ),
    ] = None,
    groups_per_file: Annotated[
        int | None, opt("--groups-per-file", help="slime, prime-rl: problems per training step.", metavar="N")
    ] = None,
    ranks: Annotated[
        int | None, opt("--ranks", help="prime-rl: data-parallel ranks (rank_R.bin files per step).", metavar="R")
    ] = None,
    include_frozen: Annotated[
        bool | None,
        opt(
            "--include-frozen/--skip-frozen",
            help="Keep records of frozen stages (trainable false), trained as "
            "generated; the RL formats skip them by default.",
            show_default=False,
        ),
    ] = None,
    trajectories: Annotated[
        bool | None,
        opt(
            "--trajectories/--no-trajectories",
            help="slime, megatron and the newer formats: one sample per multi-turn "
            "conversation, from its last turn (default), or one per turn.",
            show_default=False,
        ),
    ] = None,
    policy: Annotated[
        str | None,
        opt("--policy", help="A head-to-head folder (generate --policy): this policy's records only.", metavar="NAME"),
    ] = None,
    across_policies: Annotated[
        bool,
        opt(
            "--across-policies",
            help="dpo, nemo-rl-dpo on a head-to-head folder: chosen and rejected from two different policies on "
            "the same prompt.",
        ),
    ] = False,
    loss: Annotated[
        str | None,
        opt(
            "--loss",
            help="prime-rl: rl (default) | ref_kl (distillation on the teacher's scores: prime-rl's opd) | rl+ref_kl.",
            metavar="KIND",
            show_default=False,
        ),
    ] = None,
    teacher_topk: Annotated[
        bool | None,
        opt(
            "--teacher-topk/--teacher-sampled",
            help="verl: the teacher's top k per token (default when the records hold them) or the sampled "
            "token's logprob alone.",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[bool, opt("--overwrite", help="Replace this format's files in OUT.")] = False,
) -> None:
    """Turn a folder into what a trainer loads: TRL DPO pairs, SFT data, TRL GRPO rollouts, slime, Megatron, verl,
    OpenRLHF, prime-rl, NeMo-RL, verifiers, SkyRL."""
    from ..convert import convert as convert_folder

    summary = folder_tool(
        lambda: convert_folder(
            folder,
            to,
            output,
            advantage=advantage,
            std=std,
            max_pairs_per_group=max_pairs_per_group,
            stages=stages,
            layout=layout,
            tokenizer=tokenizer,
            groups_per_file=groups_per_file,
            ranks=ranks,
            include_frozen=include_frozen,
            trajectories=trajectories,
            policy=policy,
            across_policies=across_policies,
            loss=loss,
            teacher_topk=teacher_topk,
            overwrite=overwrite,
        )
    )
    extra = "".join(f", {summary[k]} {k.replace('_', ' ')}" for k in LEFT_OUT if summary.get(k))
    if summary.get("split_conversations"):  # once per conversion (docs/convert.md, Baselines)
        err.print(
            Text(
                f"warning: {summary['split_conversations']} conversations are written as several {to} rows (an "
                f"agent's branches, or calls without --trajectories); {to}'s trainer takes its GRPO baseline over "
                "the rows of a group id, so each counts once per row there, not once per conversation. For one "
                "advantage per conversation convert to a format agentroll computes it for (trl, openrlhf, slime, "
                "prime-rl, verifiers)"
            ),
            soft_wrap=True,
        )
    err.print(
        Text(
            f"{summary['records']} records -> {summary['rows']} {to} rows in "
            f"{', '.join(map(str, summary['files']))}{extra}"
        ),
        soft_wrap=True,
    )


def report(
    folder: Annotated[Path, FOLDER],
    output: Annotated[Path, opt("--output", "-o", help="The HTML file to write.", metavar="FILE")],
    by: Annotated[str | None, opt("--by", help="Split the figures by this metadata field.", metavar="FIELD")] = None,
) -> None:
    """One self-contained HTML page of charts (no network): rewards, accuracies, lengths, pass@k, throughput."""
    from ..tools.html import report as html_report

    made = folder_tool(lambda: html_report(folder, output, by))
    err.print(Text(f"{made['charts']} charts -> {made['output']} ({made['bytes']:,} bytes)"))


def view(
    folder: Annotated[Path, FOLDER],
    port: Annotated[
        int | None, opt("--port", "-p", help="Serve on this port (0: any free one).", metavar="P", show_default=False)
    ] = None,
    output: Annotated[
        Path | None,
        opt("--output", "-o", help="Write the page as one file instead (a small folder, or --sample).", metavar="FILE"),
    ] = None,
    sample: Annotated[int | None, opt("--sample", help="-o: N groups drawn at random.", metavar="N")] = None,
    seed: Annotated[int, opt("--seed", help="--sample's random seed.", metavar="S")] = 0,
    tokenizer: Annotated[
        str | None, opt("--tokenizer", help="Decode the tokens with this (default: the run's).", metavar="PATH|ID")
    ] = None,
    audit: Annotated[
        Path | None, opt("--audit", help="What agentroll audit --json found, to mark its records.", metavar="FILE")
    ] = None,
    host: Annotated[
        str,
        opt(
            "--host",
            help="Listen on this address (anything but loopback serves the folder to the network).",
            metavar="ADDR",
        ),
    ] = "127.0.0.1",
) -> None:
    """Browse every conversation of a folder, token by token: a page served on loopback (following a live run), or
    written as one file."""
    from ..tools import view as viewer

    if output is not None and port is not None:
        raise typer.BadParameter("-o writes a file, --port serves the page: give one of them")
    if sample is not None and output is None:
        raise typer.BadParameter("--sample N picks the groups of a page written with -o")
    index = folder_tool(lambda: viewer.open_folder(folder, tokenizer, audit, follow=output is None))
    if output is not None:
        made = folder_tool(lambda: viewer.write(index, output, sample, seed))
        of = f" (a sample of {made['of']:,})" if sample is not None else ""
        err.print(
            Text(
                f"{made['groups']:,} groups{of}, {made['records']:,} records -> {made['output']} "
                f"({made['bytes']:,} bytes)"
            )
        )
        return

    def ready(url: str) -> None:
        err.print(Text(f"agentroll view: {folder} at {url} (Ctrl-C stops it)"), soft_wrap=True)

    folder_tool(lambda: viewer.serve(index, host, DEFAULT_PORT if port is None else port, ready))


DEFAULT_PORT = 8377
