"""What the recorded numbers mean: the server's logprobs mode, found by experiment, and fingerprints of the
tokenizer and chat template that made the prompt ids.

vLLM returns `raw_logprobs` by default: the model's distribution before temperature, top-p and top-k. With any
of those set, the recorded logprobs are not those of the distribution the tokens were sampled from, which is
what an importance-sampling correction assumes. `--logprobs-mode processed_logprobs` makes them so. The server
does not say which mode it runs, so we ask the same question at two temperatures: raw values do not move.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from typing import Any

import orjson

from agentroll.client import CallFailed, CompletionClient
from agentroll.client.probes import PROBE_TOP_K
from agentroll.client.wire import Completion
from agentroll.errors import ServerError

log = logging.getLogger("agentroll")

RAW, PROCESSED = "raw_logprobs", "processed_logprobs"
PROBE_ALTERNATIVES = 2  # the two most likely tokens are all the test needs (and any max_logprobs allows)
PROBE_SEED = 1234
TOLERANCE = 1e-3  # raw values at two temperatures agree to float noise; processed ones move by far more


async def probe_call(
    client: CompletionClient, model: str, prompt_ids: list[int], params: dict[str, Any], alternatives: int
) -> Completion | None:
    """One one-token call. A refusal (a 4xx: parameters this server does not take) ends the run at once, with
    the server's message; a server failing for a while (5xx, timeouts) gives None: the run's own calls decide."""
    try:
        return await client.complete(prompt_ids, {**params, "max_tokens": 1}, model, alternatives)
    except CallFailed as exc:
        if exc.retryable:
            log.warning("a one-token probe call failed (%s); going on", exc)
            return None
        raise ServerError(
            f"the server refuses a {client.api} call with this run's parameters: {exc}", exc.status
        ) from exc


async def logprobs_mode(
    client: CompletionClient, model: str, prompt_ids: list[int], alternatives: int = 0
) -> tuple[str, bool | None]:
    """`raw_logprobs`, `processed_logprobs`, `raw_logits`, `processed_logits`, or `unknown`, from the two most
    likely next tokens at temperature 1 and at 0.5 (same seed, top-k of 20 or more: a renormalisation keeps a
    gap). Their gap is a difference of logits: raw values keep it, processed ones double it at 0.5 (this holds for
    a nearly certain next token too, where the values themselves barely move). Logits, unlike logprobs, need not
    be negative or sum to 1 or less.

    Also returns whether the server sent routed experts (None when a probe got no answer). The probes ask for
    `alternatives` when more than their own 2, so a server that cannot give this run's top-k says so now."""
    values = []
    routes: bool | None = None
    top_k = max(PROBE_TOP_K, alternatives + 1)
    # both at once: start-up waits for one round trip, not two
    answers = await asyncio.gather(
        *(
            probe_call(
                client,
                model,
                prompt_ids,
                # top_k bounds nothing the test reads, and a server returning sampling masks needs one
                {"temperature": t, "top_p": 1.0, "top_k": top_k, "min_p": 0.0, "seed": PROBE_SEED},
                max(PROBE_ALTERNATIVES, alternatives),
            )
            for t in (1.0, 0.5)
        ),
        return_exceptions=True,
    )
    for done in answers:
        if isinstance(done, BaseException):
            raise done
        if done is None or not done.top_token_ids or not done.top_token_ids[0] or done.top_logprobs is None:
            return "unknown", routes
        routes = done.routed_experts is not None
        values.append((done.top_token_ids[0][0], done.top_logprobs[0]))
    (first_id, at_1), (second_id, at_half) = values
    if first_id != second_id:
        return "unknown", routes
    logits = max(at_1) > 1e-6 or sum(math.exp(v) for v in at_1) > 1 + 1e-4  # logprobs are <= 0, sum <= 1
    kind = "logits" if logits else "logprobs"
    gap_1, gap_half = (at_1[0] - at_1[1], at_half[0] - at_half[1]) if len(at_1) > 1 and len(at_half) > 1 else (0, 0)
    if math.isfinite(gap_1) and math.isfinite(gap_half) and gap_1 > 1e-4:
        processed = gap_half / gap_1 > 1.5
    else:  # a tie at the top: the value itself
        processed = abs(at_1[0] - at_half[0]) >= TOLERANCE
    return f"processed_{kind}" if processed else f"raw_{kind}", routes


