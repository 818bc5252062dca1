"""An LLM judge's prompt and verdict: a template rendered into chat messages, and the score read from its reply.

The template is a text file with `{problem}`, `{answer}`, `{label}`, `{response}` and the row's metadata fields by
name (`{{` and `}}` for literal braces). Lines `--- system ---` and `--- user ---` split it into messages; without
them the whole file is one user message. A name the row does not have is refused when rendered (the sample's
judging fails, saying which), never sent as an empty string. Built-in rubrics live in `prompts/judge/`: pass one
by name (`--judge-prompt correctness`) or copy it and edit.

A verdict is the reply's last `Score: X` (`--judge-pattern` with one group for another wording), X in
`--judge-scale LO:HI` (default 0:1) mapped onto [0, 1]; or (`--judge-parse json`) the last JSON object in the
reply with a number `score`. Anything else (no score, one out of range) is no verdict: `ValueError` saying why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..process.resources import prompts_dir

DEFAULT_PATTERN = r"Score:\s*\**\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))"
_SECTION = re.compile(r"^--- (system|user|assistant) ---[ \t]*$", re.MULTILINE)
_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
_GROUP_SCORE = r"Score\s+{i}:\s*\**\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+))"
VERDICT_CHARS = 2000  # of the judge's reply kept on the record


@dataclass(frozen=True, slots=True, kw_only=True)
class JudgeSettings:
    """The judge: its server and model, its own client's limits, its prompt and how its verdict is read."""

    url: str
    model: str
    prompt: str  # the template's path (or a built-in's name), as given
    messages: tuple[tuple[str, str], ...]  # the template's (role, text) messages
    api_key: str | None = None
    concurrency: int = 16
    timeout_s: float = 120.0
    max_retries: int = 3  # per sample: an HTTP failure, a reply without a verdict or one out of range
    backoff_s: float = 0.5
    max_tokens: int = 1024
    temperature: float = 0.0
    parse: str = "score"  # score | json
    pattern: str = DEFAULT_PATTERN
    scale: tuple[float, float] = (0.0, 1.0)
    mode: str = "sample"  # sample | group (the K answers of a problem judged together)
    failures: str = "fail"  # fail: the group is not written (exit 8) | keep: written, frozen, no verdict

    def recorded(self) -> dict[str, Any]:
        """What of the judge changes a reward, as a folder's settings keep it (where it runs is not what it is)."""
        text = "".join(f"{role}\n{body}\n" for role, body in self.messages)
        return {
            "model": self.model,
            "prompt_hash": hashlib.blake2b(text.encode(), digest_size=8).hexdigest(),
            "parse": self.parse,
            "pattern": self.pattern,
            "scale": list(self.scale),
            "mode": self.mode,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }


def load_template(spec: str) -> tuple[tuple[str, str], ...]:
    """The messages of the template file `spec` (or of the built-in rubric of that name): `UsageError` naming it."""
    path, builtin = Path(spec), prompts_dir() / "judge"
    if not path.is_file() and (builtin / f"{spec}.txt").is_file():
        path = builtin / f"{spec}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        names = ", ".join(sorted(p.stem for p in builtin.glob("*.txt")))
        raise UsageError(
            f"--judge-prompt {spec}: cannot read it ({getattr(exc, 'strerror', None) or exc}); built-in: {names}"
        ) from None
    parts = _SECTION.split(text)
    if len(parts) == 1:
        messages = [("user", text.strip())]
    else:
        if parts[0].strip():
            raise UsageError(f"--judge-prompt {path}: text before its first '--- ROLE ---' line")
        messages = [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts), 2)]
    if not any(role == "user" and body for role, body in messages):
        raise UsageError(f"--judge-prompt {path}: no user message")
    return tuple(messages)


def render(template: tuple[tuple[str, str], ...], values: dict[str, Any]) -> list[dict[str, str]]:
    """The judge's chat messages: each `{name}` replaced by its value (a non-string as JSON). `KeyError` naming a
    field the values lack."""

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name not in values:
            raise KeyError(name)
        value = values[name]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return [{"role": role, "content": _FIELD.sub(one, body)} for role, body in template]


def fields_of(template: tuple[tuple[str, str], ...]) -> set[str]:
    return {m.group(1) for _, body in template for m in _FIELD.finditer(body) if m.group(1)}


def _number(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"score {text} is not a number")
    return value


def _scaled(value: float, scale: tuple[float, float]) -> float:
    lo, hi = scale
    if not lo <= value <= hi:
        raise ValueError(f"score {value:g} is outside {lo:g}..{hi:g}")
    return (value - lo) / (hi - lo)


def verdict(reply: str, settings: JudgeSettings) -> tuple[float, float]:
    """(the raw reward in [0, 1], the score as the judge wrote it) from a pointwise reply: `ValueError` saying why
    there is none."""
    if settings.parse == "json":
        value = _json_score(reply)
    else:
        found = re.findall(settings.pattern, reply)
        if not found:
            raise ValueError("no score in the reply")
        last = found[-1]
        value = _number(last[0] if isinstance(last, tuple) else last)
    return _scaled(value, settings.scale), value


def group_verdict(reply: str, count: int, settings: JudgeSettings) -> list[tuple[float, float]]:
    """Each of `count` answers' (raw reward, score) from a group reply: the last `Score i: X` of each i (or, with
    `--judge-parse json`, a JSON object's `scores` list of `count` numbers). `ValueError` when any is missing."""
    if settings.parse == "json":
        obj = _json_object(reply, "scores")
        scores = obj["scores"]
        if not isinstance(scores, list) or len(scores) != count:
            raise ValueError(f"'scores' is not a list of {count} numbers")
        values = [_as_number(v) for v in scores]
    else:
        values = []
        for i in range(1, count + 1):
            found = re.findall(_GROUP_SCORE.format(i=i), reply)
            if not found:
                raise ValueError(f"no score for answer {i} in the reply")
            values.append(_number(found[-1]))
    return [(_scaled(v, settings.scale), v) for v in values]


def _as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"score {value!r} is not a number")
    return _number(str(value))


def _json_score(reply: str) -> float:
    return _as_number(_json_object(reply, "score")["score"])


def _json_object(reply: str, key: str) -> dict[str, Any]:
    """The last JSON object in the reply that has `key`."""
    decoder = json.JSONDecoder()
    found = None
    for start in [m.start() for m in re.finditer(r"\{", reply)]:
        try:
            obj, _ = decoder.raw_decode(reply, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and key in obj:
            found = obj
    if found is None:
        raise ValueError(f'no JSON object with "{key}" in the reply')
    return found


def capped(text: str, limit: int = VERDICT_CHARS) -> str:
    """The reply as a record keeps it: its end (where the verdict is) when it is long."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
