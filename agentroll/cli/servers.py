"""Commands about servers: `doctor` (check one before a long job), `serve-sim` (the simulated vLLM), `demo` (the
whole pipeline against it), and the hidden `ray-partition` (one partition of a --ray job)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.text import Text

from ..errors import OutputError
from ..process.resources import samples_dir, sim_tokenizer_dir
from ..settings.sampling import DEFAULT as SAMPLING
from .console import err, error, out, run_async
from .folders import opt
from .generate import run_generate
from .help import Command

VERDICT_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


def register(app: typer.Typer) -> None:
    app.command(cls=Command)(doctor)
    app.command(cls=Command)(demo)
    app.command("serve-sim", cls=Command)(serve_sim)
    app.command("ray-partition", hidden=True)(ray_partition)


def doctor(
    base_url: Annotated[
        str,
        opt(
            "--base-url",
            help="The vLLM server to check.",
            metavar="URL",
            envvar=["AGENTROLL_BASE_URL", "OPENAI_BASE_URL"],
        ),
    ],
    api_key: Annotated[
        str | None, opt("--api-key", help="Sent as a Bearer token.", metavar="KEY", envvar="OPENAI_API_KEY")
    ] = None,
    api_key_file: Annotated[
        str | None, opt("--api-key-file", help="A file holding the API key (its first line).", metavar="FILE")
    ] = None,
    model: Annotated[
        str | None, opt("--model", help="Served model name (default: the only one listed).", metavar="NAME")
    ] = None,
    tokenizer: Annotated[
        str | None, opt("--tokenizer", help="Path or hub id (default: the model name).", metavar="PATH|ID")
    ] = None,
    prompts: Annotated[
        Path | None, opt("--prompts", help="Folder of stage templates (default: bundled).", metavar="DIR")
    ] = None,
    temperature: Annotated[
        float,
        opt(
            "--temperature",
            help="The sampling you will generate with: warns when the "
            "server's logprobs are not those of that distribution.",
            metavar="NUMBER",
        ),
    ] = SAMPLING.temperature,
    top_p: Annotated[float, opt("--top-p", help="Top-p you will generate with.", metavar="NUMBER")] = SAMPLING.top_p,
    top_k: Annotated[int, opt("--top-k", help="Top-k you will generate with.", metavar="N")] = SAMPLING.top_k,
    min_p: Annotated[float, opt("--min-p", help="Min-p you will generate with.", metavar="NUMBER")] = SAMPLING.min_p,
    json_: Annotated[bool, opt("--json", help="The verdicts as JSON.")] = False,
) -> None:
    """Check a server before a long job: token ids, APIs, logprobs mode, chat-template parity, context length.

    The verdicts go to stdout (`doctor > file` keeps them); exit 1 when any check fails."""
    from ..errors import UsageError
    from ..tools.doctor import diagnose, doctor_options
    from .keys import KEY_WARNING, given_key

    api_key, on_command_line = given_key(api_key, api_key_file)
    if on_command_line:
        err.print(Text(f"warning: {KEY_WARNING}", style="yellow"), soft_wrap=True)
    try:
        options = doctor_options(
            base_url=base_url,
            api_key=api_key,
            api_key_file=api_key_file,
            model=model,
            tokenizer=tokenizer,
            prompts=prompts,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
        )
        checks = asyncio.run(diagnose(options))
    except UsageError as exc:
        error(str(exc))
        raise typer.Exit(exc.exit_code) from None
    failed = any(c.verdict == "fail" for c in checks)
    if json_:
        verdicts = [{"name": c.name, "verdict": c.verdict, "detail": c.detail} for c in checks]
        report = {"base_url": options.base_url[0], "ok": not failed, "checks": verdicts}
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        console = out()
        for check in checks:
            line = Text(f"{check.verdict:4}", style=VERDICT_STYLES[check.verdict])
            line.append(f" {check.name}: {check.detail}")
            console.print(line, soft_wrap=True)
    raise typer.Exit(1 if failed else 0)


def ray_partition() -> None:
    """One partition of a `generate --ray` job: its Ray task starts it and sends the spec on stdin."""
    from ..run.partitions import JsonProgress, partition_spec

    spec = partition_spec(sys.stdin.buffer.read())
    raise typer.Exit(
        run_generate(
            spec["run"], spec["generate"], quiet=False, debug=spec["debug"], progress=JsonProgress(sys.stdout.buffer)
        )
    )


def demo(
    output: Annotated[
        str, opt("--output", "-o", help="Folder for the rollouts (new, empty, or an earlier demo's).", metavar="DIR")
    ] = "demo-output",
    num_parallel: Annotated[int, opt("--num-parallel", help="Solvers, and rewriters, per execution.", metavar="N")] = 3,
    samples_per_prompt: Annotated[int, opt("--samples-per-prompt", help="Executions per prompt.", metavar="N")] = 2,
    quiet: Annotated[bool, opt("--quiet", "-q", help="No progress, no summary.")] = False,
) -> None:
    """Run the whole pipeline on the bundled samples against the built-in SIMULATED vLLM server (no GPU).

    It starts over in its folder each time, so it refuses a folder that holds anything but an earlier demo."""
    from ..folder import Layout
    from ..sim.script import Script
    from ..sim.server import SimServer

    folder = Path(output)
    if (
        output != "-"
        and folder.exists()
        and (not folder.is_dir() or any(folder.iterdir()))
        and (not Layout(folder).demo_marker.exists())
    ):
        error(
            f"{output} holds something other than an earlier demo's output; demo writes only into a new or empty "
            "folder (-o DIR)"
        )
        raise typer.Exit(OutputError.exit_code)
    samples = samples_dir() / "math.jsonl"
    server = SimServer(script=Script.from_jsonl(samples), record=False)
    url = server.start()
    if not quiet:
        err.print(Text(f"simulated vLLM server (scripted answers, tiny tokenizer) at {url}"))
    try:
        code = run_generate(
            {"input": str(samples), "output": output, "overwrite": True},
            {
                "base_url": [url],
                "tokenizer": str(sim_tokenizer_dir()),
                "num_parallel": num_parallel,
                "samples_per_prompt": samples_per_prompt,
                "max_tokens": 512,
                "seed": 0,
            },
            quiet,
            debug=False,
            demo=True,
        )
    finally:
        server.stop()
    if not quiet and code == 0:
        err.print(Text(f"rollouts written to {output}/ (see {output}/manifest.json)"))
    raise typer.Exit(code)


def serve_sim(
    port: Annotated[int, opt("--port", help="Port to listen on (0: any free one).", metavar="PORT")] = 8000,
    host: Annotated[str, opt("--host", help="Address to listen on.", metavar="HOST")] = "127.0.0.1",
    answers: Annotated[
        Path | None,
        opt(
            "--answers",
            help="JSONL with prompt and label: the answer key (without it every answer is graded wrong).",
            metavar="FILE",
        ),
    ] = None,
    model: Annotated[str, opt("--model", help="The served model name.", metavar="NAME")] = "agentroll-sim",
    max_model_len: Annotated[int, opt("--max-model-len", help="Context length, as vLLM's flag.", metavar="N")] = 4096,
    latency: Annotated[float, opt("--latency", help="Seconds added to every completion.", metavar="SECONDS")] = 0.0,
    decode_latency: Annotated[
        float, opt("--decode-latency", help="And seconds per token it generates.", metavar="SECONDS")
    ] = 0.0,
    error_rate: Annotated[
        float, opt("--error-rate", help="Share of completions answered 500/503.", metavar="SHARE")
    ] = 0.0,
    drop_rate: Annotated[
        float, opt("--drop-rate", help="Share of completions whose connection is dropped.", metavar="SHARE")
    ] = 0.0,
    malformed_rate: Annotated[
        float, opt("--malformed-rate", help="Share answered 200 with a body that is no completion.", metavar="SHARE")
    ] = 0.0,
    abort_rate: Annotated[
        float, opt("--abort-rate", help="Share of completions ending finish_reason abort.", metavar="SHARE")
    ] = 0.0,
    tokenize_error_rate: Annotated[
        float, opt("--tokenize-error-rate", help="Share of /tokenize answered 500/503.", metavar="SHARE")
    ] = 0.0,
    max_running: Annotated[
        int, opt("--max-running", help="Requests decoding at once; the rest wait.", metavar="N")
    ] = 256,
    reasoning_words: Annotated[
        int, opt("--reasoning-words", help="Length of each think block, in words.", metavar="N")
    ] = 12,
    correct: Annotated[
        float,
        opt(
            "--correct",
            help="Share of solver and rewriter answers that are right: the model's strength.",
            metavar="SHARE",
        ),
    ] = 0.6,  # the scripted model's default (sim.script.Behavior)
    enable_scale_out: Annotated[
        bool, opt("--enable-scale-out", help="Serve POST /inference/v1/generate, as vLLM does with this flag.")
    ] = False,
    logprobs_mode: Annotated[
        str, opt("--logprobs-mode", help="raw_logprobs | processed_logprobs, as vLLM's flag.", metavar="MODE")
    ] = "raw_logprobs",
    scheduling_policy: Annotated[
        str,
        opt(
            "--scheduling-policy",
            help="fcfs | priority, as vLLM's flag: requests' `priority` orders the queue (lower first).",
            metavar="POLICY",
        ),
    ] = "fcfs",
    moe: Annotated[
        str | None, opt("--moe", help="LAYERS,EXPERTS,PER_TOKEN: a MoE model, for routed experts.", metavar="L,E,K")
    ] = None,
    enable_return_routed_experts: Annotated[
        bool, opt("--enable-return-routed-experts", help="Return routed_experts (needs --moe).")
    ] = False,
    return_sampling_mask: Annotated[
        bool,
        opt(
            "--return-sampling-mask",
            help="As vLLM's flag: /generate sends each token's kept ids; requests need temperature > 0, top_k > 0.",
        ),
    ] = False,
    seed: Annotated[int, opt("--seed", help="Seed of the answers' randomness.", metavar="N")] = 0,
) -> None:
    """Serve the SIMULATED vLLM (OpenAI-compatible wire format, scripted answers) until interrupted."""
    from ..sim.script import Behavior, Script
    from ..sim.server import Faults, SimServer

    if answers is not None and not answers.is_file():
        error(f"--answers {answers}: {'is a folder, not a file' if answers.is_dir() else 'no such file'}")
        raise typer.Exit(2)
    try:
        if not 0.0 <= correct <= 1.0:
            raise ValueError(f"--correct must be a share from 0 to 1, got {correct}")
        script = Script.from_jsonl(answers, Behavior(reasoning_words=reasoning_words, correct=correct))
        faults = Faults(
            error_rate=error_rate,
            drop_rate=drop_rate,
            latency_s=latency,
            decode_latency_s=decode_latency,
            malformed_rate=malformed_rate,
            abort_rate=abort_rate,
            tokenize_error_rate=tokenize_error_rate,
        )
        shape = tuple(int(x) for x in moe.split(",")) if moe else None
        if shape is not None and (len(shape) != 3 or not 1 <= shape[2] <= shape[1] or shape[0] < 1):
            raise ValueError("--moe takes LAYERS,EXPERTS,PER_TOKEN with 1 <= PER_TOKEN <= EXPERTS")
        if enable_return_routed_experts and shape is None:
            raise ValueError("--enable-return-routed-experts needs a MoE model: pass --moe")
        server = SimServer(
            script=script,
            model=model,
            max_model_len=max_model_len,
            seed=seed,
            record=False,
            faults=faults,
            max_running=max_running,
            enable_scale_out=enable_scale_out,
            logprobs_mode=logprobs_mode,
            moe=shape,
            scheduling_policy=scheduling_policy,
            return_routed_experts=enable_return_routed_experts,
            return_sampling_mask=return_sampling_mask,
        )
    except (ValueError, OSError) as exc:
        error(f"--answers {answers}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc))
        raise typer.Exit(2) from None

    async def main() -> None:
        from ..process.heap import settle

        server.engine.warm()
        settle()  # the process is the server's for its whole life (agentroll.process.heap)
        try:
            url = await server.serve(host, port)
        except OSError as exc:
            taken = exc.errno == errno.EADDRINUSE
            raise SystemExit(
                f"{host}:{port} is {'in use by another program' if taken else 'not available'} "
                f"({exc.strerror or exc}): pass another --port, or 0 for any free one"
            ) from None
        if answers is None:
            err.print(
                Text(
                    "warning: no --answers: the simulated model knows no label, so every answer it writes is graded "
                    "wrong (accuracy 0.000); pass --answers with the prompts' JSONL (prompt and label) to have it "
                    f"answer right {Behavior().correct:.0%} of the time",
                    style="yellow",
                ),
                soft_wrap=True,
            )
        print(f"simulated vLLM server ({model}) listening on {url}", flush=True)
        await asyncio.Event().wait()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_async(main())
    except SystemExit as exc:
        error(str(exc.code))
        raise typer.Exit(2) from None
