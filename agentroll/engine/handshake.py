"""What a run learns from its servers before the first real call: the served model and its context length, where
prompts are rendered, the token API, the request priority and what the logprobs mean; and each stage's own
server, model and tokenizer (`stage_setups`).

Each step asks the server once and fails the run here, with one line, rather than on every call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from agentroll.client import CompletionClient, detect_api, detect_priority, follow_metrics
from agentroll.context import Stage, provenance
from agentroll.engine.options import GenerateOptions
from agentroll.engine.parity import PROBE_PROBLEM, check_parity, local_ids, probe_messages, server_renderer
from agentroll.engine.pipeline import SystemConfig
from agentroll.errors import AgentrollError, ServerError, UsageError
from agentroll.render.chat import ChatEncoder, load_first, load_tokenizer, tokenizer_candidates
from agentroll.render.templates import Templates
from agentroll.settings.policies import Policy

log = logging.getLogger("agentroll")

VLLM_MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


async def discover(
    client: CompletionClient, name: str | None = None, stage: str | None = None
) -> tuple[str, int | None, str | None]:
    """The served model `name` (the only one served when None), its context length and root. Fails fast on a
    dead server; every endpoint is asked, and one that does not answer starts out of rotation (and is probed),
    unless none answers."""
    answers = await asyncio.gather(
        *(client.get_json("/v1/models", e) for e in client.endpoints), return_exceptions=True
    )
    for answer in answers:
        if isinstance(answer, BaseException) and (not isinstance(answer, ServerError) or answer.status in (401, 403)):
            raise answer  # a wrong key is wrong everywhere: no point waiting for a probe
    listing: Any = next((a for a in answers if not isinstance(a, BaseException)), None)
    if listing is None:
        raise next(a for a in answers if isinstance(a, BaseException))
    for endpoint, answer in zip(client.endpoints, answers, strict=True):
        if isinstance(answer, ServerError):
            client.mark_down(endpoint, str(answer))
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
        raise ServerError(f"{client.endpoints[0].url}/v1/models did not answer a model list: {str(listing)[:200]}")
    names = [m.get("id") for m in models]
    if name is None:
        if len(names) != 1:
            flag = f"--stage {stage}.model" if stage else "--model"
            raise UsageError(
                f"{client.endpoints[0].url} lists {len(names)} models ({', '.join(map(str, names))}): pass {flag}"
            )
        name = names[0]
    entry = next((m for m in models if m.get("id") == name), None)
    if entry is None:
        raise ServerError(f"model {name!r} is not served (available: {', '.join(map(str, names))})")
    length = entry.get("max_model_len")
    return str(name), length if isinstance(length, int) and length > 1 else None, entry.get("root")


async def renders_otherwise(
    client: CompletionClient, encoder: ChatEncoder, model: str, templates: Templates, tokenizer_name: str
) -> bool:
    """Does our rendering of the stage prompts differ from the server's? (README: `agentroll doctor`) Before
    saying so, `AutoTokenizer`'s choice of class gets its turn (`check_parity`)."""
    fallbacks: list[Callable[[], Any]] = [partial(load_tokenizer, tokenizer_name)]
    full = getattr(encoder.tokenizer, "full", None)  # a LiteTokenizer: the class-loaded one's turn comes first
    if callable(full):
        fallbacks.insert(0, full)
    parity = await check_parity(client, encoder, model, probe_messages(templates), fallbacks)
    if not parity.supported:
        log.warning("the server has no /tokenize for chat messages: prompts are rendered locally, unchecked")
    elif parity.mismatch:
        log.warning(
            "the local chat template does not render prompts as the server does (%s): prompts are "
            "rendered by the server's /tokenize for this run; pass the server's tokenizer with "
            "--tokenizer to render locally",
            parity.mismatch,
        )
    return parity.mismatch is not None


