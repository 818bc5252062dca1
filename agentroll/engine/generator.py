"""`agentroll.Generator`: the library a trainer embeds, and the engine under `agentroll generate`.

It runs in the caller's event loop, installs no signal handler and never exits the process. A cancelled call
(`asyncio.wait_for(gen.run_group(row), 1)`) cancels every request of that group: their connections close, and
vLLM aborts them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from agentroll.client import Budget, ClientCounters, CompletionClient, follow_metrics
from agentroll.context import Stage
from agentroll.engine.admission import depth_first
from agentroll.engine.handshake import (
    Served,
    choose_rendering,
    journal_fingerprint,
    policy_facts,
    policy_settings,
    reach,
    rendering,
    settle,
    settle_stage_api,
)
from agentroll.engine.options import GenerateOptions
from agentroll.engine.pipeline import AgentSystem, ExecutionFailed, SystemConfig, final_reward, gather_or_cancel
from agentroll.errors import InputError, UsageError
from agentroll.inputs import InputKeys, Problem, problem_from_row
from agentroll.record.group import Group, annotate
from agentroll.record.stats import RunStats
from agentroll.render.templates import Templates
from agentroll.rewards import RewardSet, hold, label_fault
from agentroll.rewards.components import graded
from agentroll.settings.policies import Policy
from agentroll.systems import System, from_object, identity, load_system, spec_of, vocabulary_of
from agentroll.teacher.settings import STAGE_KEYS as STAGE_TEACHER_KEYS

if TYPE_CHECKING:
    from agentroll.folder.journal import Journal
    from agentroll.teacher.scorer import Teacher

BUILTIN_REWARDS = ("math", "exact", "remote", "code")
log = logging.getLogger("agentroll")
STAGE_TEACHER = frozenset(STAGE_TEACHER_KEYS)


class Generator:
    """Rewarded, token-exact groups of executions from a vLLM server.

    Keyword arguments are `agentroll generate`'s options in snake_case, with the same defaults
    (`agentroll.engine.options.GenerateOptions`). Use it as an async context manager::

        async with agentroll.Generator(base_url="http://127.0.0.1:8000", samples_per_prompt=8) as gen:
            group = await gen.run_group({"id": "q1", "prompt": "What is 6 x 7?", "label": "42"})
    """

    def __init__(self, *, journal: str | os.PathLike[str] | None = None, **options: Any) -> None:
        """`journal`: a folder for the call journal (agentroll.folder.journal): the finished calls of groups not yet
        handed out are kept there, and a later Generator with the same journal replays them instead of asking
        the server again. `generate` keeps it in the output folder."""
        self._journal_path = Path(journal) if journal is not None else None
        self.journal: Journal | None = None
        system = options.get("system")
        self._system_object = None if system is None or isinstance(system, str) else system
        if self._system_object is not None:  # a class, an instance or a function of the caller's own
            options["system"] = spec_of(system)
        self.options = GenerateOptions(**options)
        o = self.options
        self.keys = InputKeys(o.prompt_key, o.label_key, o.id_key, o.reward_key)
        self.stats = RunStats()
        self.model: str = ""
        self.max_context_len: int | None = None
        self.tokenizer_name: str = ""
        self.logprobs_mode: str = ""
        # where the numbers came from (API, vLLM version, logprobs mode, tokenizer and template hashes): recorded
        # in the manifest's `servers`, not part of `settings`, so a transient probe failure or an upgraded vLLM
        # does not refuse a resume
        self.server: dict[str, Any] = {}
        self._client: CompletionClient | None = None
        self._rewards: RewardSet | None = None
        self._system: AgentSystem | None = None
        self._settings: dict[str, Any] = {}
        self._stage_clients: list[CompletionClient] = []  # stages served elsewhere (--stage NAME.base_url=...)
        self._by_url: dict[str, CompletionClient] = {}  # ... one client per such server, whichever policy asks
        self._systems: list[AgentSystem] = []  # one per policy (`--policy`), in the order given; else one
        self.teachers: list[Teacher] = []  # --teacher: each with a client of its own (agentroll.teacher)
        self.client_settings = self.options.client_settings()
        self._length = self.options.length_shaping()
        self._admitted = 0  # groups started: each one's number is its calls' priority (older first)
        self._budget: Budget | None = None
        self._rewards_ready: asyncio.Future[None] | None = None

    # -- life cycle ---------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Generator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        closing = asyncio.ensure_future(self.aclose())
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:  # a stop while closing: connections and workers are still let go
            await closing
            raise

    async def start(self) -> None:
        """Reach the servers, pick the model, load the tokenizer, check chat-template parity, set up rewards; in a
        head-to-head run (`--policy`), each policy's (`agentroll.settings.policies`)."""
        o = self.options
        system = self._load_system()
        policies = o.policies() or (Policy("", tuple(o.base_url), o.model, o.tokenizer),)
        runs = [Served(p, self._new_client(list(p.urls))) for p in policies]
        self._client = runs[0].client
        self._stage_clients.extend(r.client for r in runs[1:])
        try:
            for run in runs:
                await reach(o, run)
            first = runs[0]
            self.model, self.max_context_len = first.model, first.max_context_len
            self.tokenizer_name = first.tokenizer_name
            templates = Templates(Path(o.prompts) if o.prompts else None, system.templates)
            for run in runs:
                await choose_rendering(o, run, templates)
            self._rewards = RewardSet(o.reward_settings())
            if system.uses_sandbox:  # made now: a sandbox that cannot be had is said at start
                _ = self._rewards.sandbox
            # a reward that cannot score (no math worker) ends the run before a group is handed out: checked
            # alongside the first calls, awaited by `run_group`
            self._rewards_ready = asyncio.ensure_future(self._rewards.ready())
            for run in runs:
                await settle(o, run, templates, self._stage_client, o.samples_per_prompt * len(runs))
            self._systems = [
                AgentSystem(
                    run.client,
                    run.settled.encoder,
                    templates,
                    self._rewards,
                    run.settled.config,
                    self.stats,
                    prompt_key=self.keys.prompt,
                    system=system,
                    stages=run.stages,
                    policy=run.name,
                )
                for run in runs
            ]
            self._system = self._systems[0]
            self.server = first.server
            self.logprobs_mode = first.server["logprobs_mode"]
            config = o.system_config(self.model, self.max_context_len) if o.policy else first.settled.config
            self._settings = self._fingerprint(templates, rendering(first), config)
            self._settings["system"] = identity(system, o.system)
            self._settings["stage_settings"] = first.stage_settings
            if o.policy:
                self._settings["policies"] = [policy_settings(run) for run in runs]
                facts, warning = policy_facts(runs)
                self.server = {**self.server, **facts}
                if warning:
                    log.warning(warning)
            if o.teacher or any(STAGE_TEACHER & set(v) for v in o.stage_settings().values()):
                from agentroll.engine.teacher import attach

                explicit, taught = o.max_context_len is not None, None
                for each in self._systems:  # each policy's stages, scored by the same teacher(s)
                    stages = o.stage_settings()
                    taught = await attach(o, self.client_settings, each.engine, stages, self.teachers, explicit)
                if taught is not None:  # a rerun with another teacher (model, K) or none is refused, as any setting
                    self._settings["teacher"] = taught
                    cut = self._system.engine.default.config.max_context_len
                    self.max_context_len = self._settings["max_context_len"] = cut
            self._settings = orjson.loads(orjson.dumps(self._settings))  # as a folder's manifest will hold them
        except BaseException:
            await self.aclose()
            raise

    def open_journal(self, done: dict[str, str] | None = None) -> int:
        """Open the call journal (once; also done by the first group run), dropping the entries of the groups in
        `done` (problem id -> content hash: already stored). Returns the calls it can replay. Only one process
        may use a journal at a time: `generate` opens it once it holds the output folder's lock."""
        self._require()
        if self.journal is None and self._journal_path is not None:
            from agentroll.folder.journal import Journal

            o = self.options
            fingerprint = journal_fingerprint(self.model, self.server, o.return_routed_experts, o.return_sampling_mask)
            self.journal = Journal(self._journal_path, fingerprint=fingerprint)
            self.journal.open(done)
            for system in self._systems:
                system.use_journal(self.journal)
        return self.journal.live if self.journal is not None else 0

    def settle(self, group: Group) -> None:
        """The caller has stored `group` (or let it go): its journaled calls are no longer needed. A failed
        group's are kept, for the run that redoes it. `stream` settles each group when the next is asked for."""
        if self.journal is not None:
            self.journal.settle(group.problem.id, group.problem.content_hash, failed=group.status == "failed")

    async def aclose(self) -> None:
        ready, self._rewards_ready = self._rewards_ready, None
        if ready is not None and not ready.done():
            ready.cancel()
        if ready is not None:
            await asyncio.gather(ready, return_exceptions=True)
        journal, self.journal = self.journal, None
        if journal is not None:
            journal.close()
        rewards, client, system = self._rewards, self._client, self._system
        self._rewards = self._client = self._system = None
        self._systems = []
        if system is not None:
            await system.system.aclose()
        clients, self._stage_clients = self._stage_clients, []
        teachers, self.teachers = self.teachers, []
        try:
            if rewards is not None:
                await rewards.aclose()
        finally:
            closing = [*([client] if client is not None else []), *clients, *(t.client for t in teachers)]
            results = await asyncio.gather(*(each.aclose() for each in closing), return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed

    def _new_client(self, urls: list[str]) -> CompletionClient:
        """Every client of the run is made here, from the run's one `ClientSettings`, inside the run's one
        budget of slots and counters (a stage's own server too)."""
        if self._budget is None:
            self._budget = Budget(self.client_settings.concurrency.fixed)
        return CompletionClient(urls, self.client_settings, budget=self._budget)

    @property
    def counters(self) -> ClientCounters:
        return self._client.counters if self._client is not None else ClientCounters()

    def teacher_report(self) -> list[dict[str, Any]]:
        """Each teacher's model, endpoints and requests (its own counters: retries, failures, peak in flight)."""
        return [teacher.report() for teacher in self.teachers]

    @property
    def settings(self) -> dict[str, Any]:
        """What every group of one dataset must share: an output folder refuses groups made otherwise."""
        return dict(self._settings)

    # -- work ---------------------------------------------------------------------------------------------------
    def problem(self, row: dict[str, Any] | Problem, line: int = 0, source: str = "<row>") -> Problem:
        """A row as a `Problem`, validated (`InputError` names source, line and field). A row may name its own
        reward only among the built-ins and those allowed with `allow_reward`: a dataset cannot import code."""
        problem = row if isinstance(row, Problem) else problem_from_row(row, line, source, self.keys)
        spec = problem.reward
        if spec is not None and spec not in (*BUILTIN_REWARDS, self.options.reward, *self.options.allow_reward):
            raise InputError(
                problem.source,
                problem.line,
                self.keys.reward,
                f"reward {spec!r} is not allowed for rows: pass --allow-reward {spec} to allow it",
            )
        fault = label_fault(spec or self.options.reward, problem.label, [] if spec else self.options.reward_component)
        if fault is not None:  # checked before anything runs
            raise InputError(problem.source, problem.line, self.keys.label, fault)
        return problem

    async def run_group(self, row: dict[str, Any] | Problem) -> Group:
        """Run one problem's K executions (re-running a uniform group under --resample-uniform) as one group.

        A failed call or render gives a `failed` group, never a smaller one; a row that cannot run gives an
        `invalid` one. Errors that end a run (server gone, bad key or model, reward set-up) raise."""
        self._require()
        if self.journal is None and self._journal_path is not None:
            self.open_journal()
        problem = self.problem(row)
        group = self._admitted
        self._admitted += 1
        try:
            return await self._executions(problem, group)
        finally:
            if self._budget is not None:
                self._budget.finished(group)  # it wants no more room
            for teacher in self.teachers:
                teacher.settled(group)

    async def _executions(self, problem: Problem, group: int) -> Group:
        """The group's executions: K per policy, the i-th policy's numbered i*K..i*K+K-1 (one policy: 0..K-1)."""
        o = self.options
        k = o.samples_per_prompt
        runs = [(system, i * k + j) for i, system in enumerate(self._systems) for j in range(k)]
        attempts = 1 + (o.resample_uniform if o.filter_uniform_groups else 0)
        executions: list[list[Any]] = []
        for attempt in range(attempts):
            if attempt:
                self.stats.groups_resampled += 1
            try:
                executions = await gather_or_cancel(*(s.run(problem, n, attempt, group) for s, n in runs))
            except ExecutionFailed as exc:
                self.stats.groups_failed += 1
                return Group(problem, [], "failed", str(exc), attempt + 1, cause=exc)
            except InputError as exc:
                self.stats.groups_invalid += 1
                return Group(problem, [], "invalid", str(exc), attempt + 1, cause=exc)
            if self._rewards_ready is not None:
                await asyncio.shield(self._rewards_ready)
            if self._length.active:  # after the system's shaping, before the group's figures
                for samples in executions:
                    self._length.apply(samples)
            held = hold(executions)  # --judge-failures keep: no verdict holds a group back (its outcomes unknown)
            self.stats.groups_held += held
            finals = [final_reward(e) for e in executions]
            if held or not o.filter_uniform_groups or len(set(finals)) > 1:
                annotate(executions, finals, self.stats.vocabulary, graded(o.reward_settings().components))
                self._count(problem, executions)
                return Group(problem, executions, "complete", None, attempt + 1)
        self._count(problem, executions)
        self.stats.groups_filtered += 1
        return Group(problem, executions, "filtered", None, attempts)

    def _count(self, problem: Problem, executions: list[list[Any]]) -> None:
        """The report covers the executions of settled groups: a resampled group's earlier runs are left out."""
        for samples in executions:
            self.stats.add_execution(samples)
        if len(self._systems) > 1:
            self.stats.compare(problem.id, executions)

    @property
    def next_group(self) -> int:
        return self._admitted

    def stream(
        self, rows: Iterable[Any] | AsyncIterable[Any], max_ahead: int | None = None, ordered: bool = False
    ) -> AsyncGenerator[Group, None]:
        """Groups of `rows` as they finish, or in input order with `ordered`, each settled (`settle`) when the
        next one is asked for; admitted depth first (`agentroll.engine.admission`), at most `max_ahead` in flight or
        waiting to be taken."""
        self._require()
        assert self._budget is not None
        return depth_first(self, self._budget, rows, max_ahead, ordered)

    # -- set-up helpers -----------------------------------------------------------------------------------------
    def _require(self) -> AgentSystem:
        if self._system is None:
            raise UsageError("the Generator is not started: use `async with Generator(...) as gen`")
        return self._system

    def _load_system(self) -> System:
        """The agent system, its options and per-stage settings checked before any server is asked."""
        o = self.options
        system = (
            load_system(o.system, o.system_options())
            if self._system_object is None
            else from_object(self._system_object, o.system, o.system_options())
        )
        unknown = sorted(set(o.stage_settings()) - set(system.stages)) if system.stages else []
        if unknown:
            raise UsageError(
                f"--stage names {', '.join(unknown)}: system {system.name} has the stages {', '.join(system.stages)}"
            )
        if o.reward == "agent" and not getattr(system, "reports_reward", False):
            raise UsageError("--reward agent is the reward an agent reports: it takes --system agent")
        self.stats.use_stages(system.stages, vocabulary_of(system))  # none declared: added as they run
        return system

    async def _stage_client(self, url: str, main: Stage) -> CompletionClient:
        """A client for a stage's own server, inside the run's request budget and counters (under auto, with a cap
        of its own that follows its /metrics), on the run's token API."""
        if url in self._by_url:  # another policy's stage on the same server (a judge they share)
            return self._by_url[url]
        client = self._by_url[url] = self._new_client([url])
        self._stage_clients.append(client)
        if client.adaptive:  # under auto its server gets a cap of its own, following its /metrics
            await follow_metrics(client)
        await settle_stage_api(client, self.options, main.encoder, main.config)
        return client

    def _fingerprint(self, templates: Templates, rendering: str, config: SystemConfig) -> dict[str, Any]:
        o = self.options
        return {
            "model": self.model,
            "tokenizer": self.tokenizer_name,
            "templates": templates.fingerprint,
            "num_parallel": o.num_parallel,
            "samples_per_prompt": o.samples_per_prompt,
            "max_tokens": o.max_tokens,
            "max_context_len": self.max_context_len,
            "sampling": config.sampling.params(),
            "seed": o.seed,
            "logprobs": o.logprobs,
            "return_routed_experts": o.return_routed_experts,
            "return_sampling_mask": o.return_sampling_mask,
            "think": not o.no_think,
            **o.reward_settings().recorded(),  # the reward, its URL, the code reward's settings that differ
            "correct_reward_weight": o.correct_reward_weight,
            "incorrect_reward_weight": o.incorrect_reward_weight,
            "filter_uniform_groups": o.filter_uniform_groups,
            "resample_uniform": o.resample_uniform,
            "keys": asdict(self.keys),
            "chat_template_kwargs": o.chat_template_kwargs,
            "chat_render": o.chat_render,
            "prompt_rendering": rendering,  # where prompts actually became ids: --chat-render auto may switch
            **({"length_shaping": self._length.settings()} if self._length.active else {}),
        }
