"""`tool-use`'s vocabulary: what its records mean to the report, `validate` and `inspect`.

`ToolUse` (systems/tool_use.py) declares `vocabulary = ToolUseWords()`; its words live here, apart from how it runs.

- figures: the solver's accuracy over the conversations (each its last turn: a conversation of many turns
  counts once; one conversation per execution, so no majority vote nor best of N), and the share of the calls
  written that ran fine (`tool_calls_ok`).
  The run's own call counters (`tool_calls`, `tool_calls_failed`, ...: every call made, in written groups or
  not) are counted by the system as it runs, not from the records;
- checks: each `tool_calls` entry has exactly its fields (`id`, a string, absent in older records) and a known
  status; every turn carries the final
  answer's raw reward, and the execution's outcome is it;
- inspect: each turn with its calls and how they went.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..record.schema import Sample
from .vocabulary import Figure, Finding, Label, Vocabulary, outcome_is
from .votes import answers

TOOL_CALL_KEYS = frozenset({"name", "arguments", "result", "duration_s", "error", "status"})
# and the call's "id" (the next turn's tool_call_id), a string: absent in records written before it was kept
TOOL_STATUSES = ("ok", "malformed", "unknown", "failed", "timeout", "not_run")
# a call's status -> the run counter it adds to (every call adds to `tool_calls`; `ok` has no counter of its own)
COUNTERS = {
    "malformed": "tool_calls_malformed",
    "unknown": "tool_calls_unknown",
    "failed": "tool_calls_failed",
    "timeout": "tool_calls_timed_out",
    "not_run": "tool_calls_not_run",
}
CALLS_OK = Figure("tool_calls_ok", "tool calls ok", "written_tool_calls_ok", "written_tool_calls")
# the solver's accuracy over conversations (every turn carries the final answer's reward: per turn, long
# conversations would weigh more)
CONVERSATIONS = Figure("solver_accuracy", "solver", "solver_answers_correct", "solver_answers", stage="solver")


class ToolUseWords(Vocabulary):
    figures = (CONVERSATIONS, CALLS_OK)
    counters = ("tool_calls", *COUNTERS.values())

    def tally(self, samples: list[Sample]) -> Mapping[str, float]:
        calls = [c for s in samples for c in s.tool_calls or []]
        ok = sum(isinstance(c, dict) and c.get("status") == "ok" for c in calls)
        final = answers(samples)
        return {
            "solver_answers": len(final),
            "solver_answers_correct": sum(s.raw_reward == 1.0 for s in final),
            "written_tool_calls": len(calls),
            "written_tool_calls_ok": ok,
        }

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        for at, sample in enumerate(samples):
            bad = next((i for i, c in enumerate(sample.tool_calls or []) if not _well_formed(c)), None)
            if bad is not None:
                yield Finding(
                    at,
                    f"tool_calls item {bad} is not {{{', '.join(sorted(TOOL_CALL_KEYS))}}} (and a string id) "
                    f"with a status of {', '.join(TOOL_STATUSES)}",
                    "value",
                )
        last = samples[-1]
        other = next((i for i, s in enumerate(samples) if not _close(s.raw_reward, last.raw_reward)), None)
        if other is not None:
            yield Finding(
                other,
                f"raw_reward {samples[other].raw_reward} differs from the final turn's ({last.raw_reward}, "
                f"record {len(samples) - 1}) in tool-use execution {last.rollout_id[:12]}",
            )
        yield from outcome_is(samples, last, "the final turn")

    def label(self, sample: Sample, samples: list[Sample]) -> Label:
        position = next(i for i, s in enumerate(samples) if s is sample)
        calls = sample.tool_calls or []
        said = ", ".join(f"{c.get('name')} {c.get('status')}" for c in calls if isinstance(c, dict))
        made = f" · {len(calls)} tool call{'s' * (len(calls) != 1)} ({said})" if calls else ""
        return Label(f"turn {position + 1} of {len(samples)}{made}")


def _well_formed(call: object) -> bool:
    return (
        isinstance(call, dict)
        and set(call) - {"id"} == TOOL_CALL_KEYS
        and isinstance(call.get("id", ""), str)
        and call.get("status") in TOOL_STATUSES
        and isinstance(call.get("duration_s"), int | float)
    )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
