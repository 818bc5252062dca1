"""`agent`: bring your own agent. Any program or async function that talks to an OpenAI-compatible endpoint runs
unchanged, once per execution, against agentroll's recording proxy (`agentroll.agents`), and every model call it
makes is recorded token-exact: an execution is all of its agent's calls, in the order they finished.

    --system agent --system-option command="python my_agent.py"      # any program: OPENAI_BASE_URL, OPENAI_API_KEY
    --system agent --system-option agent=my_agent.py:run             # async def run(client, problem)

The agent's final answer (its last stdout line, its return value, or `{"answer": ..., "reward": ...}`) is scored
with the run's reward, or, with `--reward agent`, is worth the reward the agent reported; every call of the
execution carries that raw reward, and the execution's outcome is it. An agent that crashes, exits non-zero or
runs out of time after its calls is, with `on_error=score` (the default), the model's failure: its calls are
recorded with `agent_error` saying why, raw reward 0; with `on_error=fail` it fails its group as an
infrastructure failure (which a rerun, replaying its calls from the journal, fails again). An agent that makes no
call fails its group either way. Options: `command` or `agent` (one of them), `timeout` (seconds of wall clock per
execution), `on_error`,
`max_agents` (agents running at once over the run: an execution waits its turn),
`parser` (the tool-call parser: hermes, llama3_json, mistral, FILE.py:NAME), `thinking` (`branch`: an answer the
agent echoes back without its reasoning starts a new branch; `continue`: it continues the conversation by the
model's own tokens, thinking included), `sampling` (`agent`: a request's temperature, top_p, top_k, min_p and
max_tokens are honoured; `run`: every call goes out with the run's, and each record keeps what the agent asked
in `agent_sampling`). docs/agents.md.
"""

from __future__ import annotations

import asyncio
import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ..context import ExecutionFailed
from ..errors import UsageError
from ..toolcalls import parser_for
from . import System
from .agent_words import AgentWords

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..agents.launch import Outcome, Watchdog
    from ..agents.proxy import Proxy
    from ..context import Context
    from ..inputs import Problem
    from ..record.schema import Sample
    from .recorded import Rescoring

OWN = "agent"  # --reward agent: the reward the agent reports
ON_ERROR = ("score", "fail")  # an agent that failed after its calls: the model's failure (reward 0), or the group's
FAILED_REWARD = 0.0  # the raw reward of an execution whose agent failed (on_error=score)


class AgentCrashed(ExecutionFailed):
    """The agent failed its execution in a way a rerun repeats: the call journal replays the same answers to it."""

    rerun_helps = False


