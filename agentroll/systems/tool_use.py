"""`tool-use`: the model works a problem with tools, one token-exact conversation per execution.

The tools are offered through the chat template's `tools` argument, as the model was trained to see them. When a
response holds tool calls (read by the `parser`: `hermes` for Qwen2.5/Qwen3), they are run (side by side), and
the conversation goes on by token ids: the response ids stay as sampled, and the template's separator with the
results rendered as `tool` messages is injected (`history_mask` 0 on it), until the model answers without a
call or `max_turns` model turns are made. Every turn is a record, its calls in `tool_calls`.

A call that cannot be read, names no tool, has bad arguments, raises or runs past `tool_timeout` gets its error
as the tool's output, and is counted; the run goes on. Only a sandbox that cannot run code at all fails the
group (an infrastructure failure is never written as what the model did).

The final answer is rewarded with the run's reward; every turn of the trajectory gets that raw reward (the
trajectory is the last record: its prompt + response, history mask + loss mask), and the execution's outcome is it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..concurrency import gather_or_cancel
from ..context import ExecutionFailed
from ..errors import UsageError
from ..sandbox import SandboxUnavailable
from ..toolcalls import ParsedCall, Toolbox, ToolResult, parser_for, tool_text
from . import System

if TYPE_CHECKING:
    from ..context import Context
    from ..schema import Sample

COUNTERS = {
    "malformed": "tool_calls_malformed",
    "unknown": "tool_calls_unknown",
    "failed": "tool_calls_failed",
    "timeout": "tool_calls_timed_out",
    "not_run": "tool_calls_not_run",
}
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
    version = 1

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
        self._template_checked = False

    async def run(self, ctx: Context) -> list[Sample]:
        tools = self.toolbox.schemas
        prompt = await ctx.problem_prompt("solver", tools=tools)
        if not self._template_checked:  # once per run: a template that ignores `tools` is a set-up error
            if prompt == await ctx.problem_prompt("solver"):
                raise UsageError(NO_TOOLS)
            self._template_checked = True
        sample = await ctx.complete("solver", prompt, worker=0)
        if sample is None:  # cannot happen: problem_prompt refuses a prompt that leaves no room
            raise AssertionError("no room after a checked prompt")
        samples, ended = [sample], None
        while calls := self.parse(tool_text(sample.response)):
            if len(samples) >= self.settings["max_turns"]:
                ended = f"max_turns ({self.settings['max_turns']}) reached with tool calls unanswered"
                results = [self.toolbox.not_run(c, "max_turns reached") for c in calls]
            else:
                results = await gather_or_cancel(*(self._call(c, ctx) for c in calls))
            sample.tool_calls = [r.record for r in results]
            self._count(ctx, results)
            if ended:
                break
            messages = [{"role": "tool", "content": r.output} for r in results]
            turn = await ctx.complete("solver", messages, worker=len(samples), after=sample, tools=tools)
            if turn is None:
                ended = "no room left in the context for another turn"
                break
            samples.append(turn)
            sample = turn
        await ctx.reward([sample])
        if ended:
            sample.reward_info = f"{ended}; {sample.reward_info}" if sample.reward_info else ended
        for i, earlier in enumerate(samples[:-1]):
            earlier.raw_reward = sample.raw_reward
            earlier.reward_info = f"turn {i + 1} of {len(samples)}: the final answer scored {sample.raw_reward:g}"
        ctx.final_reward = sample.raw_reward
        ctx.shape(samples, won=sample.raw_reward == 1)
        return samples

    async def _call(self, call: ParsedCall, ctx: Context) -> ToolResult:
        try:
            return await self.toolbox.call(call, ctx.sandbox)
        except SandboxUnavailable as exc:
            raise ExecutionFailed(f"the python tool's sandbox failed: {exc}") from exc

    @staticmethod
    def _count(ctx: Context, results: list[ToolResult]) -> None:
        stats = ctx.engine.stats
        stats.tool_calls += len(results)
        for result in results:
            if result.status in COUNTERS:
                setattr(stats, COUNTERS[result.status], getattr(stats, COUNTERS[result.status]) + 1)
