"""`agentroll audit DIR --model PATH_OR_ID`: the typer command (registered by agentroll.cli). Importing this
module does not import torch; the command says how to get it when it is missing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import AgentrollError, AuditFailed, UsageError
from .options import AuditOptions

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
        self.task = self.bar.add_task("audit", total=None)

    def start(self, total: int) -> None:
        self.bar.update(self.task, total=total)
        self.bar.start()

    def advance(self, units: int) -> None:
        self.bar.advance(self.task, units)

    def stop(self) -> None:
        self.bar.stop()


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def stage_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"audit of {report['folder']}", title_justify="left")
    for name in ("stage", "records", "failed", "tokens", "mean |Δ|", "max |Δ|", "KL k3", "share over", "skipped"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    rows = [*report["stages"].items(), ("all", report["overall"])]
    for stage, f in rows:
        table.add_row(
            stage,
            str(f["records"]),
            str(f["records_failed"]),
            str(f["tokens"]),
            _fmt(f["mean_abs"]),
            _fmt(f["max_abs"]),
            _fmt(f["kl_k3"]),
            _fmt(f["share_over"]),
            str(sum(f["tokens_skipped"].values()) + f["tokens_outside"]),
        )
    return table


def audit_command(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    model: Annotated[str, typer.Option(help="The trainer's model: a local path or a hub id.")],
    tokenizer: Annotated[str | None, typer.Option(help="(default: the model's)")] = None,
    sample: Annotated[
        int | None, typer.Option(help="Audit N conversations, stratified by stage (default: all).")
    ] = None,
    seed: Annotated[int, typer.Option(help="The --sample draw.")] = 0,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16 | auto (the checkpoint's).")] = "float32",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = "auto",
    precision: Annotated[
        str | None,
        typer.Option(
            help="Tolerance preset: float32 | bfloat16 (default: from --dtype); bfloat16 when vLLM served in bfloat16."
        ),
    ] = None,
    logprobs_mode: Annotated[
        str, typer.Option(help="auto (the manifest's) | raw_logprobs | processed_logprobs.")
    ] = "auto",
    stages: Annotated[
        str | None, typer.Option(help="Comma-separated stages (default: all of the run's model).")
    ] = None,
    include_frozen: Annotated[bool, typer.Option(help="Also audit records of frozen stages.")] = False,
    batch_tokens: Annotated[int, typer.Option(help="Padded tokens per forward pass.")] = 4096,
    threshold: Annotated[
        float | None, typer.Option(help="|Δ| that counts a token as over (default: the preset's).")
    ] = None,
    max_abs: Annotated[
        float | None, typer.Option(help="Largest |Δ| allowed on a token (default: the preset's).")
    ] = None,
    max_mean: Annotated[
        float | None, typer.Option(help="Largest mean |Δ| of a record (default: the preset's).")
    ] = None,
    max_share: Annotated[
        float | None,
        typer.Option(help="Largest share of a record's tokens over the threshold (default: the preset's)."),
    ] = None,
    cut_noise: Annotated[
        float | None, typer.Option(help="Logit noise assumed at top-k/top-p/min-p cuts (default: the preset's).")
    ] = None,
    worst: Annotated[int, typer.Option(help="Records listed.")] = 10,
    template_check: Annotated[
        bool, typer.Option(help="Re-render first-turn prompts with the model's chat template.")
    ] = True,
    json_: Annotated[bool, typer.Option("--json", help="The report as JSON on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Recompute the recorded logprobs with the trainer's model (transformers, teacher forcing) and compare:
    exit 0 within tolerance, 10 otherwise (docs/audit.md)."""
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        err.print(f"error: {TORCH_MISSING}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(UsageError.exit_code) from None
    from .run import audit

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
            stages=frozenset(s.strip() for s in stages.split(",") if s.strip()) if stages else None,
            batch_tokens=batch_tokens,
            worst=worst,
            templates=template_check,
            overrides=overrides,
        )
        bar = Bar(err) if err.is_terminal and not quiet else None
        report = audit(folder, options, bar)
    except AgentrollError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    if json_:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from .report import lines

        out = Console(width=None if sys.stdout.isatty() else 200)
        out.print(stage_table(report))
        for line in lines(report):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if report["ok"] else AuditFailed.exit_code)
