"""`agentroll doctor`: check a server before a long job, one verdict per check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentroll.client import CallFailed, CompletionClient, detect_api
from agentroll.client.probes import PROBE_TOP_K
from agentroll.client.wire import WireError, parse_completions
from agentroll.context.provenance import logprobs_mode, mode_warning, truncates
from agentroll.context.turns import SAMPLE_TURNS, prefix_break
from agentroll.engine.options import GenerateOptions
from agentroll.engine.parity import check_parity, probe_messages
from agentroll.errors import AgentrollError
from agentroll.render.chat import ChatEncoder, load_first, tokenizer_candidates
from agentroll.render.templates import Templates

# a few short calls that should fail fast: the run's settings otherwise
PROBE: dict[str, Any] = {"concurrency": 4, "request_timeout": 120.0, "max_retries": 1}


@dataclass(slots=True)
class Check:
    name: str
    verdict: str  # "ok", "warn" or "fail"
    detail: str


def doctor_options(**given: Any) -> GenerateOptions:
    """What doctor checks for, as `generate` would take it (its flags checked by the same value objects, so a
    setting generate refuses is refused here too), with the calls of `PROBE`."""
    return GenerateOptions(**given, **PROBE)


async def diagnose(options: GenerateOptions) -> list[Check]:
    """One verdict per check, against the first server of `options` (see `doctor_options`)."""
    client = CompletionClient(options.base_url[:1], options.client_settings())
    model, tokenizer = options.model, options.tokenizer
    prompts = Path(options.prompts) if options.prompts else None
    checks: list[Check] = []
    try:
        try:
            listing = await client.get_json("/v1/models")
            names = [m.get("id") for m in listing.get("data", [])]
            name = model or (names[0] if len(names) == 1 else None)
            entry = next((m for m in listing.get("data", []) if m.get("id") == name), None)
            if entry is None and model is not None:
                raise AgentrollError(f"model {model!r} is not served (available: {', '.join(map(str, names))})")
            if entry is None:
                raise AgentrollError(f"serves {', '.join(map(str, names))}; pass --model to pick one")
        except AgentrollError as exc:
            return [Check("server", "fail", str(exc))]
        try:
            version = (await client.get_json("/version")).get("version", "?")
        except AgentrollError:
            version = "unknown"
        checks.append(Check("server", "ok", f"{client.endpoints[0].url} serves {name!r} (vLLM {version})"))
        limit = entry.get("max_model_len")
        checks.append(
            Check(
                "max_model_len",
                "ok" if limit else "warn",
                f"{limit} tokens of prompt + response" if limit else "not reported by /v1/models",
            )
        )
        try:
            _, loaded = load_first(tokenizer_candidates(tokenizer, str(name), entry.get("root")), hint=not tokenizer)
            encoder = ChatEncoder(loaded)
        except AgentrollError as exc:
            checks.append(Check("tokenizer", "fail", str(exc)))
            return checks
        checks.append(_prefix_property(encoder))
        checks.append(await _token_ids(client, encoder, str(name)))
        checks.extend(await _apis_and_logprobs(client, encoder, str(name), options.sampling().params()))
        checks.append(await _sampling_mask(client, encoder, str(name), options.sampling().params()))
        try:
            parity = await check_parity(client, encoder, str(name), probe_messages(Templates(prompts)))
        except AgentrollError as exc:
            checks.append(Check("chat template", "fail", str(exc)))
            return checks
        if not parity.supported:
            checks.append(Check("chat template", "warn", "the server has no /tokenize for messages: not checked"))
        elif parity.mismatch:
            checks.append(
                Check(
                    "chat template",
                    "fail",
                    f"{parity.mismatch}; generate would render prompts on the "
                    "server (--chat-render auto) or use yours (local)",
                )
            )
        else:
            checks.append(
                Check(
                    "chat template",
                    "ok",
                    f"{parity.checked} stage prompts render to the same ids as the server's /tokenize",
                )
            )
    finally:
        await client.aclose()
    return checks


def _prefix_property(encoder: ChatEncoder) -> Check:
    """Does rendering a longer conversation keep the earlier turns' text? Where it does not, only a continuation
    by token ids (what agentroll does) keeps multi-turn data exact."""
    try:
        try:
            broken = prefix_break(encoder.tokenizer, encoder.kwargs)
        except Exception:  # a template that takes no system message (Gemma): the turns without it
            broken = prefix_break(encoder.tokenizer, encoder.kwargs, SAMPLE_TURNS[1:])
    except Exception as exc:  # a template that refuses the turns whatever they are
        return Check(
            "multi-turn",
            "warn",
            f"could not render a sample conversation to check the prefix property: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}",
        )
    if broken is None:
        return Check(
            "multi-turn",
            "ok",
            "the template's prefix property holds: rendering turns[:k] is a prefix of rendering turns[:k+1]",
        )
    return Check(
        "multi-turn",
        "warn",
        f"the template breaks the prefix property: {broken}. agentroll continues "
        "conversations by token ids (prompt + response + the template's separator), "
        "so its records hold what the model saw; re-rendering a conversation would not",
    )


async def _token_ids(client: CompletionClient, encoder: ChatEncoder, model: str) -> Check:
    """One short seeded completion: does the server return token ids, and do both ways of reading them agree?
    (Sampled with top_k: a server returning sampling masks refuses a greedy call.)"""
    _, ids = encoder.encode([{"role": "user", "content": "Say hello."}])
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 8,
        "temperature": 1.0,
        "top_k": PROBE_TOP_K,
        "seed": 0,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    status, payload = await client.post_json("/v1/completions", body)
    if status != 200 or not isinstance(payload, dict):
        return Check("return_token_ids", "fail", f"completion answered HTTP {status}: {payload}")
    choice = payload["choices"][0]
    try:
        from_strings = parse_completions({"choices": [{**choice, "token_ids": None}]}, ids).token_ids
    except WireError as exc:
        return Check("return_token_ids", "fail", f"logprobs unreadable: {exc}")
    if choice.get("token_ids") is None:
        return Check(
            "return_token_ids",
            "warn",
            "not supported (vLLM < 0.10?): ids are read from 'token_id:N' logprob tokens instead",
        )
    if choice["token_ids"] != from_strings:
        return Check("return_token_ids", "fail", "token_ids and the 'token_id:N' strings disagree")
    return Check("return_token_ids", "ok", f"supported; {len(from_strings)} ids agree with the logprob tokens")


async def _apis_and_logprobs(
    client: CompletionClient, encoder: ChatEncoder, model: str, sampling: dict[str, Any]
) -> list[Check]:
    """Which token API the server offers, and what its logprobs are (found by experiment: see provenance)."""
    _, ids = encoder.encode([{"role": "user", "content": "Say hello."}])
    try:
        client.api = await detect_api(client, model, ids)
        mode, _ = await logprobs_mode(client, model, ids)
    except AgentrollError as exc:
        return [Check("logprobs mode", "fail", str(exc))]
    api = Check(
        "token API",
        "ok",
        "/inference/v1/generate (native: ids, ranks, weight versions) and /v1/completions"
        if client.api == "generate"
        else "/v1/completions (start vLLM with --enable-scale-out for the native /inference/v1/generate)",
    )
    if mode == "unknown":
        return [api, Check("logprobs mode", "warn", "could not be determined (no answer, or top tokens disagree)")]
    warning = mode_warning(mode, sampling)
    if warning:
        return [api, Check("logprobs mode", "warn", warning)]
    meaning = (
        "the sampling distribution's (after temperature, top-p, top-k)"
        if mode.startswith("processed")
        else "the model's own distribution, before temperature, top-p and top-k"
    )
    return [api, Check("logprobs mode", "ok", f"{mode}: logprobs are {meaning}")]


async def _sampling_mask(client: CompletionClient, encoder: ChatEncoder, model: str, sampling: dict[str, Any]) -> Check:
    """Does the server return vLLM's sampling mask (`--return-sampling-mask`), and if not, why not? Missing is a
    warning only when this sampling truncates (top-p < 1, top-k > 0): then the records need it."""
    needed = any(t.startswith(("top_p", "top_k")) for t in truncates(sampling))
    missing = "warn" if needed else "ok"
    if client.api != "generate":
        return Check(
            "sampling mask",
            missing,
            "not available: vLLM sends it on /inference/v1/generate only (vllm serve --enable-scale-out "
            "--return-sampling-mask)",
        )
    _, ids = encoder.encode([{"role": "user", "content": "Say hello."}])
    replay = {"max_tokens": 2, "temperature": 1.0, "top_k": PROBE_TOP_K, "seed": 0}
    try:
        done = await client.complete(ids, replay, model, 0)
    except (AgentrollError, CallFailed) as exc:
        return Check("sampling mask", "fail", f"a /generate call with top_k {PROBE_TOP_K} failed: {exc}")
    if done.sampling_mask is None:
        return Check(
            "sampling mask",
            missing,
            "not returned: start vLLM with --return-sampling-mask, which needs Model Runner V2 "
            "(VLLM_USE_V2_MODEL_RUNNER=1, a GPU build: the CPU build refuses it)"
            + ("; this sampling truncates, so without it the logprobs are not the sampling policy's" if needed else ""),
        )
    status, _ = await client.post_json(
        "/inference/v1/generate", {"model": model, "token_ids": ids, "sampling_params": {"max_tokens": 1}}
    )
    sizes = [len(step) for step in done.sampling_mask]
    refuses = " (it refuses calls without top_k > 0 and temperature > 0, as vLLM does)" if status == 400 else ""
    return Check(
        "sampling mask", "ok", f"returned: {', '.join(map(str, sizes))} ids kept at top_k {PROBE_TOP_K}{refuses}"
    )