async def settle_stage_api(
    client: CompletionClient, options: GenerateOptions, encoder: ChatEncoder, config: SystemConfig
) -> None:
    """A stage's own server speaks the run's token API (`--api`), or the one it is found to take."""
    if options.api != "auto":
        client.api = options.api
    elif config.alternatives < VLLM_MAX_LOGPROBS:
        probe = local_ids(encoder, [{"role": "user", "content": PROBE_PROBLEM}])
        client.api = await detect_api(client, config.model, probe)


async def server_facts(
    client: CompletionClient,
    options: GenerateOptions,
    model: str,
    encoder: ChatEncoder,
    templates: Templates,
    config: SystemConfig,
    root: str | None,
) -> dict[str, Any]:
    """Settle --api auto and --server-priority, and find what the server's logprobs mean, with two one-token
    calls that also ask for this run's top-k and routes: a server that refuses them ends the run here, not on
    every call. Returns where the numbers came from (the manifest's `servers` entry)."""
    prompts = [
        local_ids(encoder, m) for m in probe_messages(templates) or [[{"role": "user", "content": PROBE_PROBLEM}]]
    ]
    probe = prompts[0]
    if options.api == "auto" and config.alternatives >= VLLM_MAX_LOGPROBS:
        # /generate is asked for K + 1 alternatives (wire.py), beyond vLLM's default --max-logprobs
        log.info(
            "--logprobs %d: using /v1/completions, which gives that many within vLLM's default --max-logprobs of %d",
            config.alternatives,
            VLLM_MAX_LOGPROBS,
        )
        client.api = "completions"
    else:
        client.api = await detect_api(client, model, probe) if options.api == "auto" else options.api
    await settle_priority(client, options.server_priority, model, probe)
    mode, routes = await provenance.logprobs_mode(client, model, probe, config.alternatives)
    if config.routes and routes is False:
        raise ServerError(
            "the server sends no routed_experts: start vLLM with --enable-return-routed-experts "
            "(a MoE model), or drop --return-routed-experts"
        )
    if config.masks:
        await provenance.check_masks(client, model, probe, config.sampling.params())
    for warning in (
        provenance.mode_warning(mode, config.sampling.params()),
        provenance.mask_warning(config.sampling.params(), config.masks),
    ):
        if warning:  # which server: a head-to-head run's policies, or a stage's own, may be served otherwise
            log.warning("%s: %s", ", ".join(e.url for e in client.endpoints), warning)
    try:
        version = (await client.get_json("/version")).get("version")
    except (ServerError, AttributeError):
        version = None
    log.debug(
        "%s serves %s (root %s, vLLM %s): %s API, request priority %s, %s; prompts rendered %s by %s",
        ", ".join(e.url for e in client.endpoints),
        model,
        root,
        version,
        client.api,
        "sent" if client.send_priority else "not sent",
        mode,
        "by the server's /tokenize" if encoder.server_render else "locally",
        type(encoder.tokenizer).__name__,
    )
    return {
        "api": client.api,
        "priority": client.send_priority,
        "vllm_version": version,
        "root": root,
        "revision": provenance.revision(root),
        "logprobs_mode": mode,
        "tokenizer_sha256": provenance.tokenizer_sha256(encoder.tokenizer),
        "chat_template_sha256": provenance.chat_template_sha256(encoder.tokenizer),
        "rendered_prompts_sha256": provenance.rendered_sha256(prompts),
    }


async def settle_priority(client: CompletionClient, choice: str, model: str, probe: list[int]) -> None:
    """--server-priority: auto sends vLLM's request priority when the server takes it; on insists."""
    if choice == "off":
        return
    client.send_priority = await detect_priority(client, model, probe)
    if choice == "on" and not client.send_priority:
        raise ServerError(
            f"not every server ({', '.join(e.url for e in client.endpoints)}) takes a request priority: start "
            "vLLM with --scheduling-policy priority, or pass --server-priority auto"
        )


