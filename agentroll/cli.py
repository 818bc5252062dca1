"""The `agentroll` command: the only module that knows typer and rich. Errors become one line and an exit code."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import signal
import sys
import time
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import orjson
import typer
from rich.console import Console
from rich.console import Group as RenderGroup
from rich.highlighter import NullHighlighter
from rich.live import Live
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .client import ClientCounters
from .errors import AgentrollError, IncompleteRun, OutputError, PipeClosed
from .options import GenerateOptions, default_of
from .progress import Progress as ProgressHook
from .progress import Rates, counts, done_line, duration
from .resources import samples_dir, sim_tokenizer_dir
from .runner import RUN_OPTION_NAMES, Runner, RunOptions, RunResult
from .stats import RunStats

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Rewarded, token-exact multi-agent rollouts from a vLLM server.")
err = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
log = logging.getLogger("agentroll")


class Repeats(logging.Filter):
    """A warning said again is said once more at 10, 100, 1000... times, with its count, and summed up at the end:
    one line per event, never a screenful of the same line."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        n = self.counts[text] = self.counts.get(text, 0) + 1
        if n == 1:
            return True
        if math.log10(n).is_integer():
            record.msg, record.args = f"{text} (said {n} times so far)", ()
            return True
        return False

    def said(self) -> list[str]:
        return [f"said {n} times in all: {text}" for text, n in self.counts.items() if n > 1]


REPEATS = Repeats()