async def check_masks(client: CompletionClient, model: str, prompt_ids: list[int], sampling: dict[str, Any]) -> None:
    """--return-sampling-mask: the run's API must be /generate (the only one vLLM sends masks on) and a call
    with the run's sampling must come back with one; a `ServerError` saying what to start vLLM with otherwise."""
    if client.api != "generate":
        raise ServerError(
            "--return-sampling-mask needs vLLM's /inference/v1/generate (vllm serve --enable-scale-out): "
            "/v1/completions sends no sampling mask"
        )
    done = await probe_call(client, model, prompt_ids, {**sampling, "seed": PROBE_SEED}, 0)
    if done is not None and done.sampling_mask is None:
        raise ServerError(
            "the server sends no sampling_mask: start vLLM with --return-sampling-mask (it needs Model Runner "
            "V2: VLLM_USE_V2_MODEL_RUNNER=1), or drop --return-sampling-mask"
        )


def truncates(sampling: dict[str, Any]) -> list[str]:
    """The parameters that make the sampled distribution differ from the model's raw one."""
    out = []
    if sampling.get("temperature", 1.0) != 1.0:
        out.append(f"temperature {sampling['temperature']:g}")
    if sampling.get("top_p", 1.0) < 1.0:
        out.append(f"top_p {sampling['top_p']:g}")
    if sampling.get("top_k", -1) > 0:
        out.append(f"top_k {sampling['top_k']}")
    if sampling.get("min_p", 0.0) > 0.0:
        out.append(f"min_p {sampling['min_p']:g}")
    return out


def mode_warning(mode: str, sampling: dict[str, Any]) -> str | None:
    """A warning when the recorded logprobs are not those of the distribution sampled from."""
    shaped = truncates(sampling)
    if not mode.startswith("raw") or not shaped:
        return None
    return (
        f"the server returns {mode} (values before {', '.join(shaped)}): the recorded logprobs are not those "
        "of the distribution the tokens were sampled from; start vLLM with --logprobs-mode processed_logprobs "
        "if your trainer uses them for importance sampling"
    )


def mask_warning(sampling: dict[str, Any], masks: bool) -> str | None:
    """A warning when top-p or top-k cut the distribution and the kept sets are not recorded: the sampling
    policy is the model's distribution renormalised over them, which a trainer cannot rebuild without them."""
    cut = [t for t in truncates(sampling) if t.startswith(("top_p", "top_k"))]
    if masks or not cut:
        return None
    return (
        f"{' and '.join(cut)} without --return-sampling-mask: the tokens were sampled from the distribution "
        "renormalised over the tokens top-p / top-k kept, which the records do not hold, so logprobs a trainer "
        "recomputes over the whole vocabulary are not the sampling policy's; pass --return-sampling-mask "
        "(vllm serve --return-sampling-mask) to keep each step's kept set"
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_sha256(tokenizer: Any) -> str:
    """The tokenizer's whole definition (a fast tokenizer's JSON; else its vocabulary and special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _sha256(backend.to_str().encode())
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return _sha256(orjson.dumps([vocab, sorted(map(str, getattr(tokenizer, "all_special_tokens", [])))]))


def chat_template_sha256(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return _sha256(orjson.dumps(template, option=orjson.OPT_SORT_KEYS))


def rendered_sha256(prompts: list[list[int]]) -> str:
    """The stage prompts as the run renders them (template, kwargs and tokenizer together), as ids."""
    return _sha256(orjson.dumps(prompts))


def revision(root: str | None) -> str | None:
    """A hub snapshot's commit, when the server's model root is a path into the hub cache."""
    found = re.search(r"/snapshots/([0-9a-f]{40})(?:/|$)", root or "")
    return found.group(1) if found else None