async def stage_setups(
    o: GenerateOptions, main: Stage, model: str, new_client: Callable[[str], Awaitable[CompletionClient]]
) -> tuple[dict[str, Stage], dict[str, dict[str, Any]]]:
    """Stages with settings of their own (--stage NAME.KEY=VALUE): another served model or server (`new_client`
    makes one), with its tokenizer and context length, or other sampling. A stage that runs another model than
    the run's `model` is frozen (trainable false) unless its settings say otherwise: its samples are kept, marked,
    for analysis. Also returns what the settings guard keeps of them: the settings less base_url (where a stage
    runs is not what it is, as with --base-url), plus the model each one resolved to."""
    out: dict[str, Stage] = {}
    guard: dict[str, dict[str, Any]] = {}
    clients: dict[str, CompletionClient] = {}
    for name, settings in o.stage_settings().items():
        client, encoder = main.client, main.encoder
        url, served_model, tokenizer_name = settings.get("base_url"), settings.get("model"), settings.get("tokenizer")
        length, root = main.config.max_context_len, None
        if url:
            client = clients.get(url) or await new_client(url)
            clients[url] = client
        if url or served_model:
            served_model, served, root = await discover(client, served_model or (None if url else model), name)
            length = o.max_context_len or served
        served_model = served_model or model
        if tokenizer_name or served_model != model:
            _, tokenizer = await asyncio.to_thread(
                load_first, tokenizer_candidates(tokenizer_name, served_model, root), False, not tokenizer_name
            )
            encoder = ChatEncoder(tokenizer, o.chat_template_kwargs)
        overrides = {k: v for k, v in settings.items() if k not in ("base_url", "tokenizer", "trainable")}
        config = main.config.with_overrides(
            {**overrides, "model": served_model, "max_context_len": length}, f"--stage {name}"
        )
        out[name] = Stage(name, client, encoder, config, settings.get("trainable", served_model == model))
        where = ("base_url", "teacher", "teacher_model")  # where it runs, and its teacher (settings.teacher)
        guard[name] = {**{k: v for k, v in settings.items() if k not in where}, "model": served_model}
    return out, guard


@dataclass(slots=True)
class Served:
    """One policy's model as the run reaches it (a run of one model: a policy without a name, on --base-url):
    its client, model, tokenizer and rendering (`reach`, `choose_rendering`), then its sampling, server facts and
    stages (`settle`)."""

    policy: Policy
    client: CompletionClient
    model: str = ""
    max_context_len: int | None = None
    root: str | None = None
    tokenizer_name: str = ""
    tokenizer: Any = None
    encoder: ChatEncoder | None = None
    main: Stage | None = None
    server: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, Stage] = field(default_factory=dict)
    stage_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.policy.name or None

    @property
    def settled(self) -> Stage:
        """Its stage of defaults, once `settle` has made it (client, encoder, sampling)."""
        if self.main is None:
            raise RuntimeError(f"policy {self.policy.name!r} is not settled")
        return self.main


async def reach(o: GenerateOptions, served: Served) -> None:
    """The policy's served model, its context length and its tokenizer (loaded by its class name under
    --chat-render auto: the parity check compares it)."""
    p = served.policy
    try:
        served.model, length, served.root = await discover(served.client, p.model)
    except AgentrollError as exc:  # in a head-to-head run, say whose server
        if served.name is not None:
            exc.args = (f"--policy {served.name}: {exc}", *exc.args[1:])
        raise
    served.max_context_len = o.max_context_len or length
    candidates = tokenizer_candidates(p.tokenizer, served.model, served.root)
    served.tokenizer_name, served.tokenizer = await asyncio.to_thread(
        load_first, candidates, o.chat_render == "auto", not p.tokenizer, o.chat_render == "auto"
    )


async def choose_rendering(o: GenerateOptions, served: Served, templates: Templates) -> None:
    """Where the policy's prompts become ids: locally, or by its server's /tokenize (--chat-render)."""
    encoder = served.encoder = ChatEncoder(served.tokenizer, o.chat_template_kwargs)
    client, model = served.client, served.model
    if o.chat_render == "server" or (
        o.chat_render == "auto" and await renders_otherwise(client, encoder, model, templates, served.tokenizer_name)
    ):
        encoder.server_render = server_renderer(client, model, o.chat_template_kwargs)


