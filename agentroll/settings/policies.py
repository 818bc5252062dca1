"""`generate --policy NAME=URL[,URL...][,KEY=VALUE...]`: several models answer the same prompts in one run.

A policy is a model on its own servers, named by the user: every problem's group then holds K executions per
policy (`--samples-per-prompt` K), each record naming its policy (`policy`), so that the policies are compared
on the same prompts, problem by problem (`agentroll.record.headtohead`), and paired across (`convert --to dpo
--across-policies`). A policy's own settings are its served `model`, its `tokenizer` and its sampling
(`max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`); everything else (the system, the reward, the stage
templates, the run's other sampling) is the run's, the same for every policy, so that what differs between two
policies' records is the model and what the user set apart.

This module only reads and checks the flag's values (a small frozen value object per policy); the Generator sets
each policy up like the run's one server (`handshake.reach`, `choose_rendering`, `settle`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentroll.errors import UsageError
from agentroll.settings.sampling import DEFAULT as DEFAULT_SAMPLING
from agentroll.settings.sampling import KEYS as SAMPLING_KEYS

KEYS = ("model", "tokenizer", *SAMPLING_KEYS)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TYPES = {"max_tokens": int, "top_k": int, "temperature": float, "top_p": float, "min_p": float}


@dataclass(frozen=True, slots=True)
class Policy:
    """One `--policy`: its name, its servers, and what it sets apart from the run (`sampling`: overrides of the
    run's sampling, as (key, value) pairs in the order given)."""

    name: str
    urls: tuple[str, ...]
    model: str | None = None
    tokenizer: str | None = None
    sampling: tuple[tuple[str, Any], ...] = ()

    def overrides(self) -> dict[str, Any]:
        return dict(self.sampling)

    def spec(self, urls: list[str] | None = None, tokenizer: str | None = None) -> str:
        """The flag's value that gives this policy back, with other `urls` or `tokenizer` if given (a `--ray`
        partition runs elsewhere, on its share of the endpoints, with paths made absolute)."""
        own = [*(urls if urls is not None else self.urls)]
        tokenizer = tokenizer or self.tokenizer
        keys = [f"model={self.model}"] if self.model else []
        keys += [f"tokenizer={tokenizer}"] if tokenizer else []
        keys += [f"{k}={v}" for k, v in self.sampling]
        return f"{self.name}={','.join([*own, *keys])}"


def _url(item: str) -> bool:
    head = item.partition("=")[0]
    return "=" not in item or "://" in head or "/" in head


def parse_policy(item: str) -> Policy:
    """A `--policy` value as a `Policy`; a one-line `UsageError` naming the flag's value otherwise."""
    name, eq, rest = item.partition("=")
    name = name.strip()
    if not eq or not NAME.fullmatch(name):
        raise UsageError(
            f"--policy {item!r}: expected NAME=URL[,URL...][,KEY=VALUE...], NAME of letters, digits, '_', '.' "
            "or '-' (starting with a letter or digit)"
        )
    urls: list[str] = []
    found: dict[str, Any] = {}
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        if _url(part):
            urls.append(part)
            continue
        key, _, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if key not in KEYS:
            raise UsageError(
                f"--policy {item!r}: {key!r} is not a policy's own setting ({', '.join(KEYS)}); the system, the "
                "reward and the rest are the run's, the same for every policy"
            )
        if key in found:
            raise UsageError(f"--policy {item!r}: {key} is given twice")
        if not raw:
            raise UsageError(f"--policy {item!r}: {key} is empty")
        found[key] = raw if key in ("model", "tokenizer") else _sampling(item, key, raw)
    if not urls:
        raise UsageError(f"--policy {item!r}: no server URL (NAME=URL[,URL...][,KEY=VALUE...])")
    sampling = tuple((k, v) for k, v in found.items() if k in SAMPLING_KEYS)
    return Policy(name, tuple(urls), found.get("model"), found.get("tokenizer"), sampling)


def _sampling(item: str, key: str, raw: str) -> Any:
    try:
        value = TYPES[key](raw)
    except ValueError:
        kind = "a whole number" if TYPES[key] is int else "a number"
        raise UsageError(f"--policy {item!r}: {key} must be {kind}") from None
    return getattr(DEFAULT_SAMPLING.with_({key: value}, f"--policy {item!r}"), key)


def parse_policies(items: list[str]) -> tuple[Policy, ...]:
    """Every `--policy`, checked as a whole: none, or two or more with distinct names."""
    policies = tuple(parse_policy(item) for item in items)
    if len(policies) == 1:
        raise UsageError(
            f"--policy {items[0]!r}: a head-to-head run compares two or more policies (give --policy again); one "
            "model alone is --base-url"
        )
    seen: set[str] = set()
    for policy in policies:
        if policy.name in seen:
            raise UsageError(f"--policy: the name {policy.name!r} is given twice (each policy needs its own)")
        seen.add(policy.name)
    return policies