def _setup_logging(quiet: bool, debug: bool) -> None:
    level = logging.DEBUG if debug else logging.ERROR if quiet else logging.INFO
    if err.is_terminal:
        handler: logging.Handler = RichHandler(console=err, show_path=False, show_time=False, markup=False,
                                               highlighter=NullHighlighter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s agentroll %(levelname)s %(message)s"))
    REPEATS.counts.clear()
    handler.addFilter(REPEATS)
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class RichBar(ProgressHook):
    """On a terminal: a bar of groups settled (written, filtered, failed, invalid or already done) out of the rows
    to read, with rates and ETA, and under it the calls in flight, the running reward and the failures."""

    interval_s = 0.5

    def __init__(self) -> None:
        self.bar = Progress(TextColumn("groups"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rates]}", markup=False), TimeElapsedColumn(), console=err)
        self.task = self.bar.add_task("gen", total=None, rates="")
        self.status = Text("")
        self.live = Live(RenderGroup(self.bar, self.status), console=err, transient=True, refresh_per_second=2)
        self.rates = Rates()
        self.total: int | None = None

    def start(self, total: int | None) -> None:
        self.total = total
        self.bar.update(self.task, total=total)
        self.live.start()

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        self.rates.add(stats.groups_settled, requests.requests)
        eta = duration(self.rates.eta_s(self.total, stats.groups_settled))
        rates = (f"{self.rates.groups_per_s:.2f} groups/s  {self.rates.requests_per_s:.1f} req/s  ETA {eta}")
        self.bar.update(self.task, completed=stats.groups_settled, rates=rates)
        self.status.plain = counts(stats, requests)

    def stop(self) -> None:
        self.live.stop()


class LogLines(ProgressHook):
    """No terminal (cron, CI): a timestamped line at the start, at least every `every_s` seconds, and at the end,
    each with done/total, rates and ETA."""

    interval_s = 1.0

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s, self.last = every_s, -math.inf
        self.rates = Rates()
        self.total: int | None = None
        self.seen: tuple[RunStats, ClientCounters] | None = None

    def start(self, total: int | None) -> None:
        self.total = total
        self.advance(RunStats(), ClientCounters())

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        self.seen = (stats, requests)
        self.rates.add(stats.groups_settled, requests.requests)
        if time.monotonic() - self.last >= self.every_s:
            self._say()

    def _say(self) -> None:
        assert self.seen is not None
        self.last = time.monotonic()
        stats, requests = self.seen
        log.info("progress: %s; %s", done_line(stats, requests, self.total, self.rates), counts(stats, requests))

    def stop(self) -> None:
        if self.seen is not None:
            self._say()


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


ACCURACY_NAMES = {"majority_vote": "majority vote", "best_of_n": "best of N", "selector_pick": "selector (its pick)"}


def _accuracies(report: dict[str, float | None]) -> str:
    names = [k.removesuffix("_accuracy") for k in report if k.endswith("_accuracy")]
    return ", ".join(f"{ACCURACY_NAMES.get(n, n)} {_fmt(report[n + '_accuracy'])}" for n in names)


def print_summary(result: RunResult) -> None:
    s, r = result.stats, result.requests
    table = Table(title=f"agentroll generate: {result.model} -> {result.output}", show_header=True)
    for column in ("stage", "samples", "mean raw reward", "truncated", "tokens (prompt/response)", "failed",
                   "skipped"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for name, st in s.stages.items():
        table.add_row(name, str(st.samples), _fmt(st.mean_raw_reward), str(st.truncated),
                      f"{st.prompt_tokens}/{st.response_tokens}", str(st.failed_calls), str(st.skipped_calls))
    err.print(table)
    d = s.to_dict()
    rep = d["report"]
    rate = r.requests / result.wall_s if result.wall_s else 0.0
    err.print(
        f"problems {s.problems} (already done {s.problems_skipped_done}), executions {s.executions}, "
        f"records {s.records_written}, invalid rows {s.invalid_rows}\n"
        f"accuracy: {_accuracies(rep)}\n"
        f"groups written {s.groups_written}, filtered {s.groups_filtered}, resampled {s.groups_resampled}, "
        f"missing {result.missing_groups}; reward timeouts {s.reward_timeouts}, errors {s.reward_errors}, "
        f"refused values {s.reward_invalid}\n"
        f"truncation rate {_fmt(d['truncation_rate'])}, "
        f"requests {r.requests}, retries {r.retries}, failures {r.failures}, peak in flight {r.peak_in_flight}, "
        f"wall {result.wall_s:.1f}s, {rate:.1f} requests/s"
        + ("\nconcurrency (auto, settled): " + ", ".join(f"{url} {limit}" for url, limit in r.concurrency.items())
           if r.concurrency else "")
    )


def run_async(coroutine: Any) -> Any:
    """On uvloop when it is installed (`pip install agentroll[fast]`), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


DOUBLE_S = 1.0  # two interrupts this close are one said twice (a terminal's, `timeout -s INT`'s)


async def _supervised(runner: Runner) -> int | None:
    """Run, turning the first SIGINT/SIGTERM into a cancellation (the runner closes the folder cleanly); a
    second one, a second or more later, exits at once (the next run repairs the partial shard). Returns the
    signal number, if any."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(runner.run())
    received: list[int] = []
    first = 0.0

    def on_signal(signum: int) -> None:
        nonlocal first
        if received:
            if time.monotonic() - first < DOUBLE_S:
                log.debug("%s again within %.0fs: taken as the same interrupt", signal.Signals(signum).name,
                          DOUBLE_S)
                return
            log.error("second interrupt: stopping at once")
            os._exit(128 + signum)
        received.append(signum)
        first = time.monotonic()
        log.warning("%s: finishing up; the output folder stays resumable (interrupt again to stop at once)",
                    signal.Signals(signum).name)
        task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return received[0] if received else None


def _error(message: str) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", markup=True, highlight=False, soft_wrap=True)


def run_generate(run: dict[str, Any], generate: dict[str, Any], quiet: bool, debug: bool,
                 progress: ProgressHook | None = None, demo: bool = False) -> int:
    """The exit code of a whole run (README: exit codes)."""
    before = log.handlers[:], log.level, log.propagate
    _setup_logging(quiet, debug)
    try:
        return _generate(run, generate, quiet, debug, progress, demo)
    finally:  # an in-process caller's logging is its own again
        log.handlers[:], log.level, log.propagate = before[0], before[1], before[2]


def _generate(run: dict[str, Any], generate: dict[str, Any], quiet: bool, debug: bool,
              progress: ProgressHook | None, demo: bool) -> int:
    if run.get("ray") is not None:  # `--ray ""` too: refused there, not run without Ray
        return _run_ray(run, generate, quiet, debug)
    try:
        runner = Runner(RunOptions(**run), generate, demo=demo)
    except AgentrollError as exc:
        _error(str(exc))
        return exc.exit_code
    if progress is not None:
        runner.progress = progress
    elif not quiet:
        runner.progress = RichBar() if err.is_terminal else LogLines()
    code: int
    try:
        signum = run_async(_supervised(runner))
        code = 128 + signum if signum is not None else 0
        if signum is not None and runner.result is not None and runner.result.committed:
            log.info("%s came after the run had written everything (complete: true): exit 0",
                     signal.Signals(signum).name)
            code = 0
    except PipeClosed:
        return PipeClosed.exit_code
    except AgentrollError as exc:
        if debug:
            raise
        _error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    result = runner.result
    for line in REPEATS.said():
        log.warning(line)
    if result is not None and not quiet:
        print_summary(result)
    if code == 0 and result is not None and not result.complete:
        missing = IncompleteRun(f"{result.missing_groups} of {result.stats.problems} groups could not be produced "
                                "(calls failed for good; see the warnings above): run the same command again to "
                                "redo them")
        _error(str(missing))
        code = missing.exit_code
    return code


def _run_ray(run: dict[str, Any], generate: dict[str, Any], quiet: bool, debug: bool) -> int:
    """`generate --ray`: the job on a Ray cluster (docs/ray.md). A first SIGINT/SIGTERM stops every partition
    cleanly (each folder stays resumable); a second one kills the tasks and exits at once."""
    from .cluster import RayJob

    job: RayJob | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        assert job is not None
        if job.stopped is not None:
            log.error("second interrupt: stopping at once")
            job.kill()
            os._exit(128 + signum)
        log.warning("%s: stopping every partition; their folders stay resumable (interrupt again to stop at once)",
                    signal.Signals(signum).name)
        job.stop(signum)

    previous: dict[int, Any] = {}
    try:
        job = RayJob(run, generate, None if quiet else RichBar() if err.is_terminal else LogLines(), debug)
        job.connect()  # Ray sets its own SIGTERM handler here: ours go in after it
        previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        result = job.run()
    except AgentrollError as exc:
        if debug:
            raise
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if job is not None:
            job.close()
    if not quiet:
        print_summary(result.run)
        for line in result.notes():
            err.print(line, markup=False, highlight=False, soft_wrap=True)
    if result.code and result.message:
        _error(result.message)
    return result.code


def _typer_parameter(name: str, spec: Any, annotation: Any, default: Any) -> inspect.Parameter:
    meta = spec.metadata
    decls = [f"--{name.replace('_', '-')}", *([meta["short"]] if "short" in meta else [])]
    info = typer.Option(*decls, help=meta.get("help"), envvar=meta.get("envvar"),
                        show_default=not isinstance(default, list | dict))
    kind = meta.get("cli_type", annotation)
    value = None if isinstance(default, list | dict) else default
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value,
                             annotation=Annotated[kind | None if value is None else kind, info])


def _build_generate() -> Any:
    """`agentroll generate`, its options made from `RunOptions` and `GenerateOptions`: one place for names,
    defaults and help, shared with `agentroll.Generator`."""
    params = [inspect.Parameter("input", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
        str, typer.Argument(help="Prompt JSONL file, or - for stdin.")])]
    for cls in (RunOptions, GenerateOptions):
        hints = get_type_hints(cls)
        for spec in dataclass_fields(cls):
            if spec.name == "input":
                continue
            default = default_of(spec)
            params.append(_typer_parameter(spec.name, spec, hints[spec.name], default))
    params += [
        inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option("--quiet", "-q", help="No progress, no summary.")]),
        inspect.Parameter("debug", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
            bool, typer.Option("--debug", help="Tracebacks and debug logs.")]),
    ]

    def generate(**kwargs: Any) -> None:
        """Run the solver -> rewriter -> selector system on every prompt and write rewarded rollouts."""
        quiet, debug = kwargs.pop("quiet"), kwargs.pop("debug")
        run = {k: kwargs.pop(k) for k in RUN_OPTION_NAMES}
        generate = {k: v for k, v in kwargs.items() if v is not None}
        raise typer.Exit(run_generate(run, generate, quiet, debug))

    generate.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    generate.__annotations__ = {p.name: p.annotation for p in params}
    return generate


