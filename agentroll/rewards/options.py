"""The reward options, declared once: `agentroll generate` has them (`GenerateOptions` extends `RewardOptions`)
and so has `agentroll rescore`, with the same names, defaults, help and checks; `reward_settings()` makes the
rewards' value object, which is what is passed on (whole) to `RewardSet` and `agentroll.rescore`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..client.settings import Retries, Timeouts, read_key
from ..errors import UsageError
from ..sandbox import SandboxSettings
from ..settings.declare import at_least, check_types, option, positive
from . import RewardSettings
from .components import parse_components
from .judge import DEFAULT_PATTERN, JudgeSettings, load_template

REWARDS, RETRIES, TIMEOUTS = RewardSettings(), Retries(), Timeouts()
JUDGE_KEY_ENV = "AGENTROLL_JUDGE_API_KEY"


@dataclass(frozen=True, kw_only=True)
class RewardOptions:
    """How answers are scored: the reward, its limits, the sandbox that runs model code, the code reward."""

    reward: str = option(
        REWARDS.default,
        "math | exact | code | remote | judge (--judge-url) | agent (--system agent) | FILE.py:FUNCTION | "
        "MODULE:FUNCTION",
    )
    reward_component: list[str] = option(
        [],
        "NAME=SPEC[*WEIGHT]: one part of the reward, the rewards' weighted sum (repeatable; e.g. correct=math, "
        "style=judge*0.5, length=my.py:penalty*-0.1). Each part's value and weight land in reward_components.",
    )
    reward_timeout: float = option(REWARDS.timeout_s, "Seconds per reward check (or reward-model request).")
    reward_url: str | None = option(None, "Reward model URL, for --reward remote.")
    reward_workers: int = option(0, "Math-check worker processes (0: a quarter of the cores, at least 1).")
    reward_concurrency: int = option(
        REWARDS.concurrency, "Most reward calls in flight: reward-model requests or function threads."
    )
    max_retries: int = option(RETRIES.max_retries, "Retries per call for transient failures.")
    connect_timeout: float = option(TIMEOUTS.connect_s, "Seconds to open a connection to a server.")
    # -- model code: the sandbox, the code reward (docs/tool-use.md, docs/rewards.md) --------------------------------
    sandbox: str = option(
        REWARDS.sandbox.mode,
        "bwrap | unsafe-local: model code runs locally in bubblewrap, or (asked for by name) without a "
        "filesystem sandbox.",
    )
    sandbox_url: str | None = option(
        None, "SandboxFusion server that runs model code (its /run_code) instead of the local sandbox."
    )
    sandbox_concurrency: int = option(0, "Most sandbox runs at once (0: one per core).")
    sandbox_memory_mb: int = option(REWARDS.sandbox.memory_mb, "Memory per sandbox run, all its processes, in MB.")
    sandbox_processes: int = option(REWARDS.sandbox.processes, "Processes and threads per sandbox run.")
    sandbox_disk_mb: int = option(REWARDS.sandbox.disk_mb, "Files per sandbox run (its tmpfs), in MB.")
    code_test_timeout: float = option(REWARDS.code_test_timeout_s, "--reward code: seconds per test.")
    code_partial_credit: bool = option(
        REWARDS.code_partial_credit, "--reward code: the fraction of tests passed, not 1 only when all pass."
    )

    # -- an LLM judge (docs/rewards.md#an-llm-judge) ------------------------------------------------------------
    judge_url: str | None = option(None, "--reward judge: the judge's OpenAI-compatible server (its /v1).")
    judge_model: str | None = option(None, "--reward judge: the judge's served model name.")
    judge_prompt: str | None = option(
        None, "--reward judge: the judge's prompt template (a file, or a built-in: correctness, rubric, ...)."
    )
    judge_api_key_file: str | None = option(
        None, f"A file holding the judge's API key (its first line; default: ${JUDGE_KEY_ENV})."
    )
    judge_concurrency: int = option(16, "Most judge requests in flight (apart from --concurrency).")
    judge_timeout: float = option(120.0, "Seconds per judge request attempt.")
    judge_retries: int = option(3, "Judge requests again per sample: an HTTP failure, no score, out of range.")
    judge_max_tokens: int = option(1024, "The judge's max_tokens per verdict.")
    judge_temperature: float = option(0.0, "The judge's sampling temperature.")
    judge_parse: str = option("score", "score: the reply's last 'Score: X' | json: its last {\"score\": X}.")
    judge_pattern: str = option(
        DEFAULT_PATTERN, "A regex with one group: the judge's score (its last match).", shown="Score: X"
    )
    judge_scale: str = option("0:1", "LO:HI, the judge's score range, mapped onto 0..1 (a score outside: retried).")
    judge_mode: str = option("sample", "sample: one request per answer | group: a problem's K answers together.")
    judge_failures: str = option(
        "fail",
        "fail: a group with a sample the judge gave no verdict is not written (exit 8, a rerun asks "
        "again) | keep: written, frozen (trainable false), no verdict.",
    )

    def __post_init__(self) -> None:
        check_types(self)
        self.check_rewards()

    def check_rewards(self) -> None:
        """Each reward option in its range (a subclass's `__post_init__` calls this among its own checks)."""
        at_least(self, 1, "reward_concurrency")
        at_least(self, 0, "max_retries", "reward_workers", "sandbox_concurrency")
        at_least(self, 16, "sandbox_memory_mb")
        at_least(self, 1, "sandbox_processes", "sandbox_disk_mb")
        if self.sandbox not in ("bwrap", "unsafe-local"):
            raise UsageError(f"--sandbox must be bwrap or unsafe-local, got {self.sandbox!r}")
        positive(self, "reward_timeout", "connect_timeout", "code_test_timeout")
        if self.sandbox_url is not None and not self.sandbox_url.startswith(("http://", "https://")):
            raise UsageError(f"--sandbox-url {self.sandbox_url!r} must be an http:// or https:// URL")
        at_least(self, 1, "judge_concurrency", "judge_max_tokens")
        at_least(self, 0, "judge_retries")
        positive(self, "judge_timeout")
        for name, allowed in (
            ("judge_parse", ("score", "json")),
            ("judge_mode", ("sample", "group")),
            ("judge_failures", ("fail", "keep")),
        ):
            if getattr(self, name) not in allowed:
                flag = "--" + name.replace("_", "-")
                raise UsageError(f"{flag} must be {' or '.join(allowed)}, got {getattr(self, name)!r}")
        self._scale()
        parse_components(list(self.reward_component or []))

    def _scale(self) -> tuple[float, float]:
        lo, sep, hi = str(self.judge_scale).partition(":")
        try:
            scale = (float(lo), float(hi))
        except ValueError:
            scale = (0.0, 0.0)
        if not sep or not scale[0] < scale[1]:
            raise UsageError(f"--judge-scale {self.judge_scale!r} must be LO:HI with LO < HI, e.g. 1:10")
        return scale

    def judge_settings(self) -> JudgeSettings | None:
        """The judge's settings when the run (or a row: --allow-reward judge) may use one; `UsageError` naming
        what --reward judge lacks. The key is read here, once: from the file, else the environment."""
        specs = {self.reward, *(c.spec for c in parse_components(list(self.reward_component or [])))}
        if not self.judge_url and "judge" not in specs:
            return None
        missing = [f for f in ("judge_url", "judge_model", "judge_prompt") if not getattr(self, f)]
        if missing:
            flags = ", ".join("--" + f.replace("_", "-") for f in missing)
            raise UsageError(f"--reward judge needs {flags}")
        key = os.environ.get(JUDGE_KEY_ENV) or None
        if self.judge_api_key_file is not None:
            key = read_key(str(self.judge_api_key_file), "--judge-api-key-file")
        try:
            if re.compile(self.judge_pattern).groups != 1:
                raise re.error("it needs exactly one group (the score)")
        except re.error as exc:
            raise UsageError(f"--judge-pattern {self.judge_pattern!r}: {exc}") from None
        return JudgeSettings(
            url=str(self.judge_url),
            model=str(self.judge_model),
            prompt=str(self.judge_prompt),
            messages=load_template(str(self.judge_prompt)),
            api_key=key,
            concurrency=self.judge_concurrency,
            timeout_s=self.judge_timeout,
            max_retries=self.judge_retries,
            max_tokens=self.judge_max_tokens,
            temperature=self.judge_temperature,
            parse=self.judge_parse,
            pattern=self.judge_pattern,
            scale=self._scale(),
            mode=self.judge_mode,
            failures=self.judge_failures,
        )

    def reward_settings(self) -> RewardSettings:
        workers = self.reward_workers or max(1, (os.cpu_count() or 1) // 4)
        sandbox = SandboxSettings(
            url=self.sandbox_url,
            mode=self.sandbox,
            concurrency=self.sandbox_concurrency,
            memory_mb=self.sandbox_memory_mb,
            processes=self.sandbox_processes,
            disk_mb=self.sandbox_disk_mb,
            max_retries=self.max_retries,
            connect_timeout_s=self.connect_timeout,
        )
        return RewardSettings(
            self.reward,
            self.reward_timeout,
            self.reward_url,
            self.reward_concurrency,
            self.max_retries,
            workers,
            sandbox,
            self.code_test_timeout,
            self.code_partial_credit,
            self.judge_settings(),
            parse_components(list(self.reward_component or [])),
        )
