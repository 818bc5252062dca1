"""`agentroll generate`: its options made from `RunOptions` and `GenerateOptions` (one place for names, defaults
and help, shared with `agentroll.Generator`), shown in panels; the run, its signals and its exit code."""

from __future__ import annotations

import inspect
import signal
from dataclasses import fields as dataclass_fields
from typing import Annotated, Any, get_type_hints

import typer
from rich.text import Text

from ..engine.options import GenerateOptions, default_of
from ..errors import AgentrollError, PipeClosed
from ..run.progress import Progress as ProgressHook
from ..run.run_options import RUN_OPTION_NAMES, RunOptions
from ..run.runner import Runner
from .console import REPEATS, err, error, failed, log, run_async, setup_logging
from .folds import Folds
from .help import Command, help_text, metavar
from .interrupts import Interrupts
from .keys import KEY_WARNING, TEACHER_KEY_WARNING, given_key
from .progress import LogLines, RichBar
from .summary import incomplete, print_summary

PANELS = {
    "Input and output": (
        "output",
        "mix",
        "prompt_key",
        "label_key",
        "id_key",
        "reward_key",
        "overwrite",
        "skip_invalid",
        "limit",
        "ordered",
        "consumer",
        "max_ahead",
        "quiet",
        "verbose",
        "debug",
    ),
    "Servers": (
        "base_url",
        "policy",
        "api_key",
        "api_key_file",
        "model",
        "tokenizer",
        "api",
        "concurrency",
        "max_concurrency",
        "server_priority",
        "chat_render",
        "max_context_len",
    ),
    "Sampling": ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "logprobs", "no_think"),
    "System": ("system", "system_option", "stage", "num_parallel", "prompts", "chat_template_kwargs"),
    "Rewards": (
        "reward",
        "reward_timeout",
        "reward_url",
        "reward_workers",
        "reward_concurrency",
        "allow_reward",
        "correct_reward_weight",
        "incorrect_reward_weight",
        "overlong_buffer",
        "overlong_penalty",
        "overlong_filter",
        "code_test_timeout",
        "code_partial_credit",
        "sandbox",
        "sandbox_url",
        "sandbox_concurrency",
        "sandbox_memory_mb",
        "sandbox_processes",
        "sandbox_disk_mb",
        "reward_component",
    ),
    "Judge": tuple(f.name for f in dataclass_fields(GenerateOptions) if f.name.startswith("judge_")),
    "Groups": ("samples_per_prompt", "filter_uniform_groups", "resample_uniform", "target_groups"),
    "Teacher": (
        "teacher",
        "teacher_model",
        "teacher_logprobs",
        "teacher_concurrency",
        "teacher_all_or_nothing",
        "teacher_api_key",
        "teacher_api_key_file",
    ),
    "Reliability": (
        "max_retries",
        "request_timeout",
        "connect_timeout",
        "down_timeout",
        "probe_interval",
        "max_failures",
    ),
    "Scale-out": ("partition", "ray", "partitions", "endpoints_per_task", "ray_retries"),
    "Formats": ("shard_size", "compression", "return_routed_experts", "return_sampling_mask"),
}
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}
OTHER = "More options"  # an option no panel lists yet
METAVARS = {
    "output": "DIR",
    **{"judge_prompt": "FILE|NAME", "judge_api_key_file": "FILE", "judge_url": "URL", "reward_component": "SPEC"},
    **{"judge_model": "NAME", "judge_parse": "score|json", "judge_pattern": "REGEX", "judge_scale": "LO:HI"},
    **{"judge_mode": "sample|group", "judge_failures": "fail|keep"},
    "base_url": "URL",
    "policy": "NAME=URL,...",
    "teacher": "URL",
    "teacher_model": "NAME",
    "teacher_concurrency": "N|auto",
    "teacher_api_key": "KEY",
    "teacher_api_key_file": "FILE",
    "sandbox_url": "URL",
    "sandbox": "bwrap|unsafe-local",
    "api_key": "KEY",
    "api_key_file": "FILE",
    "model": "NAME",
    "tokenizer": "PATH|ID",
    "prompts": "DIR",
    "prompt_key": "FIELD",
    "label_key": "FIELD",
    "id_key": "FIELD",
    "reward_key": "FIELD",
    "system": "NAME|FILE.py:CLASS",
    "system_option": "KEY=VALUE",
    "stage": "STAGE.KEY=VALUE",
    "concurrency": "N|auto",
    "api": "auto|completions|generate",
    "chat_render": "auto|local|server",
    "server_priority": "auto|on|off",
    "overlong_filter": "none|mask|drop",
    "reward": "SPEC",
    "reward_url": "URL",
    "allow_reward": "SPEC",
    "chat_template_kwargs": "JSON",
    "compression": "none|zstd",
    "partition": "I/N",
    "ray": "ADDRESS",
    "consumer": "NAME",
    "seed": "N",
    "mix": "[NAME:]PATH=WEIGHT",
}


