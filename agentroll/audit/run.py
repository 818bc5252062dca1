"""`audit(folder, options)`: the whole audit, from a folder to its report (a dict; `ok` says the verdict)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import UsageError
from ..folder import Manifest, load_manifest
from ..tools.system import system_of
from . import forward, gates
from .logprobs import MASKED, PENALTIES
from .options import PROCESSED, RAW, AuditOptions
from .report import KL_ESTIMATOR, Collector
from .template import TemplateCheck
from .units import Selection, Unit, build, index, record_faults, stratified

NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class Progress(Protocol):
    def start(self, total: int) -> None: ...
    def advance(self, units: int) -> None: ...
    def stop(self) -> None: ...


def logprobs_mode(manifest: Manifest, asked: str) -> tuple[str, str, list[str]]:
    """(mode, where it comes from, warnings): `--logprobs-mode`, else the manifest's last server's."""
    servers = manifest.servers
    modes = list(dict.fromkeys(str(s.get("logprobs_mode")) for s in servers))
    warnings = []
    if len(modes) > 1:
        warnings.append(
            f"the folder's runs met servers with logprobs modes {', '.join(modes)}: records of earlier "
            "runs may mean another mode than the last one's (pass --logprobs-mode to choose)"
        )
    if asked != "auto":
        return asked, "--logprobs-mode", warnings
    last = servers[-1].get("logprobs_mode") if servers else None
    if last not in (RAW, PROCESSED):
        raise UsageError(
            f"the manifest's servers[-1].logprobs_mode is {last!r}, not raw_logprobs or "
            "processed_logprobs: pass --logprobs-mode with what the server ran"
        )
    return str(last), "manifest servers[-1]", warnings


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids vLLM stops on without a stop_reason: the tokenizer's EOS and the generation config's."""
    found: set[int] = set()
    for value in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
    ):
        for x in value if isinstance(value, list | tuple) else [value]:
            if isinstance(x, int):
                found.add(x)
    return frozenset(found)


