"""The `agentroll` command: the only module that knows typer and rich. Errors become one line and an exit code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .client import ClientCounters
from .errors import AgentrollError, PipeClosed, UsageError
from .inputs import InputKeys, parse_partition
from .resources import samples_dir, sim_tokenizer_dir
from .runner import Progress as ProgressHook
from .runner import RunConfig, Runner, RunResult
from .stats import RunStats

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Rewarded, token-exact multi-agent rollouts from a vLLM server.")
err = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
log = logging.getLogger("agentroll")


def _setup_logging(quiet: bool, debug: bool) -> None:
    level = logging.DEBUG if debug else logging.ERROR if quiet else logging.INFO
    if err.is_terminal:
        handler: logging.Handler = RichHandler(console=err, show_path=False, show_time=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s agentroll %(levelname)s %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class RichBar(ProgressHook):
    def __init__(self, samples_per_prompt: int) -> None:
        self.k = samples_per_prompt
        self.bar = Progress(TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err, transient=True)
        self.task = self.bar.add_task("gen", total=None, info="")

    def start(self, total: int | None) -> None:
        self.bar.update(self.task, total=total * self.k if total is not None else None)
        self.bar.start()

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        info = f"req {requests.requests} retry {requests.retries} fail {requests.failures}"
        self.bar.update(self.task, completed=stats.executions, info=info)

    def stop(self) -> None:
        self.bar.stop()


class LogLines(ProgressHook):
    """No TTY (cron, CI): a plain progress line at most every `every_s` seconds."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s, self.last = every_s, time.monotonic()

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.info("executions %d, records %d, requests %d, retries %d, failures %d", stats.executions,
                     stats.records_written, requests.requests, requests.retries, requests.failures)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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
        f"problems {s.problems} (already done {s.problems_skipped_done}), executions {s.executions} "
        f"(empty {s.executions_empty}), records {s.records_written}, invalid rows {s.invalid_rows}\n"
        f"accuracy: solver {_fmt(rep['solver_accuracy'])}, majority vote {_fmt(rep['majority_vote_accuracy'])}, "
        f"best of N {_fmt(rep['best_of_n_accuracy'])}, rewriter {_fmt(rep['rewriter_accuracy'])}, "
        f"selector (its pick) {_fmt(rep['selector_pick_accuracy'])}, system {_fmt(rep['system_accuracy'])}\n"
        f"groups written {s.groups_written}, filtered {s.groups_filtered}, resampled {s.groups_resampled}; "
        f"reward timeouts {s.reward_timeouts}, errors {s.reward_errors}\n"
        f"truncation rate {_fmt(d['truncation_rate'])}, "
        f"requests {r.requests}, retries {r.retries}, failures {r.failures}, peak in flight {r.peak_in_flight}, "
        f"wall {result.wall_s:.1f}s, {rate:.1f} requests/s"
    )


