"""`agentroll rescore DIR -o NEW --reward SPEC`: its reward options are generate's (`RewardOptions`: the same
names, defaults, help and checks, one declaration), handed to `agentroll.rescore` whole as `RewardSettings`."""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from rich.text import Text

from ..errors import IncompleteRun
from ..rewards.options import RewardOptions
from ..settings.declare import default_of
from .console import err, failed, folder_tool, packed, run_async, setup_logging
from .generate import _parameter
from .help import Command, own_option, signed

FOLDER = typer.Argument(help="An output folder, or a merged one.", metavar="DIR", show_default=False)


def build() -> Any:
    params = [
        inspect.Parameter("folder", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[Path, FOLDER]),
        own_option("output", Path, ..., "--output", "-o", help="The new folder.", metavar="DIR"),
        own_option(
            "filter_uniform_groups",
            bool | None,
            None,
            "--filter-uniform-groups/--keep-uniform-groups",
            help="Leave out groups whose new outcomes are all alike (default: as the folder was made).",
        ),
        own_option("overwrite", bool, False, "--overwrite", help="Delete earlier rollouts in the new folder."),
        own_option(
            "failed_only",
            bool,
            False,
            "--failed-only",
            help="Score again only the samples the judge gave no verdict (--judge-failures keep); copy the rest.",
        ),
        own_option("quiet", bool, False, "--quiet", "-q", help="No warnings, no summary."),
    ]
    hints = get_type_hints(RewardOptions)
    for spec in fields(RewardOptions):  # --reward is asked for: rescoring by a default would be an accident
        params.append(_parameter(spec.name, spec, hints[spec.name], ... if spec.name == "reward" else default_of(spec)))

    def rescore(**kwargs: Any) -> None:
        """Score a folder's records again with another reward, no model called: a new folder, token for token."""
        from ..tools.rescoring import rescore as rescore_folder
        from .summary import head_to_head_lines, judge_line

        folder, output, quiet = kwargs.pop("folder"), kwargs.pop("output"), kwargs.pop("quiet")
        uniform, overwrite = kwargs.pop("filter_uniform_groups"), kwargs.pop("overwrite")
        failed_only = kwargs.pop("failed_only")
        restore = setup_logging(quiet, False)
        try:
            rewards = folder_tool(lambda: RewardOptions(**kwargs).reward_settings())
            result = folder_tool(
                lambda: run_async(
                    rescore_folder(
                        folder,
                        output,
                        rewards,
                        filter_uniform_groups=uniform,
                        overwrite=overwrite,
                        failed_only=failed_only,
                    )
                )
            )
        finally:
            restore()
        s = result.stats
        if not quiet:
            accuracy = s.report().get("system_accuracy")  # None when this run rescored no group (all done before)
            over = (
                f" over the {s.groups_written + s.groups_filtered} rescored (agentroll stats counts the "
                f"{s.groups_written} written)"
                if s.groups_filtered
                else ""
            )
            err.print(
                Text(
                    f"rescored {s.groups_written + s.groups_filtered} groups ({s.groups_filtered} filtered, "
                    f"{s.problems_skipped_done} done before) -> {output}; system accuracy "
                    f"{'-' if accuracy is None else f'{accuracy:.3f}'}{over}"
                ),
                soft_wrap=True,
            )
            for phrases in head_to_head_lines(s):  # a head-to-head folder: each policy, and who won, rescored
                err.print(packed(phrases, err.width))
            if s.judge_requests or s.judge_replayed:
                err.print(Text(judge_line(s)), soft_wrap=True)
        if not result.complete:  # a judge that gave no verdict: those groups are not written (exit 8)
            reasons = Counter(result.failures).most_common(1)
            raise typer.Exit(
                failed(
                    IncompleteRun(
                        f"{len(result.failures)} groups could not be rescored ({reasons[0][1]}x {reasons[0][0]}): "
                        "run the same command again to redo them"
                    ),
                    debug=False,
                )
            )

    return signed(rescore, params)


rescore = build()


def register(app: typer.Typer) -> None:
    app.command(cls=Command)(rescore)
