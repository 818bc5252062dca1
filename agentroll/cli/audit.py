"""`agentroll audit DIR --model PATH_OR_ID` (agentroll.audit does the work). Importing this module does not import
torch; the command says how to get it when it is missing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..audit.options import BATCH_TOKENS, AuditOptions
from ..errors import AgentrollError, AuditFailed, UsageError
from .console import err, error, out
from .folders import FOLDER, opt
from .help import Command

TORCH_MISSING = (
    "agentroll audit needs PyTorch, which agentroll does not install by default: pip install 'agentroll[torch]'"
)


class Bar:
    """Conversations teacher-forced, out of those chosen (stderr; only on a terminal)."""

    def __init__(self, console: Console) -> None:
        self.bar = Progress(
            TextColumn("[bold]audit"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("audit", total=None, start=False)  # its clock starts after the model loads

    def start(self, total: int) -> None:
        self.bar.update(self.task, total=total)
        self.bar.start_task(self.task)
        self.bar.start()

    def advance(self, units: int) -> None:
        self.bar.advance(self.task, units)

    def stop(self) -> None:
        self.bar.stop()


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def stage_table(report: dict[str, Any]) -> Table:
    table = Table(title=Text(f"audit of {report['folder']}"), title_justify="left")
    names = ("stage", "records", "failed", "tokens", "mean |Δ|", "max |Δ|", "KL k3", "share over", "skipped", "outside")
    for name in names:
        table.add_column(name, justify="left" if name == "stage" else "right", overflow="fold")
    rows = [*report["stages"].items(), ("all", report["overall"])]
    for stage, f in rows:
        table.add_row(
            Text(stage),
            str(f["records"]),
            str(f["records_failed"]),
            str(f["tokens"]),
            _fmt(f["mean_abs"]),
            _fmt(f["max_abs"]),
            _fmt(f["kl_k3"]),
            _fmt(f["share_over"]),
            str(sum(f["tokens_skipped"].values())),  # not compared; the reasons are listed below the table
            str(f["tokens_outside"]),  # outside the filters: failures
        )
    return table


def audit_command(
    folder: Annotated[Path, FOLDER],
    model: Annotated[str, opt("--model", help="The trainer's model: a local path or a hub id.", metavar="PATH|ID")],
    tokenizer: Annotated[str | None, opt("--tokenizer", help="(default: the model's)", metavar="PATH|ID")] = None,
    sample: Annotated[
        int | None, opt("--sample", help="Audit N conversations, stratified by stage (default: all).", metavar="N")
    ] = None,
    seed: Annotated[int, opt("--seed", help="The --sample draw.", metavar="N")] = 0,
    dtype: Annotated[
        str, opt("--dtype", help="float32 | bfloat16 | float16 | auto (the checkpoint's).", metavar="DTYPE")
    ] = "float32",
    device: Annotated[str, opt("--device", help="auto | cpu | cuda | cuda:N | mps.", metavar="DEVICE")] = "auto",
    precision: Annotated[
        str | None,
        opt(
            "--precision",
            help="Tolerance preset: float32 | bfloat16 (default: from --dtype); bfloat16 when vLLM served in bfloat16.",
            metavar="PRESET",
        ),
    ] = None,
    logprobs_mode: Annotated[
        str, opt("--logprobs-mode", help="auto (the manifest's) | raw_logprobs | processed_logprobs.", metavar="MODE")
    ] = "auto",
    stages: Annotated[
        str | None, opt("--stages", help="Comma-separated stages (default: all of the run's model).", metavar="STAGES")
    ] = None,
    include_frozen: Annotated[bool, opt("--include-frozen", help="Also audit records of frozen stages.")] = False,
    policy: Annotated[
        str | None,
        opt("--policy", help="A head-to-head folder: this policy's records (default: the first's).", metavar="NAME"),
    ] = None,
    batch_tokens: Annotated[
        int, opt("--batch-tokens", help="Padded tokens per forward pass.", metavar="N")
    ] = BATCH_TOKENS,
    threshold: Annotated[
        float | None,
        opt("--threshold", help="|Δ| that counts a token as over (default: the preset's).", metavar="NUMBER"),
    ] = None,
    max_abs: Annotated[
        float | None, opt("--max-abs", help="Largest |Δ| allowed on a token (default: the preset's).", metavar="NUMBER")
    ] = None,
    max_mean: Annotated[
        float | None, opt("--max-mean", help="Largest mean |Δ| of a record (default: the preset's).", metavar="NUMBER")
    ] = None,
    max_share: Annotated[
        float | None,
        opt(
            "--max-share",
            help="Largest share of a record's tokens over the threshold (default: the preset's).",
            metavar="SHARE",
        ),
    ] = None,
    cut_noise: Annotated[
        float | None,
        opt(
            "--cut-noise",
            help="Logit noise assumed at top-k/top-p/min-p cuts (default: the preset's).",
            metavar="NUMBER",
        ),
    ] = None,
    worst: Annotated[int, opt("--worst", help="Records listed.", metavar="N")] = 10,
    template_check: Annotated[
        bool,
        opt(
            "--template-check/--no-template-check", help="Re-render first-turn prompts with the model's chat template."
        ),
    ] = True,
    accept_chat_template: Annotated[
        bool,
        opt(
            "--accept-chat-template",
            help="A run chat template other than the model's (by the manifest's hash) is a warning, not a failure.",
        ),
    ] = False,
    accept_unrendered: Annotated[
        bool,
        opt(
            "--accept-unrendered",
            help="First-turn prompts the template check cannot re-render are a warning, not a failure.",
        ),
    ] = False,
    against: Annotated[
        str,
        opt(
            "--against",
            help="policy: the sampled logprobs, --model the trainer's; teacher: a teacher's scores (--teacher, "
            "agentroll distill), --model that teacher.",
            metavar="policy|teacher",
        ),
    ] = "policy",
    json_: Annotated[bool, opt("--json", help="The report as JSON on stdout.")] = False,
    quiet: Annotated[bool, opt("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Recompute the recorded logprobs with the trainer's model (transformers, teacher forcing) and compare:
    exit 0 within tolerance, 10 otherwise (docs/audit.md)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        error(TORCH_MISSING)
        raise typer.Exit(UsageError.exit_code) from None
    from ..audit.run import audit

    overrides = {
        k: v
        for k, v in (
            ("threshold", threshold),
            ("max_abs", max_abs),
            ("mean_abs", max_mean),
            ("share", max_share),
            ("cut_noise", cut_noise),
        )
        if v is not None
    }
    try:
        options = AuditOptions(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            device=device,
            precision=precision,
            logprobs_mode=logprobs_mode,
            sample=sample,
            seed=seed,
            include_frozen=include_frozen,
            policy=policy,
            stages=frozenset(s.strip() for s in stages.split(",") if s.strip()) if stages else None,
            batch_tokens=batch_tokens,
            worst=worst,
            templates=template_check,
            accept_chat_template=accept_chat_template,
            accept_unrendered=accept_unrendered,
            overrides=overrides,
            against=against,
        )
        bar = Bar(err) if err.is_terminal and not quiet else None
        report = audit(folder, options, bar)
    except AgentrollError as exc:
        error(str(exc))
        raise typer.Exit(exc.exit_code) from None
    if json_:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        for warning in report["warnings"]:  # a person running it still sees them
            err.print(Text(f"warning: {warning}", style="bold yellow"), soft_wrap=True)
    else:
        from ..audit.report import lines

        console = out()
        console.print(stage_table(report))
        for line in lines(report):
            loud = line.startswith(("warning:", "fault (", "FAIL"))
            console.print(Text(line, style="bold yellow" if loud else ""), soft_wrap=True)
    raise typer.Exit(0 if report["ok"] else AuditFailed.exit_code)


def register(app: typer.Typer) -> None:
    app.command("audit", cls=Command)(audit_command)