app.command("generate")(_build_generate())


@app.command()
def doctor(
    base_url: Annotated[str, typer.Option(envvar=["AGENTROLL_BASE_URL", "OPENAI_BASE_URL"])],
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY")] = None,
    model: str | None = None,
    tokenizer: Annotated[str | None, typer.Option(help="[default: the model name]")] = None,
    prompts: Path | None = None,
    temperature: Annotated[float, typer.Option(help="The sampling you will generate with: warns when the "
                                                    "server's logprobs are not those of that distribution.")] = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
) -> None:
    """Check a server before a long job: reachable, token ids, APIs, logprobs mode, chat-template parity,
    context length."""
    from .doctor import diagnose

    url = base_url.replace(",", " ").split()[0] if base_url.strip() else base_url
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    checks = asyncio.run(diagnose(url, api_key, model, tokenizer, prompts, sampling))
    colors = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in checks:
        err.print(f"[{colors[check.verdict]}]{check.verdict:4}[/] {check.name}: {check.detail}", highlight=False)
    raise typer.Exit(1 if any(c.verdict == "fail" for c in checks) else 0)


@app.command("ray-partition", hidden=True)
def ray_partition() -> None:
    """One partition of a `generate --ray` job: its Ray task starts it and sends the spec on stdin."""
    from .partitions import JsonProgress, partition_spec

    spec = partition_spec(sys.stdin.buffer.read())
    raise typer.Exit(run_generate(spec["run"], spec["generate"], quiet=False, debug=spec["debug"],
                                  progress=JsonProgress(sys.stdout.buffer)))


