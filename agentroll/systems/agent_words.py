"""`agent`'s vocabulary: what its records mean to the summary, `stats`, `report`, `validate` and `inspect`.

`Agent` (systems/agent.py) declares `vocabulary = AgentWords()`; its words live here, apart from how it runs.

- figures: the agent's accuracy (its answers that scored 1, one per execution), model calls and tool calls per
  execution, branches per execution (calls that carry earlier assistant turns but continue no call: the agent
  rewrote the history, or sent one the proxy never answered), and the shares of
  calls that continue a conversation by the model's own ids and that had history rendered from text. Counted
  from the records (`tally`), so `stats` and `report` recompute them, with the share of executions whose agent
  failed and was scored as the model's failure (`agent_error`, `on_error=score`); every agent that failed or
  ran out of time, recorded or not, is counted as the run goes (`agents_failed`, `agents_timed_out`), as are the
  agents started and finished (the progress line's agents running) and the branches that differ from a
  continuation only by the reasoning the agent left out (`branches_by_reasoning`: thinking=continue's case);
- checks: `branched_from` names an earlier call, a continued call is not a rerendered one, each `tool_calls`
  entry has its fields and a known status, and every call of an execution carries its answer and raw reward;
- inspect: each call with what it continues or branches from, and its tool calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..record.schema import Sample
from .vocabulary import Figure, Finding, Label, Vocabulary, outcome_is

STATUSES = ("ok", "malformed", "unknown")
KEYS = frozenset({"id", "name", "arguments", "result", "duration_s", "error", "status"})
FIGURES = (
    Figure("agent_accuracy", "agent", "answers_correct", stage="agent"),
    Figure("calls_per_execution", "calls per execution", "calls", unit="per execution"),
    Figure("tool_calls_per_execution", "tool calls per execution", "tool_calls", unit="per execution"),
    Figure("branches_per_execution", "branches per execution", "branches", unit="per execution"),
    Figure("continued_calls", "calls continued by ids", "continued", "calls"),
    Figure("rerendered_calls", "calls with history re-rendered", "rerendered", "calls"),
    Figure("agent_errors", "agents failed (scored 0)", "agent_errors"),
)


class AgentWords(Vocabulary):
    whole_stage = True  # an execution's calls, branches included, are one attempt: one advantage
    figures = FIGURES
    counters = ("agents_started", "agents_finished", "agents_failed", "agents_timed_out", "branches_by_reasoning")

    def progress(self, counters: Mapping[str, float]) -> str | None:
        """Agents running (started, not yet ended), finished, failed: an agent running its tools has no call in
        flight."""
        started, finished = int(counters.get("agents_started", 0)), int(counters.get("agents_finished", 0))
        failed = int(counters.get("agents_failed", 0) + counters.get("agents_timed_out", 0))
        if not started:
            return None
        return f"agents running {max(0, started - finished - failed)}, finished {finished}, failed {failed}"

    def tally(self, samples: list[Sample]) -> Mapping[str, float]:
        return {
            "answers_correct": bool(samples) and samples[-1].raw_reward == 1.0,
            "calls": len(samples),
            "tool_calls": sum(len(s.tool_calls or []) for s in samples),
            "branches": sum(s.continues is None and bool(s.rerendered) for s in samples),
            "continued": sum(s.continues is not None for s in samples),
            "rerendered": sum(bool(s.rerendered) for s in samples),
            "agent_errors": bool(samples) and samples[-1].agent_error is not None,
        }

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        last = samples[-1]
        for at, s in enumerate(samples):
            if s.branched_from is not None and not (
                type(s.branched_from) is int and 0 <= s.branched_from < at and s.continues is None and s.rerendered
            ):
                yield Finding(at, f"branched_from {s.branched_from!r} is not an earlier call of a new branch", "value")
            bad = next((i for i, c in enumerate(s.tool_calls or []) if not _well_formed(c)), None)
            if bad is not None:
                yield Finding(
                    at,
                    f"tool_calls item {bad} is not {{{', '.join(sorted(KEYS))}}} with a status of "
                    f"{', '.join(STATUSES)}",
                    "value",
                )
            if (
                s.agent_answer != last.agent_answer
                or s.agent_error != last.agent_error
                or not math.isclose(s.raw_reward, last.raw_reward, abs_tol=1e-9)
            ):
                yield Finding(
                    at, "an agent's calls differ in agent_answer, agent_error or raw_reward within one execution"
                )
        if last.agent_error is not None and last.raw_reward != 0.0:
            yield Finding(len(samples) - 1, f"an agent that failed is scored 0, not {last.raw_reward}", "value")
        yield from outcome_is(samples, last, "the agent's answer")

    def label(self, sample: Sample, samples: list[Sample]) -> Label:
        position = next(i for i, s in enumerate(samples) if s is sample)
        how = (
            f"continues call {sample.continues + 1}"
            if sample.continues is not None
            else f"a branch off call {sample.branched_from + 1}"
            if sample.branched_from is not None
            else "a branch (history re-rendered)"
            if sample.rerendered
            else "a new conversation"
        )
        calls = sample.tool_calls or []
        made = f" · {len(calls)} tool call{'s' * (len(calls) != 1)}" if calls else ""
        failed = " · the agent failed" if sample.agent_error is not None else ""
        return Label(f"call {position + 1} of {len(samples)} · {how}{made}{failed}")


def _well_formed(call: object) -> bool:
    return isinstance(call, dict) and set(call) == KEYS and call.get("status") in STATUSES