def audit(folder: str | os.PathLike[str], options: AuditOptions, progress: Progress | None = None) -> dict[str, Any]:
    path = Path(folder)
    manifest = policy_view(load_manifest(path), options.policy)
    settings = manifest.settings
    teacher = options.against == "teacher"  # the records' teacher scores, the model being that teacher
    if teacher:  # vLLM computes prompt_logprobs from the raw logits, whatever it samples with
        mode, source = RAW, "a teacher's scores (prompt_logprobs)"
        warnings: list[str] = []
        if not settings.get("teacher"):
            raise UsageError(f"{path}: no teacher scored this folder (settings.teacher): nothing to compare")
    else:
        mode, source, warnings = logprobs_mode(manifest, options.logprobs_mode)
    system = system_of(manifest)
    known = system.stages
    if options.stages is not None and known is not None and not options.stages <= set(known):
        raise UsageError(
            f"--stages {','.join(sorted(options.stages - set(known)))}: the {system.name} system's "
            f"stages are {', '.join(known)}"
        )
    policy = options.policy if options.policy is not None else first_policy(settings)
    selection = Selection(options.stages, options.include_frozen, settings.get("model"), policy=policy, teacher=teacher)
    listed = index(path, selection)
    if not listed:  # passing an audit of nothing would say the folder is fine
        why = "; ".join(
            f"{stage}: " + ", ".join(f"{n} {reason}" for reason, n in reasons.items())
            for stage, reasons in selection.skipped.items()
        )
        raise UsageError(f"{path}: no record to audit" + (f" ({why})" if why else " (the folder holds none)"))
    chosen = stratified(listed, options.sample, options.seed)

    device = forward.pick_device(options.device)
    model = forward.load_model(options.model, options.dtype, device)
    tokenizer = forward.load_tokenizer(options.tokenizer or options.model)
    dtype = str(model.dtype).removeprefix("torch.")
    tolerance = options.tolerance(dtype)
    # a teacher shares the run's vocabulary, not its chat template: the student's prompts are what it scored
    found, folder_faults = gates.run_provenance(manifest, tokenizer, options.accept_chat_template or teacher)
    warnings += found + gates.edited_shards(path, manifest)
    penalties = {k: v for k, v in (settings.get("sampling") or {}).items() if k in NEUTRAL and v != NEUTRAL[k]}
    if penalties and mode == PROCESSED:
        warnings.append(f"penalties {penalties}: processed logprobs are not compared")
    check = (
        TemplateCheck(tokenizer, settings.get("chat_template_kwargs")) if options.templates and not teacher else None
    )
    # how a record ended is the student's affair (its EOS): checked against the student's model, not a teacher
    eos = frozenset() if teacher else eos_ids(model, tokenizer)
    max_context = settings.get("max_context_len")
    pad = tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else 0
    recorded = "teacher_logprobs" if teacher else "response_logprobs"
    forcing = forward.TeacherForcing(
        model, device, mode, tolerance.cut_noise, tolerance.threshold / 2, options.batch_tokens, pad, recorded
    )
    collector = Collector(tolerance, options.worst)

    def faults_of(unit: Unit, i: int) -> list[tuple[str, str]]:
        turn = unit.turns[i]
        record = turn.record
        found = turn.faults + record_faults(record, eos, max_context)
        if teacher and len(record.get("teacher_logprobs") or ()) != len(record["response_token_ids"]):
            found.append(
                ("lengths", f"{len(record['response_token_ids'])} response tokens but teacher_logprobs differ")
            )
        if check is not None and record.get("continues") is None and record is unit.first:
            verdict, detail = check.check(record)
            collector.template(str(record.get("stage")), verdict)
            if detail:
                found.append(("template", detail))
        return found

    def on_turn(unit: Unit, i: int, result: forward.TurnResult) -> None:
        found = faults_of(unit, i)
        if any(kind == "lengths" for kind, _ in found):
            collector.add(unit.turns[i].record, found)
            return
        record = unit.turns[i].record
        codes = [PENALTIES] * len(result.codes) if penalties and mode == PROCESSED else result.codes
        if record.get("trainable", True) is not False:  # a trainer reads only the loss mask's tokens
            codes = [c if m else MASKED for c, m in zip(codes, record["loss_mask"], strict=False)]
        collector.add(record, found, result.recorded, result.recomputed, codes)

    fallback, unsampled = gates.sampling_fallback(settings), [0]

    def sampled(units: Any) -> Any:
        """Records without their own `sampling` (schema 2 and before) get the run's."""
        for unit in units:
            for turn in unit.turns:
                if not turn.record.get("sampling"):
                    turn.record["sampling"] = dict(fallback)
                    unsampled[0] += 1
            yield unit

    def comparable(units: Any) -> Any:
        for unit in units:
            bad = [t for t in unit.tokens if not 0 <= t < forcing.vocab]
            if bad:  # the model cannot embed them: nothing of this unit can be compared
                for i, turn in enumerate(unit.turns):
                    collector.add(
                        turn.record,
                        [
                            *faults_of(unit, i),
                            ("vocabulary", f"token id {bad[0]} is outside the model's {forcing.vocab} logits"),
                        ],
                    )
                if progress:
                    progress.advance(1)
                continue
            yield unit

    if progress:
        progress.start(len(chosen))
    try:
        for batch in forcing.batches(comparable(sampled(build(path, chosen, selection)))):
            forcing.run(batch, on_turn)
            if progress:
                progress.advance(len(batch))
    finally:
        if progress:
            progress.stop()
    overall = collector.overall()
    if unsampled[0]:
        warnings.append(gates.fallback_warning(unsampled[0], fallback))
    found, more = gates.unrendered(collector.templates, options.accept_unrendered)
    warnings += found
    folder_faults += more
    spread = gates.coverage(overall, bool(overall.records_failed or folder_faults))
    if spread:
        warnings.append(spread)
    order = system.ordered(collector.stages)
    return {
        "folder": str(path),
        "model": options.model,
        "against": options.against,
        "dtype": dtype,
        "device": str(device),
        "logprobs_mode": mode,
        "logprobs_mode_source": source,
        "precision": options.preset(dtype),
        "tolerance": {
            "threshold": tolerance.threshold,
            "max_abs": tolerance.max_abs,
            "mean_abs": tolerance.mean_abs,
            "share": tolerance.share,
            "cut_noise": tolerance.cut_noise,
        },
        "kl_estimator": KL_ESTIMATOR,
        "sample": options.sample,
        "seed": options.seed,
        "units": {"total": len(listed), "audited": len(chosen)},
        "overall": overall.to_dict(),
        "stages": {s: collector.stages[s].to_dict() for s in order},
        "templates": {s: collector.templates[s] for s in system.ordered(collector.templates)},
        "skipped_records": {s: dict(sorted(selection.skipped[s].items())) for s in system.ordered(selection.skipped)},
        "faults": dict(sorted(collector.faults.items())),
        "folder_faults": folder_faults,
        "failed": [r.to_dict() for r in collector.failed()],
        "worst": [r.to_dict() for r in collector.worst()],
        "warnings": warnings,
        "ok": overall.records_failed == 0 and not folder_faults,
    }


def first_policy(settings: dict[str, Any]) -> str | None:
    """A head-to-head folder's first policy (whose model `settings.model` names), else None."""
    policies = settings.get("policies")
    return (
        str(policies[0].get("name"))
        if isinstance(policies, list) and policies and isinstance(policies[0], dict)
        else None
    )


def policy_view(manifest: Manifest, policy: str | None) -> Manifest:
    """The folder as its policy `policy` made it (a head-to-head run, `generate --policy`): that policy's model and
    tokenizer in the settings, its servers' facts (logprobs mode, hashes) in `servers`."""
    if policy is None:
        return manifest
    entries = [p for p in manifest.settings.get("policies") or [] if isinstance(p, dict)]
    mine = next((p for p in entries if p.get("name") == policy), None)
    if mine is None:
        names = ", ".join(str(p.get("name")) for p in entries) or "none: it is not a head-to-head folder"
        raise UsageError(f"--policy {policy!r}: the folder's policies are {names}")
    settings = {**manifest.settings, "model": mine.get("model"), "tokenizer": mine.get("tokenizer")}
    servers = [
        s["policies"][policy]
        for s in manifest.servers
        if isinstance(s.get("policies"), dict) and policy in s["policies"]
    ]
    return replace(manifest, settings=settings, servers=servers)