class Agent(System):
    name = "agent"
    stages = ("agent",)
    options: ClassVar[dict[str, Any]] = {
        "command": None,
        "agent": None,
        "timeout": 600.0,
        "max_agents": 64,
        "parser": "hermes",
        "thinking": "branch",
        "sampling": "agent",
        "on_error": "score",
    }
    version = 1
    vocabulary = AgentWords()
    reports_reward = True  # --reward agent is this system's

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        s = self.settings
        if (s["command"] is None) == (s["agent"] is None):
            raise UsageError(
                '--system agent runs your agent: give --system-option command="python my_agent.py" (a program) '
                "or --system-option agent=my_agent.py:run (an async function), one of the two"
            )
        for key in ("command", "agent", "parser"):
            if s[key] is not None and (not isinstance(s[key], str) or not s[key].strip()):
                raise UsageError(f"--system-option {key}={s[key]!r}: must be a non-empty text")
        timeout = s["timeout"]
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise UsageError(f"--system-option timeout={timeout!r}: must be a number of seconds above 0")
        most = s["max_agents"]
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise UsageError(f"--system-option max_agents={most!r}: must be a whole number of at least 1")
        if s["thinking"] not in ("branch", "continue"):
            raise UsageError(f"--system-option thinking={s['thinking']!r}: must be branch or continue")
        if s["sampling"] not in ("agent", "run"):
            raise UsageError(f"--system-option sampling={s['sampling']!r}: must be agent or run")
        if s["on_error"] not in ON_ERROR:
            raise UsageError(f"--system-option on_error={s['on_error']!r}: must be {' or '.join(ON_ERROR)}")
        self.parse = parser_for(s["parser"])
        self._proxy: asyncio.Future[Proxy] | None = None
        self._function: Any = None
        self._watchdog: Watchdog | None = None  # a program's: kills what agents left when agentroll dies
        self._turns: asyncio.Semaphore | None = None  # agents running at once: at most max_agents

    async def _ready(self) -> Proxy:
        """The run's proxy, started by the first execution (the others wait for it), and the agent function."""
        if self._proxy is None:
            self._proxy = asyncio.ensure_future(self._start())
            self._turns = asyncio.Semaphore(self.settings["max_agents"])
        return await asyncio.shield(self._proxy)

    async def _start(self) -> Proxy:
        from ..agents.launch import Watchdog, load_function
        from ..agents.proxy import Proxy

        if self.settings["agent"] is not None:
            # as a program is started (launch.py): the Agents SDK would send traces to OpenAI, with the real
            # OPENAI_API_KEY this process may have
            os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
            self._function = load_function(self.settings["agent"])
        else:
            self._watchdog = Watchdog()
            self._watchdog.start()
        proxy = Proxy()  # each request served as its execution's model (a head-to-head run: its policy's)
        await proxy.start()
        return proxy

    async def aclose(self) -> None:
        started, self._proxy = self._proxy, None
        watchdog, self._watchdog = self._watchdog, None
        try:
            if started is not None and started.done() and not started.cancelled() and started.exception() is None:
                await started.result().aclose()
        finally:
            if watchdog is not None:
                await watchdog.aclose()

    async def run(self, ctx: Context) -> list[Sample]:
        proxy = await self._ready()
        assert self._turns is not None
        async with self._turns:  # an execution waits for its turn: the agents running at once are bounded
            return await self._execution(ctx, proxy)

    async def _execution(self, ctx: Context, proxy: Proxy) -> list[Sample]:
        from ..agents.launch import AgentFailed, Outcome
        from ..agents.session import Session

        session = Session(ctx, self.parse, self.settings["thinking"], pinned=self.settings["sampling"] == "run")
        credential = proxy.open(session)
        ctx.engine.stats.count("agents_started")
        work = asyncio.ensure_future(self._agent(ctx, proxy.url, credential))
        error: str | None = None
        try:
            either: list[asyncio.Future[Any]] = [work, session.failed]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if session.failed.done():  # a call failed for good (or the run must stop): the agent is stopped
                raise session.failed.result()
            outcome = work.result()
        except AgentFailed as exc:
            ctx.engine.stats.count("agents_timed_out" if exc.timed_out else "agents_failed")
            if self.settings["on_error"] == "fail" or not session.samples:
                # replayed from the journal, its calls get the same answers: a rerun fails it again (a timeout may
                # have been the server's slowness, which a replay does not repeat)
                raise (ExecutionFailed if exc.timed_out else AgentCrashed)(f"the agent {exc}") from exc
            error, outcome = f"the agent {exc}", Outcome(None)
        finally:
            if not work.done():
                work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            proxy.close(credential)
            await session.close()
        samples = session.samples
        if not samples:
            ctx.engine.stats.count("agents_failed")
            raise AgentCrashed("the agent made no model call")
        if error is None:
            ctx.engine.stats.count("agents_finished")
        for sample in samples:
            sample.agent_answer, sample.agent_reward = outcome.answer, outcome.reward
            sample.agent_error = error
        ctx.final_reward = await self._settle(samples, ctx.reward, ctx.problem, ctx.engine.rewards.settings.default)
        ctx.shape(samples, won=ctx.final_reward == 1)
        return samples

    async def _agent(self, ctx: Context, url: str, credential: str) -> Outcome:
        from ..agents.launch import PROBLEM_ENV, direct, openai_client, run_function, run_program

        problem = ctx.problem
        row = {**problem.metadata, "id": problem.id, "prompt": problem.prompt, "messages": messages_of(problem.prompt)}
        row["label"] = problem.label
        timeout = float(self.settings["timeout"])
        if self._function is not None:
            return await run_function(self._function, openai_client(url, credential, timeout), row, timeout)
        data = orjson.dumps(row)
        env = {
            **direct(dict(os.environ)),
            "OPENAI_BASE_URL": url,
            "OPENAI_API_BASE": url,
            "OPENAI_API_KEY": credential,
            "AGENTROLL_MODEL": ctx.engine.stage("agent").config.model,
            "AGENTROLL_SAMPLE_INDEX": str(ctx.sample_index),
        }
        env.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
        env.pop("AGENTROLL_PROBLEM", None)
        if len(data) <= PROBLEM_ENV:
            env["AGENTROLL_PROBLEM"] = data.decode()
        return await run_program(self.settings["command"], env, data, timeout, self._watchdog)

    async def rescore(self, execution: Rescoring) -> None:
        """As `run` settles an execution, from the answer (and the agent's own reward) its records keep."""
        samples = execution.samples
        execution.final_reward = await self._settle(
            samples, execution.reward, execution.problem, execution.rewards.settings.default
        )
        execution.shape(samples, won=execution.final_reward == 1)

    async def _settle(
        self,
        samples: list[Sample],
        reward: Callable[[list[Sample]], Awaitable[None]],
        problem: Problem,
        default: str,
    ) -> float:
        """Score the agent's answer (or take its own reward) and give every call of the execution that raw
        reward. Returns the execution's outcome."""
        last = samples[-1]
        if last.agent_error is not None:  # the agent failed on what the model did: a failure, whatever the reward
            value, info = FAILED_REWARD, f"scored {FAILED_REWARD:g}: {last.agent_error}"
        elif (problem.reward or default) == OWN:
            if last.agent_reward is None:
                raise ExecutionFailed(
                    '--reward agent: the agent reported no reward (print {"answer": ..., "reward": ...})'
                )
            value, info = last.agent_reward, "the agent's own reward"
        else:
            answer = replace(last, content=last.agent_answer, response=last.agent_answer or "")
            await reward([answer])
            value = answer.raw_reward
            info = f"the agent's answer scored {value:g}" + (f": {answer.reward_info}" if answer.reward_info else "")
            last.judge = answer.judge  # what a judge said of the answer (a failure holds the group back)
            for sample in samples:
                sample.reward_components = answer.reward_components
        for sample in samples:
            sample.raw_reward = sample.reward = value
            sample.reward_info = info
        return value


def messages_of(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The row's prompt as chat messages, whichever form it came in: a text is one user message, a list of
    messages (each with a string role and content: the input check) is copied as given. An agent sends these
    without telling the two forms apart."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(message) for message in prompt]
