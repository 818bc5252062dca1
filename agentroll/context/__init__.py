"""What an agent system sees of one execution: token-exact calls, rewards, the problem and the settings.

A system only decides *what* to ask; the context makes every call the engine's way (per-call seeds, context
budget, retries and routing through the client, server-exact ids and logprobs) and keeps the bookkeeping a
trainer relies on (which call continues which, which tokens the model sampled). A call that fails for good raises
`ExecutionFailed`, which fails the whole group: an infrastructure failure is never recorded as a model outcome.

The run's wiring (stages, their clients and sampling, what executions share) is `agentroll.context.stages`; what one
call derives and makes (seed, journal key, the record) is `agentroll.context.calls`: this module is the API a system
calls.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from agentroll.client import CallFailed, Endpoint
from agentroll.client.wire import Completion
from agentroll.context.calls import History, appended, call_key, call_seed, sample_of, sampling_record, tools_key
from agentroll.context.stages import Engine, Stage, SystemConfig, same_tokens
from agentroll.context.turns import separator
from agentroll.errors import InputError, ServerError, UsageError, first_line
from agentroll.inputs import Problem
from agentroll.record.schema import Sample
from agentroll.rewards import JudgeFailed
from agentroll.settings.sampling import KEYS as SAMPLING_KEYS

if TYPE_CHECKING:
    from agentroll.sandbox import Sandbox
    from agentroll.teacher.scorer import Teacher

__all__ = ["Context", "Engine", "ExecutionFailed", "Stage", "SystemConfig", "call_seed"]

log = logging.getLogger("agentroll")


class ExecutionFailed(Exception):
    """A call or a render of this execution failed for good: the execution (and its group) is not written.
    `rerun_helps` False: a rerun fails it again (an agent that crashed on what the call journal replays)."""

    rerun_helps = True


Stops = list[str] | None  # a call's stop strings


class Context:
    """One execution of a system. `problem`, `sample_index` (0..K-1 in the group), `attempt` (>0: a re-run of
    a uniform group), `rollout_id`, `config` (the run's sampling and shaping), `options` (the system's)."""

    def __init__(self, engine: Engine, problem: Problem, sample_index: int, attempt: int = 0, group: int = 0) -> None:
        self.engine = engine
        self.problem = problem
        self.sample_index = sample_index
        self.group = group  # the group's admission number: its calls' priority (older first)
        self.attempt = attempt
        self.rollout_id = uuid.uuid4().hex
        self.policy = engine.policy  # a head-to-head run's policy (`--policy`): every sample of it says so
        self.config = engine.default.config
        self.options = engine.options
        self.final_reward: float | None = None  # the execution's outcome; None: the last sample's raw_reward
        self._endpoints: dict[int, Endpoint] = {}  # per client: later calls follow the endpoint that answered
        self._seeds: set[tuple[str, int]] = set()
        self._parents: dict[int, Sample] = {}  # id(sample) -> the sample it continues
        self.failure: ExecutionFailed | None = None  # the first call that failed for good, even if caught
        self._made: dict[int, Sample] = {}  # id -> sample: the samples this execution made (kept alive)
        # --teacher: id(sample) -> (its stage's teacher, the sample, its call's journal key), scored by the pipeline
        self.teaching: dict[int, tuple[Teacher, Sample, str]] = {}
        self._rewarded = 0  # reward calls made so far

    # -- prompts ----------------------------------------------------------------------------------------------
    def messages(self, template: str, solutions: list[str] | None = None, **variables: Any) -> list[dict[str, str]]:
        """A template of the system's (`System.templates`) rendered for this problem."""
        return self.engine.templates.messages(template, self.problem.statement, solutions, **variables)

    def user_turn(self, template: str, **variables: Any) -> list[dict[str, str]]:
        """A template's user message alone: the next turn of a conversation (`complete(after=...)`)."""
        return [m for m in self.messages(template, **variables) if m["role"] == "user"]

    async def render(
        self, messages: list[dict[str, Any]], stage: str, tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int]]:
        """A prompt's text and ids with the stage's chat template (`tools`: its `tools` argument). A render that
        fails for good fails the execution; a template that rejects the messages is a `UsageError`."""
        try:
            return await self.engine.stage(stage).encoder.render(messages, tools)
        except CallFailed as exc:
            self.engine.stats.stage(stage).failed_calls += 1
            raise self._failed(f"rendering a {stage} prompt on the server failed: {exc}") from exc
        except Exception as exc:  # jinja2 or the tokenizer: "roles must alternate", a raise_exception(...)
            raise UsageError(f"the chat template rejects the {stage} messages: {first_line(exc)}") from exc

    async def problem_prompt(
        self, stage: str = "solver", template: str = "solver", tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int]]:
        """The problem as a first prompt: the row's own messages, or its statement in `template` (`tools`
        offered through the chat template); rendered once for the K executions. A row the chat template
        rejects, or that leaves no room to generate, is a bad input row (`InputError` naming the prompt field)."""
        cache, slot = self.engine.prompts, (stage, template, self.problem.content_hash, tools_key(tools))
        if slot in cache:
            return await asyncio.shield(cache[slot])
        made = cache[slot] = asyncio.get_running_loop().create_future()
        if len(cache) > 1024:
            cache.popitem(last=False)
        try:
            rendered = await self._first_prompt(stage, template, tools)
        except BaseException as exc:
            cache.pop(slot, None)  # a later execution tries again (a cancelled one, a failed render)
            if isinstance(exc, asyncio.CancelledError):
                made.cancel()
            else:
                made.set_exception(exc)
                made.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        made.set_result(rendered)
        return rendered

    async def _first_prompt(
        self, stage: str, template: str, tools: list[dict[str, Any]] | None
    ) -> tuple[str, list[int]]:
        key = self.engine.prompt_key
        own = isinstance(self.problem.prompt, list)
        messages = self.problem.prompt if own else self.messages(template)
        try:
            rendered = await self.render(messages, stage, tools)  # type: ignore[arg-type]
        except UsageError as exc:
            if own:
                raise InputError(self.problem.source, self.problem.line, key, str(exc)) from exc
            raise
        limit = self.engine.stage(stage).config.max_context_len
        if limit is not None and len(rendered[1]) >= limit:
            raise InputError(
                self.problem.source,
                self.problem.line,
                key,
                f"the rendered prompt has {len(rendered[1])} tokens: no room to generate within a context of {limit}",
            )
        return rendered

    # -- calls ------------------------------------------------------------------------------------------------
    async def complete(
        self,
        stage: str,
        prompt: list[dict[str, Any]] | list[int] | tuple[str, list[int]],
        *,
        worker: int = 0,
        after: Sample | None = None,
        tools: list[dict[str, Any]] | None = None,
        stop: Stops = None,
        **overrides: Any,
    ) -> Sample | None:
        """One token-exact call of `stage`, as a `Sample` (reward 0 until `reward`), or None when the prompt
        leaves no room to generate within the context.

        `prompt`: chat messages (rendered with the stage's template), token ids, or a rendered (text, ids) pair.
        With `after`, the call continues that sample's conversation: `prompt` is the new messages only (e.g. one
        user turn), and the prompt sent is `after`'s prompt + response ids + the template's separator and the new
        messages' tokens, never a re-rendering. `worker` tells apart calls of one stage in one execution (it
        derives the call's seed: two calls with one (stage, worker) are refused). `tools`: the chat template's
        `tools` argument, for messages rendered here (a conversation keeps the tools it started with).
        `overrides`: max_tokens, temperature, top_p, top_k, min_p for this call. `stop`: vLLM's stop strings (the
        response's ids end at the token that completed one, its text before it; `stop_reason` names it)."""
        runtime = self._claim(stage, worker, overrides)
        history: tuple[list[int], list[float]] | None = None
        if after is not None:
            if not isinstance(prompt, list) or not all(isinstance(m, dict) for m in prompt):
                raise UsageError("ctx.complete(after=...) takes the new chat messages to append")
            self._check_after(after, runtime)
            text, ids, history = await self._continue(after, prompt, runtime, tools)  # type: ignore[arg-type]
        elif isinstance(prompt, tuple):
            text, ids = prompt
        elif prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)  # type: ignore[arg-type]
            text = runtime.encoder.tokenizer.decode(ids, skip_special_tokens=False)
        elif prompt and all(isinstance(m, dict) for m in prompt):
            text, ids = await self.render(prompt, stage, tools)  # type: ignore[arg-type]
        else:
            raise UsageError("ctx.complete() takes chat messages, token ids or a (text, ids) pair")
        return self._made_by(await self._call(runtime, worker, text, ids, overrides, stop), after, history)

    async def extend(
        self, stage: str, after: Sample, ids: list[int], *, worker: int = 0, stop: Stops = None, **overrides: Any
    ) -> Sample | None:
        """Like `complete(after=...)`, but the turn goes on with `ids` appended as they are (no template between):
        a raw completion prompt that extends an earlier call's prompt and response. The history mask is 1 on the
        earlier response's tokens, 0 on `ids`."""
        runtime = self._claim(stage, worker, overrides)
        self._check_after(after, runtime)
        text, prompt, history = appended(after, list(ids), runtime)
        return self._made_by(await self._call(runtime, worker, text, prompt, overrides, stop), after, history)

    def _claim(self, stage: str, worker: int, overrides: dict[str, Any]) -> Stage:
        """A call's (stage, worker) taken, its overrides and stage checked: the stage's runtime."""
        if (stage, worker) in self._seeds:
            raise UsageError(
                f"the system made two {stage} calls with worker {worker} in one execution: give each "
                "call its own worker number (it derives the call's seed)"
            )
        self._seeds.add((stage, worker))
        unknown = set(overrides) - set(SAMPLING_KEYS)
        if unknown:
            raise UsageError(f"ctx.complete() takes {', '.join(SAMPLING_KEYS)} as overrides, not {sorted(unknown)}")
        if self.engine.declared and stage not in self.engine.declared:
            raise UsageError(
                f"the system calls stage {stage!r}, which it does not declare (its stages: "
                f"{', '.join(self.engine.declared)})"
            )
        return self.engine.stage(stage)

    def _check_after(self, after: Sample, runtime: Stage) -> None:
        if self._made.get(id(after)) is not after:
            raise UsageError("ctx.complete(after=...) continues a sample of this execution only")
        if not same_tokens(self.engine.stage(after.stage).encoder, runtime.encoder):
            raise UsageError(
                f"a {after.stage} conversation cannot go on as {runtime.name}: their stages use other tokenizers"
            )

    def _made_by(self, sample: Sample | None, after: Sample | None, history: History | None) -> Sample | None:
        if sample is not None:
            self._made[id(sample)] = sample
            if after is not None and history is not None:
                self._parents[id(sample)] = after
                sample.turn = after.turn + 1
                sample.history_mask, sample.history_logprobs = history
        return sample

    async def _continue(
        self, after: Sample, messages: list[dict[str, Any]], runtime: Stage, tools: list[dict[str, Any]] | None = None
    ) -> tuple[str, list[int], History]:
        encoder = runtime.encoder
        last = (
            after.response_token_ids[-1]
            if after.finish_reason == "stop" and after.response_token_ids and (not isinstance(after.stop_reason, str))
            else None
        )
        cache = self.engine.separators
        slot = (id(encoder), orjson.dumps([messages, tools], option=orjson.OPT_SORT_KEYS), last)
        injected = cache.get(slot)
        if injected is None:
            try:
                injected = await separator(
                    encoder.tokenizer, messages, encoder.kwargs, last, encoder.server_render, tools
                )
            except CallFailed as exc:
                self.engine.stats.stage(runtime.name).failed_calls += 1
                raise self._failed(f"rendering a {runtime.name} turn on the server failed: {exc}") from exc
            except UsageError:
                raise
            except Exception as exc:  # jinja2 or the tokenizer
                raise UsageError(f"the chat template rejects the {runtime.name} turn: {first_line(exc)}") from exc
            cache[slot] = injected
            if len(cache) > 1024:
                cache.popitem(last=False)
        return appended(after, injected, runtime)

    async def _call(
        self, runtime: Stage, worker: int, text: str, ids: list[int], overrides: dict[str, Any], stop: Stops = None
    ) -> Sample | None:
        cfg = runtime.config.with_overrides(overrides, "ctx.complete()") if overrides else runtime.config
        stage, p, sampling = runtime.name, self.problem, cfg.sampling
        max_tokens = sampling.max_tokens
        if cfg.max_context_len is not None:
            max_tokens = min(max_tokens, cfg.max_context_len - len(ids))
        if max_tokens <= 0:
            self.engine.stats.stage(stage).skipped_calls += 1
            log.debug(
                "%s/%s %s %d: prompt of %d tokens leaves no room", p.id, self.sample_index, stage, worker, len(ids)
            )
            return None
        params = {**sampling.params(), "max_tokens": max_tokens}
        if stop:  # only when asked: the journal's keys of calls without stop strings stay as they were
            params["stop"] = list(stop)
        seed = None
        if cfg.seed is not None:
            parts: tuple[object, ...] = (p.id, self.sample_index, stage, worker)
            params["seed"] = seed = call_seed(cfg.seed, *parts, *((self.attempt,) if self.attempt else ()))
        client = runtime.client
        client.budget.started(self.group)  # its group has placed a call: the stream may admit the next
        journal = self.engine.journal
        sent = call_key(
            p, self.sample_index, self.attempt, stage, worker, (ids, params, cfg.model, cfg.alternatives), self.policy
        )
        found = journal.get(*sent) if journal is not None else None
        if found is not None:  # answered in an earlier run, to exactly this request: replayed
            self.engine.stats.calls_replayed += 1
            done = Completion.from_json(found, ids)
        else:
            prefer = self._endpoints.get(id(client))
            try:
                done = await client.complete(
                    ids,
                    params,
                    cfg.model,
                    cfg.alternatives,
                    prefer=prefer,
                    key=p.content_hash,
                    priority=(self.group, self._rank(stage)),
                )
            except CallFailed as exc:
                self.engine.stats.stage(stage).failed_calls += 1
                log.debug("problem %s sample %d %s %d failed: %s", p.id, self.sample_index, stage, worker, exc)
                raise self._failed(f"{stage} call failed: {exc}") from exc
            if journal is not None:
                journal.put(*sent, (p.id, p.content_hash), done.to_json())
        if done.endpoint in client.by_url:
            self._endpoints[id(client)] = client.by_url[done.endpoint]
        if cfg.routes and done.routed_experts is None:
            raise ServerError(
                f"{done.endpoint} sent no routed_experts: start vLLM with "
                "--enable-return-routed-experts, or drop --return-routed-experts"
            )
        if cfg.masks and done.sampling_mask is None:
            raise ServerError(
                f"{done.endpoint} sent no sampling_mask: start vLLM with --return-sampling-mask (and "
                "--enable-scale-out), or drop --return-sampling-mask"
            )
        response = (
            done.text
            if done.text is not None
            else runtime.encoder.decode_response(done.token_ids, done.finish_reason, done.stop_reason, ids)
        )
        made = sample_of(
            done,
            runtime,
            cfg,
            p,
            rollout_id=self.rollout_id,
            sample_index=self.sample_index,
            worker=worker,
            prompt=(text, ids),
            response=response,
            sampled=sampling_record(sampling, seed, max_tokens),
        )
        if runtime.teacher is not None:  # scored once the execution is done (`scored`)
            self.teaching[id(made)] = (runtime.teacher, made, sent[0])
        return made

    def _rank(self, stage: str) -> int:
        declared = self.engine.declared
        return declared.index(stage) if stage in declared else len(declared)

    # -- rewards ----------------------------------------------------------------------------------------------
    async def reward(self, samples: list[Sample]) -> None:
        """Score samples with the run's reward (the row's own, if it names one): sets `raw_reward`,
        `reward_info`, and `reward` to the raw value (shape it further as the system likes)."""
        self._rewarded += 1  # --judge-mode group: the n-th reward calls of a group's executions meet
        e, p, meet, together = self.engine, self.problem, (self.attempt, self._rewarded), self.config.samples_per_prompt
        try:
            await e.rewards.score(samples, p, e.stats, p.reward, e.journal, meet, together)
        except JudgeFailed as exc:  # no verdict is no reward: the group is not written as scored
            raise self._failed(f"the judge gave no verdict for a {exc}") from exc

    def shape(self, samples: list[Sample], won: bool) -> None:
        """`reward` = raw_reward × --correct-reward-weight when the execution succeeded, else × the incorrect
        weight: the shaping the built-in systems use."""
        weight = self.config.correct_reward_weight if won else self.config.incorrect_reward_weight
        for sample in samples:
            sample.reward = sample.raw_reward * weight

    @property
    def sandbox(self) -> Sandbox:
        """The run's sandbox for model code (the python tool, `--reward code`): local, or `--sandbox-url`."""
        return self.engine.rewards.sandbox

    def _failed(self, why: str) -> ExecutionFailed:
        failure = ExecutionFailed(why)
        self.failure = self.failure or failure
        return failure

    # -- the engine's side ------------------------------------------------------------------------------------
    def finish(self, samples: list[Sample]) -> list[Sample]:
        """Check what the system returned and set the per-execution fields: position links between turns,
        rollout size, final reward."""
        position: dict[int, int] = {}
        for i, sample in enumerate(samples):
            if not isinstance(sample, Sample) or self._made.get(id(sample)) is not sample:
                raise UsageError(
                    "a system must return the Samples its ctx.complete() calls made in this "
                    f"execution, got {type(sample).__name__}"
                )
            if id(sample) in position:
                raise UsageError("a system returned one sample twice")
            position[id(sample)] = i
            parent = self._parents.get(id(sample))
            if parent is not None:
                if id(parent) not in position:
                    raise UsageError(
                        f"a system returned a {sample.stage} turn without the {parent.stage} turn it "
                        "continues, or after it: a trajectory needs every turn, in order"
                    )
                sample.continues = position[id(parent)]
        if not samples:
            raise UsageError("a system returned no samples for an execution")
        p = self.problem  # --judge-mode group: the meetings it did not reach stop waiting for it
        self.engine.rewards.leave((p.id, p.content_hash), self.attempt, self._rewarded, self.config.samples_per_prompt)
        outcome = self.final_reward if self.final_reward is not None else samples[-1].raw_reward
        for sample in samples:
            sample.rollout_size = len(samples)
            sample.final_reward = outcome
            sample.policy = self.policy
        return samples
