"""The stage prompt templates: plain Jinja2 files a user can copy and edit (`--prompts DIR`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jinja2

from .errors import UsageError
from .resources import prompts_dir

STAGE_FILES = {"solver": "solver.jinja", "rewriter": "rewriter.jinja", "selector": "selector.jinja"}
SYSTEM_FILE = "system.jinja"


class Templates:
    """Renders each stage's user message (and an optional system message) from a folder of templates."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory else prompts_dir()
        env = jinja2.Environment(
            undefined=jinja2.StrictUndefined, keep_trailing_newline=False, autoescape=False
        )
        self._stage: dict[str, jinja2.Template] = {}
        digest = hashlib.sha256()
        for stage, name in STAGE_FILES.items():
            self._stage[stage] = self._load(env, name, digest)
        self._system = self._load(env, SYSTEM_FILE, digest) if (self.directory / SYSTEM_FILE).is_file() else None
        self.fingerprint = digest.hexdigest()[:16]

    def _load(self, env: jinja2.Environment, name: str, digest: hashlib._Hash) -> jinja2.Template:
        path = self.directory / name
        try:
            source = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"prompt template {path}: {exc.strerror or exc}") from None
        digest.update(name.encode() + b"\0" + source.encode() + b"\0")
        try:
            return env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise UsageError(f"prompt template {path}:{exc.lineno}: {exc.message}") from None

    def messages(self, stage: str, problem: str, solutions: list[str] | None = None) -> list[dict[str, str]]:
        """The chat messages of one call: the optional system message, then the stage's user message."""
        try:
            user = self._stage[stage].render(problem=problem, solutions=solutions or [])
            out = [{"role": "user", "content": user.strip()}]
            if self._system is not None:
                out.insert(0, {"role": "system", "content": self._system.render(problem=problem, stage=stage).strip()})
        except jinja2.TemplateError as exc:
            raise UsageError(f"prompt template {self.directory / STAGE_FILES[stage]}: {exc}") from None
        return out
