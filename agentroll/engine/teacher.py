"""A run's teachers, set up before the first call: which stage is scored by which teacher (`--teacher`, and
`--stage NAME.teacher=URL|none`: a frozen stage by none unless it asks), each teacher reached once, its served
model found, its vocabulary checked against each tokenizer it scores for, and its context against each stage's.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentroll.client.settings import ClientSettings
from agentroll.engine.handshake import discover
from agentroll.teacher.check import check_vocabulary
from agentroll.teacher.scorer import Teacher
from agentroll.teacher.settings import TeacherOptions, TeacherSettings

if TYPE_CHECKING:
    from agentroll.client import Transport
    from agentroll.context.stages import Engine, Stage

log = logging.getLogger("agentroll")


async def attach(
    options: TeacherOptions,
    client: ClientSettings,
    engine: Engine,
    stage_settings: dict[str, dict[str, Any]],
    made: list[Teacher],
    explicit: bool = False,
    transport: Transport | None = None,
) -> dict[str, Any] | None:
    """Give the engine's stages their teachers (`Stage.teacher`), appending each one made to `made` (the caller
    closes them; one already there with the same settings is used again). Returns what the folder's settings keep
    (`settings.teacher`: per stage the teacher's model and K, null for a stage scored by none), or None when no
    stage has a teacher (a run without one).

    A stage's context must fit its teacher's with the one token a scoring call generates. Unless the context was
    set (`explicit`: --max-context-len; then it is refused), the stage's is cut to the teacher's max_model_len - 1,
    as it defaults to what its own server serves: a record the teacher could not score is never sampled."""
    teachers: dict[TeacherSettings, Teacher] = {}
    checked: set[tuple[int, int]] = set()
    cuts: dict[tuple[int | None, int], list[str]] = {}

    async def teacher_of(settings: TeacherSettings) -> Teacher:
        found = teachers.get(settings) or next((t for t in made if t.settings == settings), None)
        if found is not None:
            teachers[settings] = found  # one teacher for every engine it scores for (each policy's)
        else:
            found = teachers[settings] = Teacher(settings, transport)
            made.append(found)
            model, length, _ = await discover(found.client, settings.model)
            await found.start(model, length)
        return found

    default = options.teacher_settings(client)
    engine.default.teacher = await teacher_of(default) if default is not None else None
    plan: dict[str, Teacher | None] = {}
    for name in dict.fromkeys((*engine.declared, *stage_settings)):
        stage = engine.stage(name)
        wanted = options.stage_teacher(stage_settings.get(name, {}), stage.trainable, client)
        stage.teacher = teacher = await teacher_of(wanted) if wanted is not None else None
        plan[name] = teacher
        if teacher is None:
            continue
        tokenizer = stage.encoder.tokenizer
        if (id(teacher), id(tokenizer)) not in checked:
            await check_vocabulary(teacher, tokenizer)
            checked.add((id(teacher), id(tokenizer)))
        cut = fit(stage, teacher, explicit, f"stage {name}")
        if cut is not None:
            cuts.setdefault(cut, []).append(name)
    if engine.default.teacher is not None:
        teacher = engine.default.teacher
        if (id(teacher), id(engine.default.encoder.tokenizer)) not in checked:
            await check_vocabulary(teacher, engine.default.encoder.tokenizer)
        cut = fit(engine.default, teacher, explicit, "the run")
        if cut is not None:
            cuts.setdefault(cut, [])
    for (context, limit), names in cuts.items():
        log.info(
            "the context of %s is cut from %s to %d tokens, so that the teacher (max_model_len %d) can score every "
            "record with the one token a scoring call generates",
            "stage " + ", ".join(names) if names else "the run",
            context,
            limit - 1,
            limit,
        )
    if not teachers:
        return None
    return {
        "default": _recorded(engine.default.teacher),
        "stages": {name: _recorded(teacher) for name, teacher in plan.items()},
    }


def fit(stage: Stage, teacher: Teacher, explicit: bool, where: str) -> tuple[int | None, int] | None:
    """Cut the stage's context to what the teacher can score (see `attach`); one that was set is kept (the
    records that fill the teacher's context go unscored) or, under --teacher-all-or-nothing, refused. The
    (context, teacher's max_model_len) of a cut."""
    limit, context = teacher.max_model_len, stage.config.max_context_len
    if limit is None or (context is not None and context < limit):
        return None
    if explicit and context is not None:  # the context was asked for: kept; what fills the teacher's goes unscored
        if not teacher.room(context, f"{where}'s records"):
            log.warning(
                "--teacher %s: its max_model_len (%d) leaves no room to score %s's records of %d tokens or more "
                "(the one token a scoring call generates): they are kept without teacher fields "
                "(--teacher-all-or-nothing refuses the run instead; --max-context-len %d scores every record)",
                teacher.url, limit, where, limit, limit - 1,
            )  # fmt: skip
        return None
    stage.config = replace(stage.config, max_context_len=limit - 1)
    return context, limit


def _recorded(teacher: Teacher | None) -> dict[str, Any] | None:
    return None if teacher is None else teacher.settings.recorded(teacher.model)