def _parameter(name: str, spec: Any, annotation: Any, default: Any) -> inspect.Parameter:
    meta = spec.metadata
    decls = [f"--{name.replace('_', '-')}", *([meta["short"]] if "short" in meta else [])]
    info = typer.Option(
        *decls,
        help=help_text(meta.get("help")),
        envvar=meta.get("envvar"),
        show_default=meta.get("shown", not isinstance(default, list | dict)),  # `shown`: a default said in words
        metavar=metavar(name, annotation, METAVARS),
        rich_help_panel=PANEL_OF.get(name, OTHER),
    )
    kind = meta.get("cli_type", annotation)
    value = None if isinstance(default, list | dict) else default
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=value,
        annotation=Annotated[kind | None if value is None else kind, info],
    )


def flag(name: str, short: str | None, text: str) -> inspect.Parameter:
    info = typer.Option(f"--{name}", *([short] if short else []), help=text, metavar="", rich_help_panel=PANEL_OF[name])
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, info])


def build() -> Any:
    params = [
        inspect.Parameter(
            "input",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=None,
            annotation=Annotated[str | None, typer.Argument(metavar="INPUT", help=INPUT_HELP, show_default=False)],
        )
    ]
    for cls in (RunOptions, GenerateOptions):
        hints = get_type_hints(cls)
        for spec in dataclass_fields(cls):
            if spec.name != "input":
                params.append(_parameter(spec.name, spec, hints[spec.name], default_of(spec)))
    params += [
        flag("quiet", "-q", "No progress, no summary."),
        flag("verbose", "-v", "Also the details that need no action (and transformers' own notices)."),
        flag("debug", None, "Tracebacks and debug logs."),
    ]
    order = [*PANELS, OTHER]  # the panels in their order; within one, the options as declared
    params[1:] = sorted(params[1:], key=lambda p: order.index(PANEL_OF.get(p.name, OTHER)))

    def generate(**kwargs: Any) -> None:
        """Run the agent system (three-stage by default) on every prompt; write rewarded, token-exact rollouts."""
        quiet, debug, verbose = kwargs.pop("quiet"), kwargs.pop("debug"), kwargs.pop("verbose")
        run = {k: kwargs.pop(k) for k in RUN_OPTION_NAMES}
        if run["input"] is None:
            if not run["mix"]:
                error("give INPUT (a file, or - for stdin) or --mix PATH=WEIGHT")
                raise typer.Exit(2)
            run["input"] = "-"
        if run["mix"] is None:
            run["mix"] = []
        kwargs["api_key"], on_command_line = given_key(kwargs["api_key"], kwargs["api_key_file"])
        options = {k: v for k, v in kwargs.items() if v is not None}
        typed = bool(kwargs.get("teacher_api_key")) and kwargs.get("teacher_api_key_file") is None  # both: refused
        said = [KEY_WARNING] * on_command_line + [TEACHER_KEY_WARNING] * typed
        raise typer.Exit(run_generate(run, options, quiet, debug, verbose=verbose, warn_keys=said))

    generate.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    generate.__annotations__ = {p.name: p.annotation for p in params}
    return generate


class GenerateCommand(Command):
    help_panel = next(iter(PANELS))


def register(app: typer.Typer) -> None:
    app.command("generate", cls=GenerateCommand)(build())


INPUT_HELP = (
    "Prompts: JSONL, .jsonl.gz, .jsonl.zst or Parquet (told by their bytes), or - for stdin (JSONL); "
    "or none, with --mix."
)


async def _supervised(runner: Runner, interrupts: Interrupts, folds: Folds) -> None:
    """Run; the first SIGINT/SIGTERM cancels the run in the loop (the runner closes the folder cleanly)."""
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(runner.run())

    to_stdout = runner.run_options.output == "-"  # no folder: the groups still in flight are lost

    def first(signum: int) -> None:
        runner.stopped_by = signum  # the manifest says how the run ended (a follower waits for a resume)
        log.warning(
            "%s: finishing up; %s (interrupt again to stop at once)",
            signal.Signals(signum).name,
            "the groups written are whole, those in flight are lost (-o -: no folder to resume)"
            if to_stdout
            else "the output folder stays resumable",
        )
        task.cancel()

    def stop(signum: int) -> None:  # in the signal handler: the rest in the loop, between two of its steps
        loop.call_soon_threadsafe(first, signum)

    async def say_folded() -> None:  # counts of folded warnings, within their period even when none follows
        while True:
            await asyncio.sleep(1.0)
            for line in folds.due():
                log.warning(line)

    interrupts.stop = stop
    timer = asyncio.ensure_future(say_folded())
    try:
        await task
    except asyncio.CancelledError:
        if interrupts.first is None:
            raise
    finally:
        interrupts.stop = None
        timer.cancel()