def run_async(coroutine: Any) -> Any:
    """On uvloop when it is installed (`pip install agentroll[fast]`), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _split_urls(values: list[str]) -> list[str]:
    return [u for v in values for u in v.replace(",", " ").split() if u]


def run_generate(cfg: RunConfig, quiet: bool, debug: bool) -> int:
    _setup_logging(quiet, debug)
    progress: ProgressHook | None = None
    if not quiet:
        progress = RichBar(cfg.samples_per_prompt) if err.is_terminal else LogLines()
    try:
        result = run_async(Runner(cfg, progress).run())
    except PipeClosed:
        return PipeClosed.exit_code
    except AgentrollError as exc:
        if debug:
            raise
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    if not quiet:
        print_summary(result)
    return result.exit_code


OptStr = Annotated[str | None, typer.Option()]


@app.command()
def generate(
    input: Annotated[str, typer.Argument(help="Prompt JSONL file, or - for stdin.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output folder, or - to stream JSONL to stdout.")],
    base_url: Annotated[list[str], typer.Option(
        "--base-url", envvar=["AGENTROLL_BASE_URL", "OPENAI_BASE_URL"],
        help="vLLM server (with or without /v1). Repeat or comma-separate for several.")] = [],  # noqa: B006
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="Sent as a Bearer token.")] = None,
    model: Annotated[str | None, typer.Option(help="Served model name [default: the only one listed]")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Path or hub id for AutoTokenizer [default: model]")] = None,
    prompts: Annotated[Path | None, typer.Option(help="Folder of stage templates [default: bundled]")] = None,
    prompt_key: str = "prompt",
    label_key: str = "label",
    id_key: str = "id",
    num_parallel: Annotated[int, typer.Option(help="Solvers, and rewriters, per execution.")] = 4,
    samples_per_prompt: Annotated[int, typer.Option(help="Executions per prompt (one group).")] = 1,
    concurrency: Annotated[int, typer.Option(help="Most HTTP requests in flight, over the run.")] = 64,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per response (capped to the context left).")] = 4096,
    max_context_len: Annotated[int | None, typer.Option(help="[default: the server's max_model_len]")] = None,
    temperature: float = 1.0,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: Annotated[int | None, typer.Option(help="Base seed; each call gets its own derived seed.")] = None,
    correct_reward_weight: float = 1.0,
    incorrect_reward_weight: float = 1.0,
    no_think: Annotated[bool, typer.Option("--no-think", help="The whole response is the answer.")] = False,
    reward: Annotated[str, typer.Option(help="math | exact | remote | FILE.py:FUNCTION | MODULE:FUNCTION")] = "math",
    reward_timeout: Annotated[float, typer.Option(help="Seconds per reward check.")] = 10.0,
    reward_url: Annotated[str | None, typer.Option(help="Reward model URL, for --reward remote.")] = None,
    reward_concurrency: Annotated[int, typer.Option(help="Most reward-model requests in flight.")] = 32,
    reward_key: Annotated[str, typer.Option(help="Input field naming a row's own reward.")] = "reward",
    filter_uniform_groups: Annotated[bool, typer.Option(help="Leave out groups whose outcomes are all alike.")] = False,
    resample_uniform: Annotated[int, typer.Option(help="Re-run a uniform group up to N more times.")] = 0,
    chat_template_kwargs: Annotated[str | None, typer.Option(help='JSON, e.g. {"enable_thinking": true}')] = None,
    shard_size: Annotated[int, typer.Option(help="Records per shard (whole executions).")] = 1000,
    overwrite: Annotated[bool, typer.Option(help="Delete earlier rollouts in the output folder.")] = False,
    skip_invalid: Annotated[bool, typer.Option(help="Log and count bad input rows instead of stopping.")] = False,
    limit: Annotated[int | None, typer.Option(help="Only the first N problems.")] = None,
    partition: Annotated[str | None, typer.Option(help="I/N: only problems whose id hashes to slice I of N.")] = None,
    chat_render: Annotated[str, typer.Option(help="auto | local | server: where prompts are rendered.")] = "auto",
    max_retries: Annotated[int, typer.Option(help="Retries per call for transient failures.")] = 5,
    request_timeout: Annotated[float, typer.Option(help="Seconds per HTTP request attempt.")] = 3600.0,
    max_failures: Annotated[int | None, typer.Option(help="Exit non-zero past this many failed calls.")] = None,
    down_timeout: Annotated[float, typer.Option(help="Seconds to wait when every endpoint is down.")] = 300.0,
    probe_interval: Annotated[float, typer.Option(help="Seconds between /health probes of a down endpoint.")] = 5.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress, no summary.")] = False,
    debug: Annotated[bool, typer.Option(help="Tracebacks and debug logs.")] = False,
) -> None:
    """Run the solver -> rewriter -> selector system on every prompt and write rewarded rollouts."""
    try:
        kwargs = orjson.loads(chat_template_kwargs) if chat_template_kwargs else {}
        if not isinstance(kwargs, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        err.print(f"error: --chat-template-kwargs must be a JSON object ({exc})")
        raise typer.Exit(UsageError.exit_code) from None
    try:
        slice_ = parse_partition(partition) if partition else None
    except ValueError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(UsageError.exit_code) from None
    cfg = RunConfig(
        input=input, output=output, base_urls=_split_urls(base_url), api_key=api_key, model=model,
        tokenizer=tokenizer, prompts_dir=prompts, keys=InputKeys(prompt_key, label_key, id_key, reward_key),
        num_parallel=num_parallel, samples_per_prompt=samples_per_prompt, concurrency=concurrency,
        max_tokens=max_tokens, max_context_len=max_context_len, temperature=temperature, top_p=top_p,
        top_k=top_k, seed=seed, correct_reward_weight=correct_reward_weight,
        incorrect_reward_weight=incorrect_reward_weight, think=not no_think, reward=reward,
        reward_timeout=reward_timeout, reward_url=reward_url, reward_concurrency=reward_concurrency,
        filter_uniform_groups=filter_uniform_groups, resample_uniform=resample_uniform,
        chat_template_kwargs=kwargs, shard_size=shard_size, overwrite=overwrite,
        skip_invalid=skip_invalid, limit=limit, max_retries=max_retries, request_timeout=request_timeout,
        max_failures=max_failures, partition=slice_, chat_render=chat_render, down_timeout=down_timeout,
        probe_interval=probe_interval)
    raise typer.Exit(run_generate(cfg, quiet, debug))


@app.command()
def doctor(
    base_url: Annotated[str, typer.Option(envvar=["AGENTROLL_BASE_URL", "OPENAI_BASE_URL"])],
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY")] = None,
    model: str | None = None,
    tokenizer: Annotated[str | None, typer.Option(help="[default: the model name]")] = None,
    prompts: Path | None = None,
) -> None:
    """Check a server before a long job: reachable, token ids, chat-template parity, context length."""
    from .doctor import diagnose

    checks = asyncio.run(diagnose(_split_urls([base_url])[0], api_key, model, tokenizer, prompts))
    colors = {"ok": "green", "warn": "yellow", "fail": "red"}
    for check in checks:
        err.print(f"[{colors[check.verdict]}]{check.verdict:4}[/] {check.name}: {check.detail}", highlight=False)
    raise typer.Exit(1 if any(c.verdict == "fail" for c in checks) else 0)


@app.command()
def merge(
    folders: Annotated[list[Path], typer.Argument(help="Output folders of a split job.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the merged manifest.")],
    copy: Annotated[bool, typer.Option(help="Copy the shards in, instead of pointing at them.")] = False,
    verify: Annotated[bool, typer.Option(help="Check every shard's sha256 first.")] = False,
) -> None:
    """Join the manifests of several output folders (e.g. --partition slices) into one dataset."""
    from .merge import merge as merge_folders

    try:
        merged = merge_folders(folders, output, copy=copy, verify=verify)
    except AgentrollError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    err.print(f"merged {len(folders)} folders: {len(merged['shards'])} shards, {merged['records']} records, "
              f"{merged['executions']} executions -> {output / 'manifest.json'}", markup=False, highlight=False)


@app.command()
def demo(
    output: Annotated[str, typer.Option("--output", "-o")] = "demo-output",
    num_parallel: int = 3,
    samples_per_prompt: int = 2,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Run the whole pipeline on the bundled samples against the built-in SIMULATED vLLM server (no GPU)."""
    from .sim.script import Script
    from .sim.server import SimServer

    samples = samples_dir() / "math.jsonl"
    server = SimServer(script=Script.from_jsonl(samples), record=False)
    url = server.start()
    if not quiet:
        err.print(f"simulated vLLM server (scripted answers, tiny tokenizer) at {url}")
    cfg = RunConfig(input=str(samples), output=output, base_urls=[url], tokenizer=str(sim_tokenizer_dir()),
                    num_parallel=num_parallel, samples_per_prompt=samples_per_prompt, max_tokens=512,
                    overwrite=True, seed=0)
    code = run_generate(cfg, quiet, debug=False)
    server.stop()
    if not quiet and code == 0:
        err.print(f"rollouts written to {output}/ (see {output}/manifest.json)")
    raise typer.Exit(code)


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
    reasoning_words: Annotated[int, typer.Option(help="Length of each think block, in words.")] = 12,
    seed: int = 0,
) -> None:
    """Serve the SIMULATED vLLM (OpenAI-compatible wire format, scripted answers) until interrupted."""
    from .sim.script import Behavior, Script
    from .sim.server import Faults, SimServer

    script = Script.from_jsonl(answers, Behavior(reasoning_words=reasoning_words))
    server = SimServer(script=script, model=model, max_model_len=max_model_len, seed=seed, record=False,
                       faults=Faults(error_rate=error_rate, drop_rate=drop_rate, latency_s=latency))

    async def main() -> None:
        url = await server.serve(host, port)
        print(f"simulated vLLM server ({model}) listening on {url}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        run_async(main())


def main() -> Any:
    return app()