async def settle(
    o: GenerateOptions,
    served: Served,
    templates: Templates,
    new_client: Callable[..., Awaitable[CompletionClient]],
    group_size: int,
) -> None:
    """The policy's sampling (the run's, with its own settings), what its server's numbers mean, its adaptive
    cap, and its stages' own settings (--stage). `group_size`: the executions of a problem's group, over every
    policy."""
    assert served.encoder is not None
    config = o.system_config(served.model, served.max_context_len)
    if served.policy.sampling:
        config = config.with_overrides(served.policy.overrides(), f"--policy {served.policy.name}")
    config = replace(config, samples_per_prompt=group_size)
    client = served.client
    served.server = await server_facts(client, o, served.model, served.encoder, templates, config, served.root)
    if served.name is not None and served.encoder.server_render is not None:  # a policy's prompts as it sends them
        probes = probe_messages(templates) or [[{"role": "user", "content": PROBE_PROBLEM}]]
        rendered = [(await served.encoder.render(m))[1] for m in probes]
        served.server["rendered_prompts_sha256"] = provenance.rendered_sha256(rendered)
    if client.adaptive:
        await follow_metrics(client)
    served.main = main = Stage("", client, served.encoder, config)
    served.stages, served.stage_settings = await stage_setups(o, main, served.model, partial(new_client, main=main))


def policy_facts(runs: list[Served]) -> tuple[dict[str, Any], str | None]:
    """What a head-to-head run's manifest records of each policy (its model and its server's facts), whether
    the policies render the stage prompts alike, and a warning when they do not."""
    facts = {s.policy.name: {"model": s.model, **s.server} for s in runs}
    differ = len({f.get("rendered_prompts_sha256") for f in facts.values()}) > 1
    warning = (
        f"the policies {', '.join(facts)} do not render prompts alike (their tokenizers or chat templates differ): "
        "each policy's prompt ids are its own, recorded as sent; the figures compare the policies, but "
        "`convert --to dpo --across-policies` refuses to pair them"
        if differ
        else None
    )
    return {"policies": facts, "prompt_ids": "differ" if differ else "alike"}, warning


def rendering(run: Served) -> str:
    """Where the run's prompts actually became ids: --chat-render auto may switch to the server's /tokenize."""
    return "server" if run.encoder is not None and run.encoder.server_render else "local"


def policy_settings(run: Served) -> dict[str, Any]:
    """What a head-to-head run's settings keep of a policy: a rerun with other policies (another model, other
    sampling) is refused like any other changed setting; where it is served is not kept (as --base-url)."""
    config = run.settled.config
    return {
        "name": run.policy.name,
        "model": run.model,
        "tokenizer": run.tokenizer_name,
        "max_context_len": run.max_context_len,
        "max_tokens": config.sampling.max_tokens,
        "sampling": config.sampling.params(),
        "prompt_rendering": rendering(run),
        "stage_settings": run.stage_settings,
    }


JOURNALED_FACTS = ("api", "logprobs_mode", "tokenizer_sha256", "chat_template_sha256", "revision")


def journal_fingerprint(model: str, server: dict[str, Any], routes: bool, masks: bool = False) -> dict[str, Any]:
    """What a journaled call's answer depends on beyond what each entry's digest holds (its prompt ids, sampling,
    model and top-k): the token API (the response text is the server's, or decoded here), what the logprobs
    mean, the tokenizer and chat template that decode it, the weights' revision, whether routes and sampling
    masks are kept. Not the request priority, the model's root path or the vLLM version: a journal made with or
    without them is replayed (a changed one discards the journal whole). In a head-to-head run, each policy's too."""
    policies = server.get("policies")
    each = (
        {"policies": {name: journal_fingerprint(str(f.get("model")), f, routes, masks) for name, f in policies.items()}}
        if isinstance(policies, dict)
        else {}
    )
    kept = {"masks": True} if masks else {}  # named only when kept: a journal made before masks still matches
    return {"model": model, **{k: server.get(k) for k in JOURNALED_FACTS}, "routes": routes, **kept, **each}