def run_generate(
    run: dict[str, Any],
    generate: dict[str, Any],
    quiet: bool,
    debug: bool,
    progress: ProgressHook | None = None,
    demo: bool = False,
    verbose: bool = False,
    warn_keys: list[str] | None = None,
) -> int:
    """The exit code of a whole run (README: exit codes). `warn_keys`: what to say once, at start, of API keys
    given on the command line."""
    restore = setup_logging(quiet, debug, verbose)
    for warning in warn_keys or []:
        log.warning(warning)
    folds = Folds()
    for handler in log.handlers:
        handler.addFilter(folds)
    try:
        if run.get("ray") is not None:  # `--ray ""` too: refused there, not run without Ray
            return _run_ray(run, generate, quiet, debug)
        return _generate(run, generate, quiet, debug, progress, demo, folds)
    finally:  # an in-process caller's logging is its own again
        restore()


def _generate(
    run: dict[str, Any],
    generate: dict[str, Any],
    quiet: bool,
    debug: bool,
    progress: ProgressHook | None,
    demo: bool,
    folds: Folds,
) -> int:
    try:
        runner = Runner(RunOptions(**run), generate, demo=demo)
    except AgentrollError as exc:
        return failed(exc, debug)
    if progress is not None:
        runner.progress = progress
    elif not quiet:
        runner.progress = RichBar() if err.is_terminal else LogLines()
    interrupts = Interrupts(lambda: runner.result is not None and runner.result.committed)
    interrupts.install()
    try:
        return _outcome(runner, interrupts, quiet, debug, folds)
    finally:
        interrupts.restore()


def _outcome(runner: Runner, interrupts: Interrupts, quiet: bool, debug: bool, folds: Folds) -> int:
    """Run, say what happened, and give the exit code; a signal that comes once the folder is complete leaves it
    0, one that comes while the summary is said after an unfinished run gives its own code. The error that ended
    the run is said last, below the summary, where it does not scroll away."""
    code: int
    failure: AgentrollError | None = None
    try:
        run_async(_supervised(runner, interrupts, folds))
        code = interrupts.code or 0
    except PipeClosed:
        return PipeClosed.exit_code
    except AgentrollError as exc:
        failure, code = exc, exc.exit_code
    except KeyboardInterrupt:
        code = interrupts.code or 130
    result = runner.result
    try:
        for line in [*folds.said(), *REPEATS.said()]:
            log.warning(line)
        if result is not None and not quiet:
            print_summary(result)
    except KeyboardInterrupt:
        code = interrupts.code or 130
    if failure is not None:
        failed(failure, debug)
    if result is not None and result.committed:
        came = interrupts.first or interrupts.late
        if came is not None:
            log.info("%s came after the run had written everything (complete: true): exit 0", signal.Signals(came).name)
        code = 0 if code == interrupts.code else code
    if code == 0 and result is not None and not result.complete:
        code = failed(incomplete(result, said=not quiet), debug=False)
    return code


def _run_ray(run: dict[str, Any], generate: dict[str, Any], quiet: bool, debug: bool) -> int:
    """`generate --ray`: the job on a Ray cluster (docs/ray.md). A first SIGINT/SIGTERM stops every partition
    cleanly (each folder stays resumable); a second one kills the tasks and exits at once."""
    from ..process import heap
    from ..run.cluster import RayJob

    heap.settle()  # the driver's start-up is over: its partitions run elsewhere (agentroll.process.heap)
    job: RayJob | None = None
    interrupts = Interrupts()

    def stop(signum: int) -> None:
        log.warning(
            "%s: stopping every partition; their folders stay resumable (interrupt again to stop at once)",
            signal.Signals(signum).name,
        )
        assert job is not None
        job.stop(signum)

    def kill() -> None:
        if job is not None:
            job.kill()

    interrupts.stop, interrupts.kill = stop, kill
    try:
        job = RayJob(run, generate, None if quiet else RichBar() if err.is_terminal else LogLines(), debug)
        job.connect()  # Ray sets its own SIGTERM handler here: ours go in after it
        interrupts.install()
        result = job.run()
    except AgentrollError as exc:
        return failed(exc, debug)
    except KeyboardInterrupt:
        return 130
    finally:
        interrupts.restore()
        if job is not None:
            job.close()
    if not quiet:
        print_summary(result.run)
        for line in result.notes():
            err.print(Text(line), soft_wrap=True)
    if result.code and result.message:
        error(result.message)
    return result.code
