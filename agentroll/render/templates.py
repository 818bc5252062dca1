"""The stage prompt templates: plain Jinja2 files a user can copy and edit (`--prompts DIR`, or `--prompts code`
for the bundled set that asks for a program).

A system names the templates it renders (`System.templates`); only those are loaded and fingerprinted, so a
folder holds what its system needs and the settings guard sees exactly the text that made the prompts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2

from agentroll.errors import UsageError
from agentroll.process.resources import prompts_dir

THREE_STAGE = ("solver", "rewriter", "selector")
SYSTEM_FILE = "system.jinja"


def bundled_or(directory: Path) -> Path:
    """`--prompts NAME` where no folder NAME exists: the bundled set of that name (`code`: for code rows)."""
    bundled = prompts_dir() / directory.name
    if not directory.exists() and len(directory.parts) == 1 and bundled.is_dir():
        return bundled
    return directory


class Templates:
    """Renders each named template's user message (and an optional system message) from a folder."""

    def __init__(self, directory: Path | None = None, names: tuple[str, ...] = THREE_STAGE) -> None:
        self.directory = bundled_or(Path(directory)) if directory else prompts_dir()
        self.names = tuple(names)
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False)
        self._stage: dict[str, jinja2.Template] = {}
        digest = hashlib.sha256()
        for stage in self.names:
            self._stage[stage] = self._load(env, f"{stage}.jinja", digest)
        self._system = self._load(env, SYSTEM_FILE, digest) if (self.directory / SYSTEM_FILE).is_file() else None
        self.fingerprint = digest.hexdigest()[:16]

    def _load(self, env: jinja2.Environment, name: str, digest: hashlib._Hash) -> jinja2.Template:
        path = self.directory / name
        try:
            source = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            held = sorted(f.name for f in self.directory.glob("*.jinja")) if self.directory.is_dir() else []
            raise UsageError(
                f"prompt template {path}: not there: this system needs "
                f"{', '.join(stage + '.jinja' for stage in self.names)}"
                + (f"; {self.directory} has {', '.join(held)}" if held else "")
            ) from None
        except OSError as exc:
            raise UsageError(f"prompt template {path}: {exc.strerror or exc}") from None
        digest.update(name.encode() + b"\0" + source.encode() + b"\0")
        try:
            return env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise UsageError(f"prompt template {path}:{exc.lineno}: {exc.message}") from None

    def messages(
        self, stage: str, problem: str, solutions: list[str] | None = None, **variables: object
    ) -> list[dict[str, str]]:
        """The chat messages of one call: the optional system message, then the stage's user message."""
        if stage not in self._stage:
            raise UsageError(
                f"no template {stage!r} is loaded (the system's templates are {', '.join(self.names) or 'none'})"
            )
        try:
            user = self._stage[stage].render(problem=problem, solutions=solutions or [], **variables)
            out = [{"role": "user", "content": user.strip()}]
            if self._system is not None:
                out.insert(0, {"role": "system", "content": self._system.render(problem=problem, stage=stage).strip()})
        except jinja2.TemplateError as exc:
            raise UsageError(f"prompt template {self.directory / (stage + '.jinja')}: {exc}") from None
        return out
