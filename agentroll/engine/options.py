"""The generation options, declared once: `agentroll.Generator(**kwargs)` takes them and the CLI is built from them.

Each field is a CLI option of `agentroll generate` (`num_parallel` is `--num-parallel`) with the same default and
help text, so the API and the command cannot drift apart (tests/test_api.py checks it). `__post_init__` validates
every value and normalizes the shapes the CLI hands over (a JSON string, comma-separated URLs).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any

import orjson

from agentroll.client.settings import ClientSettings, Concurrency, Health, Retries, Timeouts, read_key
from agentroll.context.stages import SystemConfig
from agentroll.errors import UsageError
from agentroll.rewards.options import RewardOptions
from agentroll.settings.declare import KIND_NAMES, at_least, check_types, default_of, flag, option, positive
from agentroll.settings.policies import Policy, parse_policies
from agentroll.settings.sampling import DEFAULT as DEFAULT_SAMPLING
from agentroll.settings.sampling import KEYS as SAMPLING_KEYS
from agentroll.settings.sampling import Sampling
from agentroll.settings.shaping import LengthShaping
from agentroll.teacher.settings import TeacherOptions

CLIENT = ClientSettings()
TIMEOUTS, RETRIES, HEALTH, CONCURRENCY = CLIENT.timeouts, CLIENT.retries, CLIENT.health, CLIENT.concurrency
CHAT_RENDER = ("auto", "local", "server")
API = ("auto", "completions", "generate")


@dataclass(frozen=True, kw_only=True)
class GenerateOptions(RewardOptions, TeacherOptions):
    """Everything that decides how a group is generated (the reward options are `RewardOptions`', shared with
    `agentroll rescore`; the teacher's are `TeacherOptions`', shared with `agentroll distill`). Run-level options
    (input, output, shards, resume, limits) belong to the CLI's runner."""

    base_url: list[str] = option(
        [],
        "vLLM server (with or without /v1). Repeat or comma-separate for several.",
        envvar=["AGENTROLL_BASE_URL", "OPENAI_BASE_URL"],
    )
    policy: list[str] = option(
        [],
        "A policy of a head-to-head run: NAME=URL, then more URLs or KEY=VALUE (model, tokenizer, max_tokens, "
        "temperature, top_p, top_k, min_p), comma-separated; two or more, in place of --base-url. Each prompt's "
        "group holds K executions per policy (docs/head-to-head.md).",
    )
    api_key: str | None = option(
        None,
        "Sent as a Bearer token (on a command line it is visible to every process: prefer the file).",
        envvar="OPENAI_API_KEY",
    )
    api_key_file: str | None = option(None, "A file holding the API key (its first line).")
    model: str | None = option(None, "Served model name (default: the only one listed).")
    tokenizer: str | None = option(
        None, "Tokenizer folder or hub id, loaded by the class it names (default: the server's model root)."
    )
    prompts: str | None = option(
        None,
        "Folder of stage templates (default: bundled; `code`: the bundled set that asks for a "
        "program, for --reward code).",
    )
    prompt_key: str = option("prompt", "Input field holding the problem or chat messages.")
    label_key: str = option("label", "Input field holding the reference answer.")
    id_key: str = option("id", "Input field holding the problem id [default id: a hash of prompt and label].")
    reward_key: str = option("reward", "Input field in which a row names its own reward.")
    system: str = option(
        "three-stage",
        "Agent system: three-stage | single | critique-revise | tool-use | agent (your agent program: "
        "docs/agents.md) | FILE.py:CLASS | MODULE:CLASS (docs/systems.md).",
    )
    system_option: list[str] = option(
        [],
        "KEY=VALUE for the system (repeatable; the value is JSON or a string). tool-use: tools, max_turns, "
        "tool_timeout, max_tool_output, parser, tool_threads (docs/tool-use.md); agent: command or agent, timeout, "
        "max_agents, parser, thinking, sampling, on_error (docs/agents.md); three-stage, single, critique-revise: "
        "none.",
    )
    stage: list[str] = option(
        [],
        "STAGE.KEY=VALUE per-stage setting (repeatable): model, base_url, tokenizer, "
        "max_tokens, temperature, top_p, top_k, min_p, trainable, teacher (a URL, or none), teacher_model.",
    )
    num_parallel: int = option(
        4, "Parallel calls per stage where the system has them (three-stage: solvers, and rewriters, per execution)."
    )
    samples_per_prompt: int = option(1, "Executions per prompt (one group).")
    concurrency: int | str = option(
        "auto" if CONCURRENCY.adaptive else CONCURRENCY.fixed,
        "Most completion requests in flight over the run; or auto: per endpoint, "
        "following its vLLM /metrics (queue, KV cache, preemptions).",
        cli_type=str,
    )
    max_concurrency: int = option(
        CONCURRENCY.per_endpoint, "With --concurrency auto: most requests in flight per endpoint."
    )
    max_tokens: int = option(DEFAULT_SAMPLING.max_tokens, "Most tokens per response (capped to the context left).")
    max_context_len: int | None = option(None, "Prompt + response budget (default: the server's max_model_len).")
    temperature: float = option(DEFAULT_SAMPLING.temperature, "Sampling temperature.")
    top_p: float = option(
        DEFAULT_SAMPLING.top_p,
        "Top-p (1: off). Every sampling parameter is sent, so the model's "
        "generation_config.json never changes one unseen.",
    )
    top_k: int = option(DEFAULT_SAMPLING.top_k, "Top-k (-1: off).")
    min_p: float = option(DEFAULT_SAMPLING.min_p, "Min-p (0: off).")
    seed: int | None = option(None, "Base seed; each call gets its own derived seed.")
    api: str = option(
        "auto",
        "auto | completions | generate: vLLM's /v1/completions, or its native "
        "/inference/v1/generate (vllm serve --enable-scale-out). auto prefers generate.",
    )
    server_priority: str = option(
        "auto",
        "auto | on | off: send each call's group number as vLLM's request "
        "priority (older groups first under vllm serve --scheduling-policy "
        "priority); auto sends it when the server takes it.",
    )
    logprobs: int = option(0, "Also store the K most likely tokens at each response position (ids, logprobs).")
    return_routed_experts: bool = option(
        False,
        "Store vLLM's MoE routing per token in a sidecar beside each shard "
        "(vllm serve --enable-return-routed-experts).",
    )
    return_sampling_mask: bool = option(
        False,
        "Store the ids vLLM kept at each response token under top-k/top-p in the sidecar "
        "(vllm serve --return-sampling-mask; needs --top-k > 0, --temperature > 0, /generate).",
    )
    correct_reward_weight: float = option(1.0, "Reward multiplier when the selector's pick is correct.")
    incorrect_reward_weight: float = option(1.0, "Reward multiplier otherwise.")
    no_think: bool = option(False, "The whole response is the answer (models that do not reason).")
    allow_reward: list[str] = option(
        [],
        "A reward a row's own reward field may name besides math and exact "
        "(repeatable). Rows cannot import code otherwise.",
    )
    overlong_buffer: int = option(
        0,
        "DAPO's soft overlong punishment: a response within this many tokens of its "
        "max_tokens loses up to --overlong-penalty, linearly (0: off).",
    )
    overlong_penalty: float = option(
        1.0, "What a response that uses its whole max_tokens loses, with --overlong-buffer."
    )
    overlong_filter: str = option(
        "none",
        "none | mask | drop: truncated samples get loss mask 0 (mask), and are "
        "also marked trainable false so converters leave them out (drop).",
    )
    filter_uniform_groups: bool = option(False, "Leave out groups whose outcomes are all alike.")
    resample_uniform: int = option(0, "Re-run a uniform group up to N more times.")
    chat_template_kwargs: dict[str, Any] = option(
        {}, 'JSON object for the chat template, e.g. {"enable_thinking": true}.', cli_type=str
    )
    chat_render: str = option("auto", "auto | local | server: where prompts become token ids.")
    request_timeout: float = option(TIMEOUTS.request_s, "Seconds per completion attempt, once connected.")
    down_timeout: float = option(HEALTH.down_timeout_s, "Seconds to wait when every endpoint is down.")
    probe_interval: float = option(HEALTH.probe_interval_s, "Seconds between /health probes of a down endpoint.")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.api_key_file is not None:  # read once: the options then carry the key (a Ray task's too)
            if self.api_key:
                raise UsageError("--api-key and --api-key-file both give the key: give one")
            set_(self, "api_key", read_key(str(self.api_key_file)))
            set_(self, "api_key_file", None)
        for name in ("base_url", "api_key"):  # as the CLI does: the environment fills what is not given
            if not getattr(self, name):
                envvar = GenerateOptions.__dataclass_fields__[name].metadata["envvar"]
                found = next(
                    (os.environ[v] for v in ([envvar] if isinstance(envvar, str) else envvar) if os.environ.get(v)),
                    None,
                )
                if found:
                    set_(self, name, found)
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url or [])
        set_(self, "base_url", [u for v in urls for u in str(v).replace(",", " ").split() if u])
        for name in ("allow_reward", "system_option", "stage", "policy"):
            value = getattr(self, name)
            set_(self, name, [value] if isinstance(value, str) else list(value or []))
        kwargs = self.chat_template_kwargs
        if isinstance(kwargs, str):
            try:
                kwargs = orjson.loads(kwargs) if kwargs.strip() else {}
            except orjson.JSONDecodeError as exc:
                raise UsageError(f"--chat-template-kwargs is not JSON ({exc})") from None
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise UsageError("--chat-template-kwargs must be a JSON object")
        set_(self, "chat_template_kwargs", kwargs)
        if self.prompts is not None:
            set_(self, "prompts", str(self.prompts))
        self._validate()

    def _validate(self) -> None:
        set_ = object.__setattr__
        check_types(self)
        if isinstance(self.concurrency, str) and self.concurrency.strip() != "auto":
            if not self.concurrency.strip().isdigit():
                raise UsageError(f"--concurrency must be a whole number or auto, got {self.concurrency!r}")
            set_(self, "concurrency", int(self.concurrency))
        if self.concurrency != "auto":
            at_least(self, 1, "concurrency")
        else:
            set_(self, "concurrency", "auto")
        at_least(self, 1, "num_parallel", "samples_per_prompt", "max_concurrency")
        at_least(self, 0, "resample_uniform")
        positive(self, "request_timeout", "probe_interval")
        self.check_rewards()
        self.check_teacher()
        if not (math.isfinite(self.down_timeout) and self.down_timeout >= 0):
            raise UsageError("--down-timeout must be a number of seconds, 0 or more")
        if self.max_context_len is not None and self.max_context_len < 2:
            raise UsageError("--max-context-len must be at least 2")
        set_(self, "top_k", self.sampling().top_k)  # checked, once, by the value object; 0 is -1 (off)
        self.length_shaping()
        if not 0 <= self.logprobs <= 100:
            raise UsageError("--logprobs must be a whole number from 0 to 100")
        if self.api not in API:
            raise UsageError("--api must be auto, completions or generate")
        if self.server_priority not in ("auto", "on", "off"):
            raise UsageError("--server-priority must be auto, on or off")
        if self.return_sampling_mask:
            self.check_sampling_mask()
        if self.seed is not None and self.seed < 0:
            raise UsageError("--seed must be 0 or more")
        for name in ("correct_reward_weight", "incorrect_reward_weight"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"--{flag(name)} must be a finite number")
        if self.filter_uniform_groups and self.samples_per_prompt * max(1, len(self.policy)) < 2:
            raise UsageError("--filter-uniform-groups needs --samples-per-prompt of at least 2 (or --policy)")
        if self.resample_uniform and not self.filter_uniform_groups:
            raise UsageError("--resample-uniform goes with --filter-uniform-groups")
        if self.chat_render not in CHAT_RENDER:
            raise UsageError("--chat-render must be auto, local or server")
        if self.policy:
            self._policy_alone()
        elif not self.base_url:
            raise UsageError("no server given: pass --base-url or set AGENTROLL_BASE_URL")
        self.check_stage_teachers(self.stage_settings())
        self.system_options()

    def policies(self) -> tuple[Policy, ...]:
        """--policy as `Policy` values, in the order given (none: a run of one model)."""
        return parse_policies(self.policy)

    def _policy_alone(self) -> None:
        """With --policy each policy names its own servers, model and tokenizer: the run's are refused (a
        --base-url that only the environment set is let go)."""
        self.policies()
        given = [n for n in ("model", "tokenizer") if getattr(self, n)]
        env = " ".join(os.environ.get(v, "") for v in ("AGENTROLL_BASE_URL", "OPENAI_BASE_URL")).replace(",", " ")
        if self.base_url and not set(self.base_url) <= set(env.split()):
            given.insert(0, "base_url")
        if given:
            raise UsageError(
                f"--{flag(given[0])} does not go with --policy: each policy names its own "
                "(--policy NAME=URL,model=...,tokenizer=...)"
            )
        object.__setattr__(self, "base_url", [])

    def stage_settings(self) -> dict[str, dict[str, Any]]:
        """--stage NAME.KEY=VALUE as {stage: {key: value}}, each value of its key's type and range."""
        out: dict[str, dict[str, Any]] = {}
        for item in self.stage:
            head, eq, raw = item.partition("=")
            stage, dot, key = head.strip().rpartition(".")
            if not eq or not dot or not stage or key not in STAGE_KEYS:
                raise UsageError(f"--stage {item!r}: expected STAGE.KEY=VALUE with KEY one of {', '.join(STAGE_KEYS)}")
            out.setdefault(stage, {})[key] = _stage_value(item, key, raw.strip())
        return out

    def system_options(self) -> dict[str, Any]:
        """--system-option KEY=VALUE as a dict; a value that parses as JSON is taken as JSON, else as a string."""
        out: dict[str, Any] = {}
        for item in self.system_option:
            key, eq, raw = item.partition("=")
            if not eq or not key.strip().isidentifier():
                raise UsageError(f"--system-option {item!r}: expected KEY=VALUE")
            try:
                out[key.strip()] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                out[key.strip()] = raw
        return out

    def sampling(self) -> Sampling:
        return Sampling(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
        )

    def check_sampling_mask(self) -> None:
        """vLLM refuses a call it cannot bound the mask of, and sends the mask on /generate only."""
        if self.top_k <= 0 or self.temperature <= 0:
            raise UsageError(
                "--return-sampling-mask needs --top-k > 0 and --temperature > 0 (vLLM refuses other calls "
                "once it returns masks)"
            )
        if self.api == "completions":
            raise UsageError("--return-sampling-mask needs --api generate or auto: /v1/completions sends no mask")

    def system_config(self, model: str, max_context_len: int | None) -> SystemConfig:
        """How the run's stages sample and shape rewards, as the context's value object."""
        return SystemConfig(
            model=model,
            sampling=self.sampling(),
            num_parallel=self.num_parallel,
            samples_per_prompt=self.samples_per_prompt,
            max_context_len=max_context_len,
            seed=self.seed,
            alternatives=self.logprobs,
            routes=self.return_routed_experts,
            masks=self.return_sampling_mask,
            correct_reward_weight=self.correct_reward_weight,
            incorrect_reward_weight=self.incorrect_reward_weight,
            think=not self.no_think,
        )

    def length_shaping(self) -> LengthShaping:
        return LengthShaping(buffer=self.overlong_buffer, penalty=self.overlong_penalty, filter=self.overlong_filter)

    def client_settings(self) -> ClientSettings:
        """How the run's clients talk to servers, as the client's value objects."""
        fixed = self.concurrency if isinstance(self.concurrency, int) else None
        return ClientSettings(
            timeouts=Timeouts(request_s=self.request_timeout, connect_s=self.connect_timeout),
            retries=Retries(max_retries=self.max_retries),
            health=Health(probe_interval_s=self.probe_interval, down_timeout_s=self.down_timeout),
            concurrency=Concurrency(fixed=fixed, per_endpoint=self.max_concurrency),
            api_key=self.api_key,
            affinity_slack=self.num_parallel * self.samples_per_prompt,
        )

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


STAGE_KEYS = {
    "model": str,
    "base_url": str,
    "tokenizer": str,
    "max_tokens": int,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "trainable": bool,
    "teacher": str,  # a URL, or none (agentroll.teacher.settings)
    "teacher_model": str,
}


def _stage_value(item: str, key: str, raw: str) -> Any:
    kind = STAGE_KEYS[key]
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            value: Any = raw.lower() in ("true", "1", "yes")
        else:
            value = kind(raw)
    except ValueError:
        raise UsageError(f"--stage {item!r}: {key} must be {KIND_NAMES[kind.__name__]}") from None
    if key in SAMPLING_KEYS:
        return getattr(DEFAULT_SAMPLING.with_({key: value}, f"--stage {item!r}"), key)
    if value == "":
        raise UsageError(f"--stage {item!r}: {key} is empty")
    return value


__all__ = ["GenerateOptions", "RewardOptions", "at_least", "check_types", "default_of", "flag", "option", "positive"]
