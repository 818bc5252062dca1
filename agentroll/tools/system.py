"""Which agent system made a folder, as its manifest says: the folder tools, the converters and the torch dataset
key their stage lists and orders off it, and the folder tools ask it for its vocabulary (`words`): report
figures, checks and inspect labels.

`settings.system` is `{"name", "stages": [...], "options": {...}}` (pluggable systems, schema version 4). A
folder made before systems were pluggable has none: it is the three-stage system, stages `schema.STAGES`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UsageError
from ..folder.manifest import Manifest
from ..record.schema import STAGES
from ..systems import vocabulary_of
from ..systems.vocabulary import Vocabulary

log = logging.getLogger("agentroll")
THREE_STAGE = "three-stage"  # the built-in default, and the system of a folder that names none


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """`name` and the ordered `stages` of a folder's system. `stages` is None when the manifest names a system
    without a stage list (a function system that declares none: `[]`) or with an unusable one (validate reports
    it); then any non-empty stage name is accepted, in any order.
    `declared`: the manifest has a `system` key (False: an older folder, three-stage by definition)."""

    name: str
    stages: tuple[str, ...] | None
    declared: bool = True
    graded: bool = True  # outcomes on the 0..1 scale (False: reward components weighted otherwise, no pass@k)

    @property
    def three_stage(self) -> bool:
        return self.name == THREE_STAGE

    def ordered(self, names: Iterable[str]) -> tuple[str, ...]:
        """`names` (unique) in the system's stage order; names it does not list follow, in the order given."""
        unique = list(dict.fromkeys(names))
        known = [s for s in (self.stages or ()) if s in unique]
        return (*known, *(s for s in unique if s not in known))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "stages": None if self.stages is None else list(self.stages)}


LEGACY = SystemInfo(THREE_STAGE, STAGES, declared=False)


def system_fault(manifest: Mapping[str, Any]) -> str | None:
    """What is wrong with the manifest's `settings.system` and `settings.stage_settings` (None: nothing, or
    absent)."""
    settings = manifest.get("settings")
    if not isinstance(settings, Mapping) or "system" not in settings:
        return None
    system = settings["system"]
    if not isinstance(system, Mapping):
        return "settings.system is not an object"
    name, stages = system.get("name"), system.get("stages")
    if not isinstance(name, str) or not name:
        return "settings.system.name is not a non-empty string"
    if not isinstance(stages, list) or not all(isinstance(s, str) and s for s in stages):
        return "settings.system.stages is not a list of non-empty strings"
    if len(set(stages)) != len(stages):
        return f"settings.system.stages {stages} names a stage twice"
    if name == THREE_STAGE and tuple(stages) != STAGES:
        return f"settings.system.stages {stages}: the three-stage system's are {list(STAGES)}"
    options = system.get("options", {})
    if not isinstance(options, Mapping):
        return "settings.system.options is not an object"
    per_stage = settings.get("stage_settings", {})
    if not isinstance(per_stage, Mapping) or not all(isinstance(v, Mapping) for v in per_stage.values()):
        return "settings.stage_settings is not an object of objects"
    unknown = [s for s in per_stage if stages and s not in stages]
    if unknown:
        return f"settings.stage_settings names {', '.join(map(repr, unknown))}, not a stage of the system"
    return None


def system_of(manifest: Manifest | Mapping[str, Any] | None) -> SystemInfo:
    """The system a manifest names; `LEGACY` (three-stage) when it names none."""
    if isinstance(manifest, Manifest):
        manifest = {"settings": manifest.settings}
    settings = manifest.get("settings") if isinstance(manifest, Mapping) else None
    if not isinstance(settings, Mapping) or "system" not in settings:
        return LEGACY
    weights = [c[2] for c in settings.get("reward_components") or () if isinstance(c, list) and len(c) == 3]
    scale = not weights or (min(weights) >= 0 and abs(sum(weights) - 1) < 1e-9)  # as rewards.components.graded
    return replace(coerce(settings["system"]), graded=scale)


def coerce(system: Any) -> SystemInfo:
    """A `SystemInfo` from one, or from a manifest's `settings.system` object (a `Generator`'s
    `settings["system"]`); an unusable object gives a system of unknown stages."""
    if isinstance(system, SystemInfo):
        return system
    if not isinstance(system, Mapping):
        return SystemInfo("?", None)
    name = system.get("name")
    stages = system.get("stages")
    if name == THREE_STAGE:
        return SystemInfo(THREE_STAGE, STAGES)
    named = name if isinstance(name, str) and name else "?"
    if (
        isinstance(stages, list)
        and stages
        and all(isinstance(s, str) and s for s in stages)
        and len(set(stages)) == len(stages)
    ):
        return SystemInfo(named, tuple(stages))
    return SystemInfo(named, None)


def words(system: SystemInfo, warn: bool = True) -> tuple[Vocabulary, str | None]:
    """The system's vocabulary, and a warning when it cannot be had (a FILE.py system not found from here, a
    module not installed): then the generic one, so that the tool still says all it can. `warn`: also log it."""
    if system.name == "?":
        return Vocabulary(), None
    try:
        return vocabulary_of(system.name), None
    except UsageError as exc:
        said = f"{exc}: its own figures, checks and labels are left out"
        if warn:
            log.warning("%s", said)
        return Vocabulary(), said