@app.command()
def merge(
    folders: Annotated[list[Path], typer.Argument(help="Output folders of a split job.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the merged manifest.")],
    copy: Annotated[bool, typer.Option(help="Copy the shards in, instead of pointing at them.")] = False,
    verify: Annotated[bool, typer.Option(help="Check every shard's sha256 first.")] = False,
    allow_incomplete: Annotated[bool, typer.Option(help="Merge a folder whose run did not complete (the merged "
                                                        "manifest says which).")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an earlier merge in OUT.")] = False,
) -> None:
    """Join the manifests of several output folders (e.g. --partition slices) into one dataset."""
    from .folder import merge as merge_folders

    merged = _folder_tool(lambda: merge_folders(folders, output, copy=copy, verify=verify,
                                                allow_incomplete=allow_incomplete, overwrite=overwrite))
    for part in merged.merged_from or []:
        if not part.get("complete"):
            log.warning("%s: its run did not complete; the merged folder says so (complete: false)", part["folder"])
    err.print(f"merged {len(folders)} folders: {len(merged.shards)} shards, {merged.records} records, "
              f"{merged.executions} executions -> {output / 'manifest.json'}", markup=False, highlight=False)


@app.command()
def demo(
    output: Annotated[str, typer.Option("--output", "-o")] = "demo-output",
    num_parallel: int = 3,
    samples_per_prompt: int = 2,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Run the whole pipeline on the bundled samples against the built-in SIMULATED vLLM server (no GPU).

    It starts over in its folder each time, so it refuses a folder that holds anything but an earlier demo."""
    from .folder import Layout
    from .sim.script import Script
    from .sim.server import SimServer

    folder = Path(output)
    if output != "-" and folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and (
            not Layout(folder).demo_marker.exists()):
            _error(f"{output} holds something other than an earlier demo's output; demo writes only into a new or "
                   "empty folder (-o DIR)")
            raise typer.Exit(OutputError.exit_code)
    samples = samples_dir() / "math.jsonl"
    server = SimServer(script=Script.from_jsonl(samples), record=False)
    url = server.start()
    if not quiet:
        err.print(f"simulated vLLM server (scripted answers, tiny tokenizer) at {url}")
    try:
        code = run_generate({"input": str(samples), "output": output, "overwrite": True},
                            {"base_url": [url], "tokenizer": str(sim_tokenizer_dir()), "num_parallel": num_parallel,
                             "samples_per_prompt": samples_per_prompt, "max_tokens": 512, "seed": 0},
                            quiet, debug=False, demo=True)
    finally:
        server.stop()
    if not quiet and code == 0:
        err.print(f"rollouts written to {output}/ (see {output}/manifest.json)")
    raise typer.Exit(code)


@app.command()
def convert(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    to: Annotated[str, typer.Option("--to", help="dpo | sft | trl | slime | megatron")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the converted files.")],
    advantage: Annotated[str, typer.Option(help="trl, slime, megatron: none | grpo | mean, per (problem, stage).")]
    = "none",
    stages: Annotated[str | None, typer.Option(help="Comma-separated stages (default: all).")] = None,
    max_pairs_per_group: Annotated[int | None, typer.Option(help="dpo: most pairs per (problem, stage).")] = None,
    layout: Annotated[str | None, typer.Option(help="dpo, sft: conversational (default) | standard.")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="dpo, sft: to recover chat messages (default: the run's).")]
    = None,
    groups_per_file: Annotated[int | None, typer.Option(help="slime: problems per .pt file.")] = None,
    include_frozen: Annotated[bool | None, typer.Option(
        "--include-frozen/--skip-frozen", help="Keep records of frozen stages (trainable false); trl, slime and "
                                               "megatron skip them by default.", show_default=False)] = None,
    trajectories: Annotated[bool | None, typer.Option(
        "--trajectories/--no-trajectories", help="slime: one sample per multi-turn conversation, from its last "
                                                 "turn (default), or one per turn.", show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace this format's files in OUT.")] = False,
) -> None:
    """Turn a folder into what a trainer loads: TRL DPO pairs, SFT data, TRL GRPO rollouts, slime, Megatron."""
    from .convert import convert as convert_folder

    summary = _folder_tool(lambda: convert_folder(
        folder, to, output, advantage=advantage, max_pairs_per_group=max_pairs_per_group, stages=stages,
        layout=layout, tokenizer=tokenizer, groups_per_file=groups_per_file, include_frozen=include_frozen,
        trajectories=trajectories, overwrite=overwrite))
    extra = "".join(f", {summary[k]} {k.replace('_', ' ')}" for k in ("skipped_frozen", "folded_turns")
                    if summary.get(k))
    err.print(f"{summary['records']} records -> {summary['rows']} {to} rows in "
              f"{', '.join(map(str, summary['files']))}{extra}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def validate(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    max_faults: Annotated[int, typer.Option(help="Faults listed after the first.")] = 20,
    json_: Annotated[bool, typer.Option("--json", help="The whole report as JSON.")] = False,
) -> None:
    """Check a folder: sha256 and sizes, every record's schema, aligned lengths, whole groups (exit 6 on a fault)."""
    from .tools.validate import validate as validate_folder

    report = validate_folder(folder)
    if json_:
        sys.stdout.buffer.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        out = Console(width=None if sys.stdout.isatty() else 200)
        for line in report.lines(max_faults):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(0 if report.ok else OutputError.exit_code)


def _folder_tool(run: Any) -> Any:
    """A folder tool's result, or its error as one line and its exit code."""
    try:
        return run()
    except AgentrollError as exc:
        _error(str(exc))
        raise typer.Exit(exc.exit_code) from None


@app.command()
def stats(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    by: Annotated[str | None, typer.Option(help="Split the report by this metadata field.")] = None,
    json_: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """The system's report recomputed from the records: per stage, accuracies, pass@k, truncation, tokens."""
    from .tools.report import stats as folder_stats
    from .tools.report import stats_table

    data = _folder_tool(lambda: folder_stats(folder, by))
    if json_:
        sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        Console().print(stats_table(data))


@app.command()
def report(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")],
    by: Annotated[str | None, typer.Option(help="Split the figures by this metadata field.")] = None,
) -> None:
    """One self-contained HTML page of charts (no network): rewards, accuracies, lengths, pass@k, throughput."""
    from .tools.html import report as html_report

    made = _folder_tool(lambda: html_report(folder, output, by))
    err.print(f"{made['charts']} charts -> {made['output']} ({made['bytes']:,} bytes)", markup=False, highlight=False)


@app.command("inspect")
def inspect_command(
    folder: Annotated[Path, typer.Argument(help="An output folder, or a merged one.")],
    problem: Annotated[str | None, typer.Option(help="This problem's executions (default: the first group's first).")]
    = None,
) -> None:
    """Draw a rollout as a tree: solvers -> rewriters -> selector, with rewards, truncations and the judgment."""
    from .tools.inspect import inspect as inspect_folder

    Console().print(_folder_tool(lambda: inspect_folder(folder, problem)))


@app.command("serve-sim")
def serve_sim(
    port: int = 8000,
    host: str = "127.0.0.1",
    answers: Annotated[Path | None, typer.Option(help="JSONL with prompt and label: the answer key.")] = None,
    model: str = "agentroll-sim",
    max_model_len: int = 4096,
    latency: Annotated[float, typer.Option(help="Seconds added to every completion.")] = 0.0,
    error_rate: Annotated[float, typer.Option(help="Share of completions answered 500/503.")] = 0.0,
    drop_rate: Annotated[float, typer.Option(help="Share of completions whose connection is dropped.")] = 0.0,
    malformed_rate: Annotated[float, typer.Option(help="Share answered 200 with a body that is no completion.")] = 0.0,
    abort_rate: Annotated[float, typer.Option(help="Share of completions ending finish_reason abort.")] = 0.0,
    tokenize_error_rate: Annotated[float, typer.Option(help="Share of /tokenize answered 500/503.")] = 0.0,
    max_running: Annotated[int, typer.Option(help="Requests decoding at once; the rest wait.")] = 256,
    reasoning_words: Annotated[int, typer.Option(help="Length of each think block, in words.")] = 12,
    enable_scale_out: Annotated[bool, typer.Option(help="Serve POST /inference/v1/generate, as vLLM does with "
                                                        "this flag.")] = False,
    logprobs_mode: Annotated[str, typer.Option(help="raw_logprobs | processed_logprobs, as vLLM's flag.")] = (
        "raw_logprobs"),
    scheduling_policy: Annotated[str, typer.Option(help="fcfs | priority, as vLLM's flag: requests' `priority` "
                                                        "orders the queue (lower first).")] = "fcfs",
    moe: Annotated[str | None, typer.Option(help="LAYERS,EXPERTS,PER_TOKEN: a MoE model, for routed "
                                                 "experts.")] = None,
    enable_return_routed_experts: Annotated[bool, typer.Option(help="Return routed_experts (needs --moe).")] = False,
    seed: int = 0,
) -> None:
    """Serve the SIMULATED vLLM (OpenAI-compatible wire format, scripted answers) until interrupted."""
    from .sim.script import Behavior, Script
    from .sim.server import Faults, SimServer

    script = Script.from_jsonl(answers, Behavior(reasoning_words=reasoning_words))
    try:
        faults = Faults(error_rate=error_rate, drop_rate=drop_rate, latency_s=latency, malformed_rate=malformed_rate,
                        abort_rate=abort_rate, tokenize_error_rate=tokenize_error_rate)
        shape = tuple(int(x) for x in moe.split(",")) if moe else None
        if shape is not None and (len(shape) != 3 or not 1 <= shape[2] <= shape[1] or shape[0] < 1):
            raise ValueError("--moe takes LAYERS,EXPERTS,PER_TOKEN with 1 <= PER_TOKEN <= EXPERTS")
        if enable_return_routed_experts and shape is None:
            raise ValueError("--enable-return-routed-experts needs a MoE model: pass --moe")
        server = SimServer(script=script, model=model, max_model_len=max_model_len, seed=seed, record=False,
                           faults=faults, max_running=max_running, enable_scale_out=enable_scale_out,
                           logprobs_mode=logprobs_mode, moe=shape, scheduling_policy=scheduling_policy,
                           return_routed_experts=enable_return_routed_experts)
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None

    async def main() -> None:
        url = await server.serve(host, port)
        print(f"simulated vLLM server ({model}) listening on {url}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        run_async(main())


def main() -> Any:
    return app()
