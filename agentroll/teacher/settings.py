"""The teacher options, declared once: `agentroll generate` has them (`GenerateOptions` extends `TeacherOptions`)
and so has `agentroll distill`, with the same names, defaults, help and checks. `teacher_settings()` makes the
value object a teacher is built from (`TeacherSettings`), passed on whole; `for_stage` gives a stage's own.

Per stage (`--stage NAME.teacher=URL|none`, `--stage NAME.teacher_model=NAME`): a stage scored by another
teacher, or by none. A frozen stage (`trainable: false`, a judge served by another model) is not scored unless
its own `teacher` setting says so: nothing trains on its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..client.settings import ClientSettings, Concurrency, Health, Retries, Timeouts, read_key
from ..errors import UsageError
from ..settings.declare import at_least, option

CLIENT = ClientSettings()
MOST_LOGPROBS = 100  # --teacher-logprobs: what a vLLM started with a larger --max-logprobs might list
STAGE_KEYS = ("teacher", "teacher_model")  # the per-stage settings (--stage NAME.teacher=...) that are a teacher's
NONE = ("none", "off")  # --stage NAME.teacher=none: that stage is not scored


@dataclass(frozen=True, slots=True, kw_only=True)
class TeacherSettings:
    """One teacher: its servers (`urls`, several behind one model are one teacher), its served `model` (None: the
    only one listed), `logprobs` (K: its K most likely tokens at each response position too) and how its own
    client talks to them (own concurrency, retries and endpoint health: `client`)."""

    urls: tuple[str, ...]
    model: str | None = None
    logprobs: int = 0
    client: ClientSettings = CLIENT
    all_or_nothing: bool = False  # a record that fills the teacher's context refuses the run, not kept unscored

    def recorded(self, model: str) -> dict[str, Any]:
        """What a folder's settings keep of it: the model it resolved to and K (where it runs is not what it is,
        as with --base-url)."""
        return {"model": model, "logprobs": self.logprobs}


@dataclass(frozen=True, kw_only=True)
class TeacherOptions:
    """A teacher that scores every sampled token (docs/distill.md)."""

    teacher: list[str] = option(
        [],
        "A teacher (vLLM server) that scores every sampled token: each record gains teacher_logprobs. Repeat or "
        "comma-separate for several servers of one teacher. It must share the student's vocabulary.",
    )
    teacher_model: str | None = option(None, "The teacher's served model name (default: the only one listed).")
    teacher_logprobs: int = option(
        0, "Also store the teacher's K most likely tokens at each response position (teacher_top_ids, ...)."
    )
    teacher_concurrency: int | str = option(
        "auto",
        "Most teacher requests in flight (apart from --concurrency); auto: per teacher endpoint, following its "
        "vLLM /metrics.",
        cli_type=str,
    )
    teacher_all_or_nothing: bool = option(
        False,
        "Refuse to start if any record could fill the teacher's context (default: such records are kept without "
        "teacher fields, counted and named in the summary and the manifest).",
    )
    teacher_api_key: str | None = option(None, "Sent to the teacher as a Bearer token.")
    teacher_api_key_file: str | None = option(None, "A file holding the teacher's API key (its first line).")

    def __post_init__(self) -> None:
        self.check_teacher()

    def check_teacher(self) -> None:
        """Each teacher option in its range (a subclass's checks call this among its own)."""
        set_ = object.__setattr__
        if self.teacher_api_key_file is not None:  # read once: the options then carry the key (a Ray task's too)
            if self.teacher_api_key:
                raise UsageError("--teacher-api-key and --teacher-api-key-file both give the key: give one")
            set_(self, "teacher_api_key", read_key(str(self.teacher_api_key_file), "--teacher-api-key-file"))
            set_(self, "teacher_api_key_file", None)
        urls = [self.teacher] if isinstance(self.teacher, str) else list(self.teacher or [])
        set_(self, "teacher", [u for v in urls for u in str(v).replace(",", " ").split() if u])
        for url in self.teacher:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--teacher {url!r} must be an http:// or https:// URL")
        if isinstance(self.teacher_logprobs, bool) or not isinstance(self.teacher_logprobs, int):
            raise UsageError(f"--teacher-logprobs must be a whole number, got {self.teacher_logprobs!r}")
        if not 0 <= self.teacher_logprobs <= MOST_LOGPROBS:
            raise UsageError(f"--teacher-logprobs must be a whole number from 0 to {MOST_LOGPROBS}")
        value = self.teacher_concurrency
        if isinstance(value, str) and value.strip() != "auto":
            if not value.strip().isdigit():
                raise UsageError(f"--teacher-concurrency must be a whole number or auto, got {value!r}")
            set_(self, "teacher_concurrency", int(value))
        if self.teacher_concurrency != "auto":
            at_least(self, 1, "teacher_concurrency")
        if not self.teacher and (self.teacher_model or self.teacher_logprobs or self.teacher_all_or_nothing):
            raise UsageError("--teacher-model, --teacher-logprobs and --teacher-all-or-nothing go with --teacher URL")

    def teacher_settings(self, client: ClientSettings = CLIENT) -> TeacherSettings | None:
        """The run's teacher (None without --teacher), its client made from the run's (`client`: timeouts,
        retries, endpoint health) with its own concurrency and key."""
        if not self.teacher:
            return None
        return TeacherSettings(
            urls=tuple(self.teacher),
            model=self.teacher_model,
            logprobs=self.teacher_logprobs,
            client=self._client(client),
            all_or_nothing=self.teacher_all_or_nothing,
        )

    def _client(self, client: ClientSettings) -> ClientSettings:
        fixed = self.teacher_concurrency if isinstance(self.teacher_concurrency, int) else None
        return ClientSettings(
            timeouts=client.timeouts,
            retries=client.retries,
            health=client.health,
            concurrency=replace(client.concurrency, fixed=fixed),
            api_key=self.teacher_api_key,
            affinity_slack=client.affinity_slack,
        )

    def check_stage_teachers(self, stages: dict[str, dict[str, Any]]) -> None:
        """Each stage's own teacher settings make sense (checked with the options, before any server is asked)."""
        for name, settings in stages.items():
            url, model = settings.get("teacher"), settings.get("teacher_model")
            if url is not None and str(url).lower() in NONE and model is not None:
                raise UsageError(f"--stage {name}.teacher_model goes with a teacher, not with {name}.teacher=none")
            if url is not None and str(url).lower() not in NONE and not str(url).startswith(("http://", "https://")):
                raise UsageError(f"--stage {name}.teacher={url!r}: an http:// or https:// URL, or none")
            if url is None and model is not None and not self.teacher:
                raise UsageError(f"--stage {name}.teacher_model goes with --teacher or --stage {name}.teacher=URL")

    def stage_teacher(
        self, settings: dict[str, Any], trainable: bool, client: ClientSettings = CLIENT
    ) -> TeacherSettings | None:
        """A stage's teacher from its own settings (`teacher`, `teacher_model`: `check_stage_teachers`), else the
        run's when the stage trains (a frozen stage is scored only when its own settings ask for it)."""
        url, model = settings.get("teacher"), settings.get("teacher_model")
        if url is not None and str(url).lower() in NONE:
            return None
        if url is None:
            run = self.teacher_settings(client) if trainable else None
            return run if run is None or model is None else replace(run, model=model)
        base = self.teacher_settings(client) or TeacherSettings(
            urls=(),
            logprobs=self.teacher_logprobs,
            client=self._client(client),
            all_or_nothing=self.teacher_all_or_nothing,
        )
        return replace(base, urls=(str(url),), model=model)


def client_of(max_retries: int, request_timeout: float, connect_timeout: float) -> ClientSettings:
    """A teacher's client settings where no run's are at hand (`agentroll distill`): these three, the rest at the
    client's defaults."""
    return ClientSettings(
        timeouts=Timeouts(request_s=request_timeout, connect_s=connect_timeout),
        retries=Retries(max_retries=max_retries),
        health=Health(),
        concurrency=Concurrency(),
    )


def stage_teachers(items: list[str]) -> dict[str, dict[str, str]]:
    """`--stage NAME.teacher=URL|none` and `--stage NAME.teacher_model=NAME` (`agentroll distill`, which takes no
    other stage setting) as {stage: {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        head, eq, raw = item.partition("=")
        stage, dot, key = head.strip().rpartition(".")
        if not eq or not dot or not stage or key not in STAGE_KEYS or not raw.strip():
            raise UsageError(f"--stage {item!r}: expected STAGE.teacher=URL|none or STAGE.teacher_model=NAME")
        out.setdefault(stage, {})[key] = raw.strip()
    return out
