"""`tool-use`: the model works a problem with tools, one token-exact conversation per execution.

The tools are offered through the chat template's `tools` argument, as the model was trained to see them. When a
response holds tool calls (read by the `parser`: `hermes` for Qwen2.5/Qwen3, from the answer after the think
block), they are run (side by side), and the conversation goes on by token ids: the response ids stay as
sampled, and the template's separator with the results rendered as `tool` messages (with the call's `name` and
`tool_call_id`) is injected (`history_mask` 0 on it), until the model answers without a call, a response is cut
at max_tokens (it ends the conversation, as verl's agent loop does), or `max_turns` model turns are made. Every
turn is a record, its calls in `tool_calls`.

A call that cannot be read, names no tool, has bad arguments, raises or runs past `tool_timeout` gets its error
as the tool's output, and is counted; the run goes on. A sandbox that cannot run code at all fails the group;
tool threads all held by hung calls end the run (exit 5): an infrastructure failure is never written as what
the model did.

The final turn is rewarded with the run's reward; every turn of the trajectory gets that raw reward (the
trajectory is the last record: its prompt + response, history mask + loss mask), and the execution's outcome is
it. `rescore` does the same from the records.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..context import ExecutionFailed
from ..errors import UsageError
from ..process.concurrency import gather_or_cancel
from ..sandbox import SandboxUnavailable
from ..toolcalls import PYTHON, ParsedCall, Toolbox, ToolResult, call_id, parser_for, tool_text
from . import System
from .tool_use_words import COUNTERS, ToolUseWords

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..context import Context
    from ..record.schema import Sample
    from .recorded import Rescoring

NO_TOOLS = (
    "the chat template renders nothing of the `tools` argument, so the model would never see its tools: use "
    "a model whose template supports tools (Qwen2.5, Qwen3, Llama 3.1 ...), or pass --tokenizer with one"
)


def _number(options: dict[str, Any], name: str, kind: type, low: float) -> None:
    value = options[name]
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (kind is int and not isinstance(value, int))
        or not math.isfinite(value)
        or value < low
    ):
        what = "a whole number" if kind is int else "a number"
        raise UsageError(f"--system-option {name}={value!r}: must be {what} of at least {low:g}")


class ToolUse(System):
    name = "tool-use"
    stages = ("solver",)
    templates = ("solver",)
    options: ClassVar[dict[str, Any]] = {
        "tools": "python",
        "max_turns": 8,
        "tool_timeout": 10.0,
        "max_tool_output": 4096,
        "parser": "hermes",
        "tool_threads": 16,
    }
    version = 2  # 2: a turn cut at max_tokens ends the conversation; tool messages carry name and id
    vocabulary = ToolUseWords()

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        s = self.settings
        _number(s, "max_turns", int, 1)
        _number(s, "tool_timeout", float, 0.001)
        _number(s, "max_tool_output", int, 16)
        _number(s, "tool_threads", int, 1)
        if not isinstance(s["tools"], str) or not isinstance(s["parser"], str):
            raise UsageError("--system-option tools=... and parser=... take names: tools=python,my_tools.py:search")
        self.parse = parser_for(s["parser"])
        self.toolbox = Toolbox.from_spec(s["tools"], float(s["tool_timeout"]), s["max_tool_output"], s["tool_threads"])
        self._template_checked: set[str | None] = set()  # the policies whose template was seen to offer tools

    @property
    def uses_sandbox(self) -> bool:
        return PYTHON in self.toolbox.tools.values()

    async def run(self, ctx: Context) -> list[Sample]:
        tools = self.toolbox.schemas
        prompt = await ctx.problem_prompt("solver", tools=tools)
        if ctx.policy not in self._template_checked:  # once per policy (its own template): a template that
            if prompt == await ctx.problem_prompt("solver"):  # ignores `tools` is a set-up error
                whose = f"policy {ctx.policy}: " if ctx.policy is not None else ""
                raise UsageError(whose + NO_TOOLS + (" (its tokenizer=...)" if whose else ""))
            self._template_checked.add(ctx.policy)
        sample = await ctx.complete("solver", prompt, worker=0)
        if sample is None:  # cannot happen: problem_prompt refuses a prompt that leaves no room
            raise AssertionError("no room after a checked prompt")
        config = ctx.engine.stage("solver").config
        samples = [sample]
        while sample.status != "truncated" and (calls := self.parse(tool_text(sample.response, config.think))):
            last = len(samples) >= self.settings["max_turns"]
            if last:
                results = [self.toolbox.not_run(c, "max_turns reached") for c in calls]
            else:
                results = await gather_or_cancel(*(self._call(c, ctx) for c in calls))
            where = (config.seed, ctx.problem.id, ctx.sample_index, ctx.attempt, sample.turn)
            ids = [c.id or call_id(*where, j) for j, c in enumerate(calls)]
            sample.tool_calls = [{"id": i, **r.record} for i, r in zip(ids, results, strict=True)]
            self._count(ctx, results)
            if last:
                break
            messages = [tool_message(c, r, i) for c, r, i in zip(calls, results, ids, strict=True)]
            turn = await ctx.complete("solver", messages, worker=len(samples), after=sample, tools=tools)
            if turn is None:
                break
            samples.append(turn)
            sample = turn
        ctx.final_reward = await self._settle(samples, ctx.reward)
        ctx.shape(samples, won=ctx.final_reward == 1)
        return samples

    async def rescore(self, execution: Rescoring) -> None:
        """As `run` settles a conversation: the final turn alone is scored, and every turn carries its reward."""
        execution.final_reward = await self._settle(execution.samples, execution.reward)
        execution.shape(execution.samples, won=execution.final_reward == 1)

    async def _settle(self, samples: list[Sample], reward: Callable[[list[Sample]], Awaitable[None]]) -> float:
        """Score the final turn, note why the conversation ended there when it was cut short, and give every
        earlier turn its raw reward. Returns the execution's outcome."""
        final = samples[-1]
        await reward([final])
        ended = self.ending(final)
        if ended:
            final.reward_info = f"{ended}; {final.reward_info}" if final.reward_info else ended
        for i, earlier in enumerate(samples[:-1]):
            earlier.raw_reward = final.raw_reward
            earlier.reward_info = f"turn {i + 1} of {len(samples)}: the final answer scored {final.raw_reward:g}"
        return final.raw_reward

    def ending(self, final: Sample) -> str | None:
        """Why a conversation ended at `final` other than by an answer without calls (None), read from its record."""
        if final.status == "truncated":
            return "the response was cut at max_tokens: the conversation ends with it"
        if not final.tool_calls:
            return None
        if all(c["status"] == "not_run" for c in final.tool_calls):
            return f"max_turns ({self.settings['max_turns']}) reached with tool calls unanswered"
        return "no room left in the context for another turn"

    async def _call(self, call: ParsedCall, ctx: Context) -> ToolResult:
        try:
            # the run's sandbox only where the python tool is offered: a run of the user's tools needs none
            return await self.toolbox.call(call, ctx.sandbox if self.uses_sandbox else None)
        except SandboxUnavailable as exc:
            raise ExecutionFailed(f"the python tool's sandbox failed: {exc}") from exc

    @staticmethod
    def _count(ctx: Context, results: list[ToolResult]) -> None:
        stats = ctx.engine.stats
        stats.count("tool_calls", len(results))
        for result in results:
            if result.status in COUNTERS:
                stats.count(COUNTERS[result.status])


def tool_message(call: ParsedCall, result: ToolResult, identifier: str) -> dict[str, Any]:
    """A result as the template takes it: `name` (templates that label results by tool) and `tool_call_id`
    (the Mistral family's templates require one)."""
    message: dict[str, Any] = {"role": "tool", "content": result.output, "tool_call_id": identifier}
    if call.name:
        message["name"] = call.name
    return message
