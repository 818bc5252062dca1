"""Agent systems: what one execution asks the model, as a small class (or an async function).

A system gets a `Context` (`agentroll.context`): `await ctx.complete(stage, messages or ids, worker=i)` makes a
token-exact call, `await ctx.reward(samples)` scores samples, `ctx.problem` and `ctx.config` are the row and the
run's settings. It returns the execution's samples, rewards shaped. The engine does the rest: groups, filtering,
exactly-once resume, the writer, stats and reports. `--system NAME | FILE.py:CLASS | MODULE:CLASS`.

What its records mean (report figures, folder checks, inspect labels) the system says in its `vocabulary`
(`agentroll.systems.vocabulary`); the run summary and the folder tools ask it, so a new system is one file.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import UsageError
from ..process.loading import load_object
from .vocabulary import Vocabulary

if TYPE_CHECKING:
    from ..context import Context
    from ..record.schema import Sample
    from .recorded import Rescoring


class System:
    """Subclass, set `stages` (in the order they run: reports and checks follow it), the `templates` it renders
    (files `NAME.jinja` in the prompts folder, fingerprinted into the settings), and `options` with defaults
    (`--system-option KEY=VALUE` sets them; they are part of the settings guard), then write `run`. Its
    `vocabulary` (a `Vocabulary` subclass's instance) tells the summary and the folder tools what its records
    mean; the default reports each stage's accuracy and checks nothing of its own."""

    name: ClassVar[str] = ""
    stages: ClassVar[tuple[str, ...]] = ()
    templates: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[dict[str, Any]] = {}
    version: ClassVar[str | int | None] = None  # bump it when a change should refuse resuming older folders
    vocabulary: ClassVar[Vocabulary] = Vocabulary()

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise UsageError(
                f"system {self.name or type(self).__name__} has no option {', '.join(unknown)} "
                f"(its options: {', '.join(self.options) or 'none'})"
            )
        self.settings = {**self.options, **options}

    @property
    def uses_sandbox(self) -> bool:
        """Whether it runs model code (`ctx.sandbox`): the sandbox is then made and tried at start."""
        return False

    async def run(self, ctx: Context) -> list[Sample]:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Let go of what the system holds for the run (the agent system's proxy): the run calls it at its end."""

    async def rescore(self, execution: Rescoring) -> None:
        """Score a recorded execution again with another reward (`agentroll rescore`): what `run` did with the
        rewards, without calling a model. The default scores every sample, takes the last one's raw reward as
        the outcome, and shapes every reward by it; a system whose outcome is built otherwise says so here."""
        samples = execution.samples
        await execution.reward(samples)
        execution.final_reward = samples[-1].raw_reward
        execution.shape(samples, won=execution.final_reward == 1)


class FunctionSystem(System):
    """An `async def system(ctx)`; its `stages`, `templates` and `vocabulary` attributes, when it has them, say
    the rest."""

    def __init__(self, function: Callable[[Context], Awaitable[list[Sample]]], spec: str) -> None:
        self.function, self.name = function, spec  # type: ignore[misc]
        self.stages = tuple(getattr(function, "stages", ()))  # type: ignore[misc]
        self.templates = tuple(getattr(function, "templates", ()))  # type: ignore[misc]
        self.vocabulary = _vocabulary(function, spec)  # type: ignore[misc]
        self.settings = {}

    async def run(self, ctx: Context) -> list[Sample]:
        return await self.function(ctx)


# The built-in systems by name, each imported when first named: a run loads its own system only (a three-stage run
# does not load the tool parsers). tests/test_systems.py checks each entry's class carries its name.
BUILTINS = {
    "three-stage": "three_stage:ThreeStage",
    "single": "single:Single",
    "critique-revise": "critique_revise:CritiqueRevise",
    "tool-use": "tool_use:ToolUse",
    "agent": "agent:Agent",
}


def builtin(name: str) -> type[System] | None:
    """The built-in system called `name`, or None."""
    where = BUILTINS.get(name)
    if where is None:
        return None
    module, _, attribute = where.partition(":")
    found: type[System] = getattr(importlib.import_module(f".{module}", __name__), attribute)
    return found


def vocabulary_of(target: System | str) -> Vocabulary:
    """A system's vocabulary: of a system, or of the one a manifest names (`settings.system.name`: a built-in,
    FILE.py:NAME or MODULE:NAME, imported as `generate` did; `UsageError` when it cannot be). The system is not
    built: its vocabulary is read from its class (or function)."""
    if isinstance(target, System):
        return target.vocabulary
    known = builtin(target)
    if known is not None:
        return known.vocabulary
    if ":" not in target:
        raise UsageError(f"system {target!r}: not a built-in ({', '.join(BUILTINS)}) nor FILE.py:CLASS or MODULE:CLASS")
    found = load_object(target, "system", UsageError, "class or function")
    if isinstance(found, System) or (inspect.isclass(found) and issubclass(found, System)):
        return found.vocabulary
    if inspect.iscoroutinefunction(found):
        return _vocabulary(found, target)
    raise UsageError(f"system {target!r}: expected a subclass of agentroll.System or an async function")


def _vocabulary(function: Any, spec: str) -> Vocabulary:
    words = getattr(function, "vocabulary", None) or Vocabulary()
    if not isinstance(words, Vocabulary):
        raise UsageError(f"system {spec!r}: its vocabulary is not an agentroll.systems.vocabulary.Vocabulary")
    return words


def load_system(spec: str, options: dict[str, Any] | None = None) -> System:
    """A built-in by name, or a user's class or async function by FILE.py:NAME or MODULE:NAME."""
    options = options or {}
    known = builtin(spec)
    if known is not None:
        return known(**options)
    if ":" not in spec:
        raise UsageError(f"--system {spec!r}: not a built-in ({', '.join(BUILTINS)}) nor FILE.py:CLASS or MODULE:CLASS")
    return from_object(load_object(spec, "system", UsageError, "class or function"), spec, options)


def spec_of(target: Any) -> str:
    """`MODULE:NAME` of a system given as an object (the library's `Generator(system=MySystem)`)."""
    kind = target if inspect.isclass(target) or inspect.isfunction(target) else type(target)
    return f"{kind.__module__}:{kind.__qualname__}"


def from_object(target: Any, spec: str, options: dict[str, Any]) -> System:
    """A System subclass (made with `options`), an instance, or an async function, as a System."""
    if isinstance(target, System):
        if options:
            raise UsageError(f"system {spec!r} is an instance already: it takes no --system-option")
        if not target.name:
            target.name = spec  # type: ignore[misc]
        return target
    if inspect.isclass(target) and issubclass(target, System):
        system = target(**options)
        if not system.name:
            system.name = spec  # type: ignore[misc]
        return system
    if inspect.iscoroutinefunction(target):
        if options:
            raise UsageError(f"system {spec!r} is a function: it takes no --system-option")
        return FunctionSystem(target, spec)
    raise UsageError(f"--system {spec!r}: expected a subclass of agentroll.System or an async function")


def identity(system: System, spec: str) -> dict[str, Any]:
    """What the settings guard compares: a folder made by one system (or with other options) refuses another."""
    module, _, short = type(system).__module__.rpartition(".")
    native = module == __name__ and f"{short}:{type(system).__qualname__}" in BUILTINS.values()
    return {
        "name": system.name if native else spec,
        "stages": list(system.stages),
        "options": dict(system.settings),
        **({"version": system.version} if system.version is not None else {}),
    }
