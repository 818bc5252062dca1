"""One execution of the three-stage agent system: N solvers -> N rewriters -> one selector.

Every call that the server answers becomes a `Sample`. The stages pass on answer *contents* (the text after
`</think>`), and the selector's pick is matched to a rewrite by its index in the list it was shown, never by
comparing text. Rewards are shaped at the end by whether that pick was correct.

A call or a server-side render that fails for good fails the whole execution (`ExecutionFailed`): an
infrastructure failure must never be recorded as a model outcome, such as "no rewriter had content".
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .chat import ChatEncoder
from .client import CallFailed, CompletionClient, Endpoint
from .errors import InputError, ServerError, UsageError
from .inputs import Problem
from .options import GenerateOptions, default_of
from .parsing import answer_content, parse_judgment
from .rewards import RewardRequest, RewardSet
from .schema import Sample, status_for
from .stats import RunStats
from .templates import Templates

log = logging.getLogger("agentroll")


class ExecutionFailed(Exception):
    """A call or a render of this execution failed for good: the execution (and its group) is not written."""


def _default(name: str) -> Any:
    return default_of(GenerateOptions.__dataclass_fields__[name])


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemConfig:
    """How the agent system samples and shapes (the defaults are `GenerateOptions`')."""

    model: str
    num_parallel: int = _default("num_parallel")
    samples_per_prompt: int = _default("samples_per_prompt")
    max_tokens: int = _default("max_tokens")
    max_context_len: int | None = None
    temperature: float = _default("temperature")
    top_p: float = _default("top_p")
    top_k: int = _default("top_k")
    min_p: float = _default("min_p")
    seed: int | None = None
    alternatives: int = 0  # --logprobs K
    routes: bool = False  # --return-routed-experts
    correct_reward_weight: float = _default("correct_reward_weight")
    incorrect_reward_weight: float = _default("incorrect_reward_weight")
    think: bool = True

    @classmethod
    def from_options(cls, options: GenerateOptions, model: str, max_context_len: int | None) -> SystemConfig:
        return cls(model=model, num_parallel=options.num_parallel, samples_per_prompt=options.samples_per_prompt,
                   max_tokens=options.max_tokens, max_context_len=max_context_len, temperature=options.temperature,
                   top_p=options.top_p, top_k=options.top_k, min_p=options.min_p, seed=options.seed,
                   alternatives=options.logprobs, routes=options.return_routed_experts,
                   correct_reward_weight=options.correct_reward_weight,
                   incorrect_reward_weight=options.incorrect_reward_weight, think=not options.no_think)

    def sampling(self) -> dict[str, Any]:
        """Every sampling parameter that shapes the distribution, sent explicitly: vLLM fills a missing one from
        the model's generation_config.json, which would make the recorded values wrong."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def call_seed(seed: int, *parts: object) -> int:
    """A distinct, reproducible seed per call: one seed for all N parallel solvers would make them identical."""
    key = "/".join(map(str, parts)).encode()
    return (seed * 1_000_003 + zlib.crc32(key)) % (2**31 - 1)


@dataclass(slots=True)
class _Execution:
    problem: Problem
    sample_index: int
    rollout_id: str
    attempt: int = 0
    endpoint: Endpoint | None = None


async def gather_or_cancel(*aws: Any) -> list[Any]:
    """`gather`, but the first failure cancels the rest: a failed execution's other calls are not worth paying
    for, and vLLM frees their KV cache when their connections close."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def final_reward(samples: list[Sample]) -> float:
    """An execution's outcome: the selector's raw_reward, or 0 when it stopped before a selection."""
    return next((s.raw_reward for s in samples if s.stage == "selector"), 0.0)


class AgentSystem:
    def __init__(
        self,
        client: CompletionClient,
        encoder: ChatEncoder,
        templates: Templates,
        rewards: RewardSet,
        config: SystemConfig,
        stats: RunStats,
        prompt_key: str = "prompt",
    ) -> None:
        self.prompt_key = prompt_key
        self.client, self.encoder, self.templates = client, encoder, templates
        self.rewards, self.config, self.stats = rewards, config, stats
        self._params = config.sampling()
        self._solver_prompts: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()

    async def run(self, problem: Problem, sample_index: int, attempt: int = 0) -> list[Sample]:
        """All samples of one execution, rewards shaped, in stage order (solvers, rewriters, selector).

        `attempt` > 0 re-runs a problem (--resample-uniform); it changes the per-call seeds."""
        ex = _Execution(problem, sample_index, uuid.uuid4().hex, attempt)
        n = self.config.num_parallel
        solver_prompt = await self.solver_prompt(problem, self.prompt_key)
        solvers = await self._stage(ex, "solver", [solver_prompt] * n)
        await self._score(ex, solvers)
        contents = [s.content for s in solvers if s.content is not None]
        if not contents:
            return self._shape(solvers, won=False)

        prompt = await self._render("rewriter", self.templates.messages("rewriter", problem.statement, contents))
        rewriters = await self._stage(ex, "rewriter", [prompt] * n)
        await self._score(ex, rewriters)
        listed = [r for r in rewriters if r.content is not None]
        for position, rewrite in enumerate(listed, start=1):
            rewrite.listed_as = position
        if not listed:
            return self._shape(solvers + rewriters, won=False)

        messages = self.templates.messages("selector", problem.statement, [r.content or "" for r in listed])
        selector_prompt = await self._render("selector", messages)
        selector = await self._call(ex, "selector", 0, selector_prompt)
        if selector is None:  # no room left for the selector in the context window
            return self._shape(solvers + rewriters, won=False)
        k = parse_judgment(selector.content) if selector.content is not None else None
        selector.judgment = k
        if k is not None and 1 <= k <= len(listed):
            selector.raw_reward = listed[k - 1].raw_reward
            selector.reward_info = f"picked rewrite {k} of {len(listed)}"
        else:
            selector.raw_reward = 0.0
            selector.reward_info = "no content" if selector.content is None else (
                "no judgment" if k is None else f"judgment {k} out of range 1..{len(listed)}"
            )
        return self._shape([*solvers, *rewriters, selector], won=selector.raw_reward == 1)

    async def solver_prompt(self, problem: Problem, key: str = "prompt") -> tuple[str, list[int]]:
        """Rendered once per problem and reused by its N solvers and K executions. A prompt that the chat
        template rejects, or that leaves no room to generate, is a bad input row (`InputError`, field `key`)."""
        cached = self._solver_prompts.get(problem.content_hash)
        if cached is None:
            messages = (
                problem.prompt
                if isinstance(problem.prompt, list)
                else self.templates.messages("solver", problem.statement)
            )
            try:
                cached = await self._render("solver", messages)
            except UsageError as exc:
                if isinstance(problem.prompt, list):  # the row's own messages: the row is bad
                    raise InputError(problem.source, problem.line, key, str(exc)) from exc
                raise  # our solver template, rendered: the set-up is bad, not the row
            limit = self.config.max_context_len
            if limit is not None and len(cached[1]) >= limit:
                raise InputError(problem.source, problem.line, key, f"the rendered prompt has {len(cached[1])} "
                                 f"tokens: no room to generate within a context of {limit}")
            self._solver_prompts[problem.content_hash] = cached
            if len(self._solver_prompts) > 1024:
                self._solver_prompts.popitem(last=False)
        return cached

    async def _render(self, stage: str, messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
        """The prompt's text and ids. A server-side render that fails for good fails the execution; a local
        chat template that rejects the messages is a `UsageError` (the row's fault for a solver prompt)."""
        try:
            return await self.encoder.render(messages)
        except CallFailed as exc:
            self.stats.stages[stage].failed_calls += 1
            raise ExecutionFailed(f"rendering a {stage} prompt on the server failed: {exc}") from exc
        except Exception as exc:  # jinja2 or the tokenizer: "roles must alternate", a raise_exception(...)
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"the chat template rejects the {stage} messages: {detail}") from exc

    async def _stage(self, ex: _Execution, stage: str, prompts: list[tuple[str, list[int]]]) -> list[Sample]:
        results = await gather_or_cancel(*(self._call(ex, stage, w, p) for w, p in enumerate(prompts)))
        return [s for s in results if s is not None]

    async def _call(self, ex: _Execution, stage: str, worker: int, prompt: tuple[str, list[int]]) -> Sample | None:
        """One LLM call, or None when there was no room left to generate (a deterministic outcome of the
        earlier stages' lengths). A call that fails for good raises `ExecutionFailed`."""
        text, ids = prompt
        cfg = self.config
        max_tokens = cfg.max_tokens
        if cfg.max_context_len is not None:
            max_tokens = min(max_tokens, cfg.max_context_len - len(ids))
        if max_tokens <= 0:
            self.stats.stages[stage].skipped_calls += 1
            log.debug("%s/%s %s %d: prompt of %d tokens leaves no room", ex.problem.id, ex.sample_index, stage,
                      worker, len(ids))
            return None
        params = {**self._params, "max_tokens": max_tokens}
        seed = None
        if cfg.seed is not None:
            parts: tuple[object, ...] = (ex.problem.id, ex.sample_index, stage, worker)
            params["seed"] = seed = call_seed(cfg.seed, *parts, *((ex.attempt,) if ex.attempt else ()))
        try:
            done = await self.client.complete(ids, params, cfg.model, cfg.alternatives, prefer=ex.endpoint,
                                              key=ex.problem.content_hash)
        except CallFailed as exc:
            self.stats.stages[stage].failed_calls += 1
            log.warning("problem %s sample %d %s %d failed: %s", ex.problem.id, ex.sample_index, stage, worker, exc)
            raise ExecutionFailed(f"{stage} call failed: {exc}") from exc
        ex.endpoint = self.client.by_url[done.endpoint]  # later calls follow the endpoint that answered
        if cfg.routes and done.routed_experts is None:
            raise ServerError(f"{done.endpoint} sent no routed_experts: start vLLM with "
                              "--enable-return-routed-experts, or drop --return-routed-experts")
        response = done.text if done.text is not None else self.encoder.decode_response(
            done.token_ids, done.finish_reason, done.stop_reason, ids)
        return Sample(
            problem_id=ex.problem.id,
            problem_hash=ex.problem.content_hash,
            rollout_id=ex.rollout_id,
            sample_index=ex.sample_index,
            group_size=cfg.samples_per_prompt,
            stage=stage,
            worker=worker,
            prompt=text,
            prompt_token_ids=ids,
            response=response,
            response_token_ids=done.token_ids,
            response_logprobs=done.logprobs,
            loss_mask=[1] * len(done.token_ids),
            status=status_for(done.finish_reason),
            finish_reason=done.finish_reason,
            stop_reason=done.stop_reason,
            content=answer_content(response, think=cfg.think),
            raw_reward=0.0,
            reward=0.0,
            label=ex.problem.label,
            model=cfg.model,
            endpoint=done.endpoint,
            latency_s=round(done.latency_s, 4),
            attempts=done.attempts,
            metadata=ex.problem.metadata,
            sampling={"seed": seed, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
                      "min_p": cfg.min_p, "max_tokens": max_tokens},
            response_ranks=done.ranks,
            top_token_ids=done.top_token_ids,
            top_logprobs=done.top_logprobs,
            weight_versions=done.weight_versions,
            routed_experts=done.routed_experts if cfg.routes else None,
        )

    async def _score(self, ex: _Execution, samples: list[Sample]) -> None:
        if not samples:
            return
        p = ex.problem
        requests = [
            RewardRequest(s.content, p.label, p.statement, s.stage, p.metadata, s.response, p.prompt, p.id)
            for s in samples
        ]
        results = await self.rewards.get(p.reward).score(requests)
        for sample, result in zip(samples, results, strict=True):
            sample.raw_reward = float(result.value)
            sample.reward_info = result.info
            if result.failed == "timeout":
                self.stats.reward_timeouts += 1
            elif result.failed == "error":
                self.stats.reward_errors += 1
            elif result.failed == "invalid":
                self.stats.reward_invalid += 1

    def _shape(self, samples: list[Sample], won: bool) -> list[Sample]:
        weight = self.config.correct_reward_weight if won else self.config.incorrect_reward_weight
        outcome = final_reward(samples)
        for sample in samples:
            sample.reward = sample.raw_reward * weight
            sample.rollout_size = len(samples)
            sample.final_reward = outcome
        return samples
