"""The run's side of an execution, built once by the Generator and shared by every `Context`: how each stage
samples and where its calls go (`SystemConfig`, `Stage`), and the run-wide state (`Engine`).

Apart from `context` because these are values and plumbing the run sets up, while `context` is the API a system
calls: a reader looking for what a system may do reads `context`, one looking for how a run is wired reads this.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentroll.client import CompletionClient
from agentroll.context.provenance import chat_template_sha256, tokenizer_sha256
from agentroll.record.stats import RunStats
from agentroll.render.chat import ChatEncoder
from agentroll.render.templates import Templates
from agentroll.rewards import RewardSet
from agentroll.settings.sampling import DEFAULT as DEFAULT_SAMPLING
from agentroll.settings.sampling import KEYS as SAMPLING_KEYS
from agentroll.settings.sampling import Sampling

if TYPE_CHECKING:
    from agentroll.folder.journal import Journal
    from agentroll.teacher.scorer import Teacher


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemConfig:
    """How a stage samples and how rewards are shaped, made once from the run's options
    (`GenerateOptions.system_config`). Per-stage settings (`--stage NAME.KEY=VALUE`) are this with some fields
    replaced (`with_overrides`)."""

    model: str
    sampling: Sampling = DEFAULT_SAMPLING
    num_parallel: int = 4
    samples_per_prompt: int = 1
    max_context_len: int | None = None
    seed: int | None = None
    alternatives: int = 0  # --logprobs K
    routes: bool = False  # --return-routed-experts
    masks: bool = False  # --return-sampling-mask
    correct_reward_weight: float = 1.0
    incorrect_reward_weight: float = 1.0
    think: bool = True

    def with_overrides(self, overrides: dict[str, Any], where: str = "") -> SystemConfig:
        """This config with `overrides`: sampling keys (checked by `Sampling`), `model`, `max_context_len`."""
        sampled = {k: v for k, v in overrides.items() if k in SAMPLING_KEYS}
        rest = {k: v for k, v in overrides.items() if k in ("model", "max_context_len")}
        return replace(self, sampling=self.sampling.with_(sampled, where) if sampled else self.sampling, **rest)


def same_tokens(a: ChatEncoder, b: ChatEncoder) -> bool:
    """A conversation only goes on under one tokenizer and chat template: the same encoder, or equal hashes
    (worked out only when a conversation crosses encoders)."""
    return a is b or (tokenizer_sha256(a.tokenizer), chat_template_sha256(a.tokenizer)) == (
        tokenizer_sha256(b.tokenizer),
        chat_template_sha256(b.tokenizer),
    )


@dataclass(slots=True)
class Stage:
    """Where and how one stage's calls go: its client, model, tokenizer and sampling, and whether it trains."""

    name: str
    client: CompletionClient
    encoder: ChatEncoder
    config: SystemConfig
    trainable: bool = True
    teacher: Teacher | None = None  # --teacher: scores each of this stage's samples (agentroll.teacher)


@dataclass(slots=True)
class Engine:
    """What every execution shares: stages, rewards, templates, counters (built once by the Generator)."""

    stages: dict[str, Stage]
    default: Stage  # a stage without settings of its own
    rewards: RewardSet
    templates: Templates
    stats: RunStats
    options: dict[str, Any] = field(default_factory=dict)  # the system's options
    prompt_key: str = "prompt"
    declared: tuple[str, ...] = ()  # the system's stages; none: any
    # first prompts, rendered once per problem and shared by its K executions (a future: they ask at once)
    prompts: OrderedDict[tuple[str, str, str, str], asyncio.Future[tuple[str, list[int]]]] = field(
        default_factory=OrderedDict
    )
    separators: OrderedDict[tuple[int, bytes, int | None], list[int]] = field(default_factory=OrderedDict)
    journal: Journal | None = None  # finished calls of earlier runs, replayed; this run's, kept
    policy: str | None = (
        None  # a head-to-head run's policy whose model these stages run (`agentroll.settings.policies`)
    )

    def stage(self, name: str) -> Stage:
        found = self.stages.get(name)
        if found is None:
            found = self.stages[name] = replace(self.default, name=name)
        return found
