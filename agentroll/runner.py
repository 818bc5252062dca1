"""A whole `generate` run: set-up checks, a bounded stream of executions, the writer, signals, the summary.

Input is read in small batches off the event loop and fed through a bounded queue to a fixed pool of execution
workers, so memory stays flat however long the input is; the client's semaphore caps requests in flight.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from itertools import islice
from pathlib import Path
from typing import Any

from .chat import ChatEncoder, load_tokenizer
from .client import ClientCounters, CompletionClient
from .errors import AgentrollError, InputError, ServerError, TooManyFailures, UsageError
from .inputs import InputKeys, Problem, in_partition, read_problems
from .parity import check_parity, probe_messages, server_renderer
from .pipeline import AgentSettings, AgentSystem, SystemConfig
from .rewards import RewardSet, RewardSettings
from .schema import Sample
from .stats import RunStats
from .templates import Templates
from .writer import ShardWriter, StdoutWriter

log = logging.getLogger("agentroll")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig(AgentSettings):
    """Everything `agentroll generate` takes; the sampling and shaping fields come from `AgentSettings`."""

    input: str
    output: str
    base_urls: list[str]
    api_key: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    prompts_dir: Path | None = None
    keys: InputKeys = field(default_factory=InputKeys)
    concurrency: int = 64
    reward: str = "math"
    reward_timeout: float = 10.0
    reward_url: str | None = None
    reward_concurrency: int = 32
    filter_uniform_groups: bool = False
    resample_uniform: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    shard_size: int = 1000
    overwrite: bool = False
    skip_invalid: bool = False
    limit: int | None = None
    max_retries: int = 5
    request_timeout: float = 3600.0
    max_failures: int | None = None
    chat_render: str = "auto"  # auto: local if it matches the server's /tokenize, else server-side; local; server
    partition: tuple[int, int] | None = None  # (I, N): only problems whose id hashes to slice I of N
    down_timeout: float = 300.0
    probe_interval: float = 5.0

    def validate(self) -> None:
        for name in ("num_parallel", "samples_per_prompt", "concurrency", "max_tokens", "shard_size"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_context_len is not None and self.max_context_len < 1:
            raise UsageError("--max-context-len must be at least 1")
        if self.filter_uniform_groups and self.samples_per_prompt < 2:
            raise UsageError("--filter-uniform-groups needs --samples-per-prompt of at least 2")
        if self.chat_render not in ("auto", "local", "server"):
            raise UsageError("--chat-render must be auto, local or server")
        if self.resample_uniform and not self.filter_uniform_groups:
            raise UsageError("--resample-uniform goes with --filter-uniform-groups")


@dataclass(slots=True)
class RunResult:
    stats: RunStats
    requests: ClientCounters
    wall_s: float
    model: str
    output: str
    exit_code: int = 0
    complete: bool = False


class Progress:
    """What the runner tells its caller while it works (the CLI draws a bar or writes log lines)."""

    def start(self, total: int | None) -> None: ...
    def advance(self, stats: RunStats, requests: ClientCounters) -> None: ...
    def stop(self) -> None: ...


def _settings(cfg: RunConfig, model: str, tokenizer: str, templates: Templates, ctx: int | None) -> dict[str, Any]:
    """What a resumed run must share with the folder's earlier runs, or its rollouts would not be one dataset."""
    return {
        "model": model, "tokenizer": tokenizer, "templates": templates.fingerprint,
        "num_parallel": cfg.num_parallel, "samples_per_prompt": cfg.samples_per_prompt,
        "max_tokens": cfg.max_tokens, "max_context_len": ctx, "temperature": cfg.temperature,
        "top_p": cfg.top_p, "top_k": cfg.top_k, "seed": cfg.seed, "think": cfg.think,
        "reward": cfg.reward, "reward_url": cfg.reward_url, "correct_reward_weight": cfg.correct_reward_weight,
        "filter_uniform_groups": cfg.filter_uniform_groups, "resample_uniform": cfg.resample_uniform,
        "incorrect_reward_weight": cfg.incorrect_reward_weight, "keys": asdict(cfg.keys),
        "chat_template_kwargs": cfg.chat_template_kwargs,
        "partition": list(cfg.partition) if cfg.partition else None, "chat_render": cfg.chat_render,
        "logprobs": "as the server returns them (vLLM --logprobs-mode, default raw_logprobs)",
    }


def annotate_group(executions: list[list[Sample]], finals: list[float]) -> None:
    """Per-group figures on every record: mean and std of the executions' final rewards, solver pass@k."""
    mean = sum(finals) / len(finals)
    std = (sum((f - mean) ** 2 for f in finals) / len(finals)) ** 0.5
    passed = float(any(s.raw_reward == 1.0 for e in executions for s in e if s.stage == "solver"))
    for samples in executions:
        for sample in samples:
            sample.group_reward_mean, sample.group_reward_std, sample.group_pass_at_k = mean, std, passed


