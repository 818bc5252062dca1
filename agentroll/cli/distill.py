"""`agentroll distill DIR -o NEW --teacher URL`: its teacher options are generate's (`TeacherOptions`: the same
names, defaults, help and checks, one declaration), handed to `agentroll.distill` whole."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer
from rich.text import Text

from ..errors import AgentrollError, IncompleteRun
from ..settings.declare import default_of
from ..teacher.settings import TeacherOptions, client_of, stage_teachers
from .console import err, error, log, packed, run_async, setup_logging
from .generate import _parameter
from .help import Command, own_option, signed
from .keys import TEACHER_KEY_WARNING
from .progress import LogLines, RichBar
from .summary import teacher_lines, teacher_table

FOLDER = typer.Argument(help="An output folder, or a merged one.", metavar="DIR", show_default=False)


def build() -> Any:
    params = [
        inspect.Parameter("folder", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[Path, FOLDER]),
        own_option("output", Path, ..., "--output", "-o", help="The new folder.", metavar="DIR"),
    ]
    hints = get_type_hints(TeacherOptions)
    for spec in fields(TeacherOptions):  # --teacher is asked for: there is nothing to do without one
        params.append(_parameter(spec.name, spec, hints[spec.name], default_of(spec)))
    params += [
        own_option(
            "stage",
            list[str] | None,
            None,
            "--stage",
            help="STAGE.teacher=URL|none or STAGE.teacher_model=NAME: a stage scored by another teacher, or by "
            "none (repeatable); a frozen stage is scored only when asked.",
            metavar="STAGE.KEY=VALUE",
        ),
        own_option(
            "tokenizer",
            str | None,
            None,
            "--tokenizer",
            help="The student's tokenizer, whose token ids the teacher must share (default: the folder's).",
            metavar="PATH|ID",
        ),
        own_option(
            "max_retries", int, 5, "--max-retries", help="Retries per scoring call for transient failures.", metavar="N"
        ),
        own_option(
            "request_timeout",
            float,
            3600.0,
            "--request-timeout",
            help="Seconds per scoring attempt.",
            metavar="SECONDS",
        ),
        own_option(
            "connect_timeout", float, 10.0, "--connect-timeout", help="Seconds to open a connection.", metavar="SECONDS"
        ),
        own_option("overwrite", bool, False, "--overwrite", help="Delete earlier rollouts in the new folder."),
        own_option("quiet", bool, False, "--quiet", "-q", help="No progress, no summary."),
    ]

    def distill(**kwargs: Any) -> None:
        """Add a teacher's logprobs on every sampled token to a finished folder: a new folder, token for token."""
        from ..tools.distilling import distill as distill_folder

        folder, output, quiet = kwargs.pop("folder"), kwargs.pop("output"), kwargs.pop("quiet")
        stage, tokenizer, overwrite = kwargs.pop("stage"), kwargs.pop("tokenizer"), kwargs.pop("overwrite")
        retries = (kwargs.pop("max_retries"), kwargs.pop("request_timeout"), kwargs.pop("connect_timeout"))
        restore = setup_logging(quiet, False)
        if kwargs.get("teacher_api_key") and kwargs.get("teacher_api_key_file") is None:  # both: refused
            log.warning(TEACHER_KEY_WARNING)
        progress = None if quiet else RichBar() if err.is_terminal else LogLines()
        try:
            options = TeacherOptions(**{k: v for k, v in kwargs.items() if v is not None})
            result = run_async(
                distill_folder(
                    folder,
                    output,
                    options,
                    stages=stage_teachers(stage or []),
                    tokenizer=tokenizer,
                    overwrite=overwrite,
                    client=client_of(*retries),
                    progress=progress,
                )
            )
        except AgentrollError as exc:
            error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        finally:
            restore()
        s = result.stats
        if not quiet:
            if s.teacher:
                err.print(teacher_table(s))
            lines = [
                [
                    f"distilled {s.groups_written} groups ({s.problems_skipped_done} done before, "
                    f"{s.groups_failed} not written) -> {output}",
                    f"{result.wall_s:.1f}s",
                ],
                *teacher_lines(result.teachers),
            ]
            err.print(Text("\n".join(packed(phrases, err.width) for phrases in lines)))
        if not result.complete:
            missing = IncompleteRun(
                f"{s.groups_failed} groups could not be scored (see the warnings above): run the same command "
                "again to score them"
            )
            error(str(missing))
            raise typer.Exit(missing.exit_code)

    return signed(distill, params)


distill = build()


def register(app: typer.Typer) -> None:
    app.command(cls=Command)(distill)