def _count_rows(path: str, limit: int | None) -> int | None:
    if path == "-" or not os.path.isfile(path) or os.path.getsize(path) > 256 * 2**20:
        return limit
    with open(path, "rb") as f:
        rows = sum(1 for line in f if line.strip())
    return min(rows, limit) if limit is not None else rows


class Runner:
    def __init__(self, cfg: RunConfig, progress: Progress | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.progress = progress or Progress()
        self.stats = RunStats()
        self.signal: int | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    async def discover_model(self, client: CompletionClient) -> tuple[str, int | None, str | None]:
        """Fail fast on a dead server; pick the served model and read its context length.

        Every endpoint is asked; one that does not answer starts out of rotation (and is probed), unless none
        answers, which ends the run at once."""
        answers = await asyncio.gather(*(client.get_json("/v1/models", e) for e in client.endpoints),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and (
                    not isinstance(answer, ServerError) or answer.status in (401, 403)):
                raise answer  # a wrong key is wrong everywhere: no point waiting for a probe
        listing: Any = next((a for a in answers if not isinstance(a, BaseException)), None)
        if listing is None:
            raise next(a for a in answers if isinstance(a, BaseException))
        for endpoint, answer in zip(client.endpoints, answers, strict=True):
            if isinstance(answer, ServerError):
                client.mark_down(endpoint, str(answer))
        models = listing.get("data") or []
        names = [m.get("id") for m in models]
        name = self.cfg.model
        if name is None:
            if len(names) != 1:
                raise UsageError(f"the server lists {len(names)} models ({', '.join(map(str, names))}): pass --model")
            name = names[0]
        entry = next((m for m in models if m.get("id") == name), None)
        if entry is None:
            raise ServerError(f"model {name!r} is not served (available: {', '.join(map(str, names))})")
        return str(name), entry.get("max_model_len"), entry.get("root")

    async def run(self) -> RunResult:
        cfg = self.cfg
        if cfg.input != "-" and not os.path.isfile(cfg.input):
            raise InputError(cfg.input, 0, None, "no such file")
        started = time.monotonic()
        client = CompletionClient(cfg.base_urls, api_key=cfg.api_key, concurrency=cfg.concurrency,
                                  timeout_s=cfg.request_timeout, max_retries=cfg.max_retries,
                                  down_timeout_s=cfg.down_timeout, probe_interval_s=cfg.probe_interval)
        try:
            model, model_len, root = await self.discover_model(client)
            ctx = cfg.max_context_len or model_len
            tokenizer_name = cfg.tokenizer or model
            try:
                tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_name)
            except UsageError:
                if cfg.tokenizer or not root or root == model:
                    raise
                tokenizer_name = root
                tokenizer = await asyncio.to_thread(load_tokenizer, root)
            templates = Templates(cfg.prompts_dir)
            encoder = ChatEncoder(tokenizer, cfg.chat_template_kwargs)
            if cfg.chat_render == "server" or (
                    cfg.chat_render == "auto" and await self._differs(client, encoder, model, templates)):
                encoder.server_render = server_renderer(client, model, cfg.chat_template_kwargs)
            settings = _settings(cfg, model, tokenizer_name, templates, ctx)
            writer = StdoutWriter() if cfg.output == "-" else ShardWriter(
                Path(cfg.output), settings, cfg.shard_size, cfg.overwrite)
            rewards = RewardSet(RewardSettings(cfg.reward, cfg.reward_timeout, cfg.reward_url,
                                               cfg.reward_concurrency, cfg.max_retries))
            done = writer.open()
            shared = {f.name: getattr(cfg, f.name) for f in fields(AgentSettings)}
            system_cfg = SystemConfig(**{**shared, "model": model, "max_context_len": ctx})
            system = AgentSystem(client, encoder, templates, rewards, system_cfg, self.stats)
            error: BaseException | None = None
            self.progress.start(None if cfg.partition else _count_rows(cfg.input, cfg.limit))
            try:
                await self._drive(system, writer, done, client)
            except (AgentrollError, asyncio.CancelledError) as exc:
                error = exc
            finally:
                self.progress.stop()
                await rewards.aclose()
            empty = self.stats.executions_empty
            complete = error is None and self.signal is None and empty == 0
            result = RunResult(self.stats, client.counters, time.monotonic() - started, model, cfg.output,
                               complete=complete)
            writer.run_info = {"stats": self.stats.to_dict(), "requests": asdict(client.counters),
                               "wall_s": round(result.wall_s, 3), "interrupted_by_signal": self.signal}
            writer.close(complete=complete)
            if isinstance(error, AgentrollError):
                raise error
            if self.signal is not None:
                result.exit_code = 128 + self.signal
            return result
        finally:
            await client.aclose()

    @staticmethod
    async def _differs(client: CompletionClient, encoder: ChatEncoder, model: str, templates: Templates) -> bool:
        """Does our rendering of the stage prompts differ from the server's? (README: `agentroll doctor`)"""
        parity = await check_parity(client, encoder, model, probe_messages(templates))
        if not parity.supported:
            log.warning("the server has no /tokenize for chat messages: prompts are rendered locally, unchecked")
        elif parity.mismatch:
            log.warning("the local chat template does not render prompts as the server does (%s): prompts are "
                        "rendered by the server's /tokenize for this run; pass the server's tokenizer with "
                        "--tokenizer to render locally", parity.mismatch)
        return parity.mismatch is not None

    async def _drive(self, system: AgentSystem, writer: Any, done: set[tuple[str, int]],
                     client: CompletionClient) -> None:
        cfg = self.cfg
        # A worker runs one problem's group: up to K x N requests at once, but fewer between stages (one
        # selector call, rewards). Four times what would fill --concurrency keeps the cap busy (measured).
        workers = 2 + 4 * -(-cfg.concurrency // (cfg.num_parallel * cfg.samples_per_prompt))
        queue: asyncio.Queue[tuple[Problem, list[int]] | None] = asyncio.Queue(maxsize=workers)
        failure: list[BaseException] = []

        async def produce() -> None:
            rows = self._problems()
            while True:
                batch = await asyncio.to_thread(lambda: list(islice(rows, 256)))
                if not batch:
                    break
                for problem in batch:
                    self.stats.problems += 1
                    todo = [k for k in range(cfg.samples_per_prompt) if (problem.id, k) not in done]
                    if todo:
                        await queue.put((problem, todo))
                    else:
                        self.stats.problems_skipped_done += 1
            for _ in range(workers):
                await queue.put(None)

        async def work() -> None:
            while (job := await queue.get()) is not None:
                await self._group(system, writer, *job)
                self.progress.advance(self.stats, client.counters)
                if cfg.max_failures is not None and client.counters.failures > cfg.max_failures:
                    raise TooManyFailures(f"{client.counters.failures} calls failed for good "
                                          f"(--max-failures {cfg.max_failures})")

        def finished(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and task.exception() is not None:
                failure.append(task.exception())  # type: ignore[arg-type]
                self._cancel_all()

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            self._tasks = [asyncio.create_task(produce())] + [asyncio.create_task(work()) for _ in range(workers)]
            for task in self._tasks:
                task.add_done_callback(finished)
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
        if failure:
            raise failure[0]

    async def _group(self, system: AgentSystem, writer: Any, problem: Problem, todo: list[int]) -> None:
        """Run a problem's executions together, then write them as one group, or leave the group out when
        --filter-uniform-groups finds every execution ended alike (after up to --resample-uniform re-runs)."""
        cfg = self.cfg
        attempts = 1 + (cfg.resample_uniform if cfg.filter_uniform_groups else 0)
        for attempt in range(attempts):
            if attempt:
                self.stats.groups_resampled += 1
            executions = await asyncio.gather(*(system.run(problem, k, attempt) for k in todo))
            for samples in executions:
                self.stats.add_execution(samples)
            kept = [e for e in executions if e]
            if not kept:
                return  # nothing answered: not done, a rerun tries again
            finals = [e[0].final_reward for e in kept]
            if not cfg.filter_uniform_groups or len(set(finals)) > 1:
                break
        else:
            writer.mark_filtered(problem.id, todo)
            self.stats.groups_filtered += 1
            return
        annotate_group(kept, finals)
        writer.write_group(kept)
        self.stats.groups_written += 1
        self.stats.records_written += sum(len(e) for e in kept)

    def _problems(self) -> Iterator[Problem]:
        def skip(exc: InputError) -> None:
            self.stats.invalid_rows += 1
            log.warning("skipping invalid row: %s", exc)

        rows = read_problems(self.cfg.input, self.cfg.keys, skip if self.cfg.skip_invalid else None)
        if self.cfg.partition is not None:
            index, count = self.cfg.partition
            rows = (p for p in rows if in_partition(p.id, index, count))
        return islice(rows, self.cfg.limit) if self.cfg.limit is not None else rows

    def _on_signal(self, signum: int) -> None:
        if self.signal is not None:
            log.error("second interrupt: stopping at once")
            os._exit(128 + signum)
        self.signal = signum
        log.warning("%s: finishing up; the output folder stays resumable (interrupt again to stop at once)",
                    signal.Signals(signum).name)
        self._cancel_all()

    def _cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()

