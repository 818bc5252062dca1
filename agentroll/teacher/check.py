"""Does the teacher share the student's vocabulary? Checked by token ids, not by name, before anything is scored.

A teacher's logprob of a token id means something only if that id is the same token for both models. So the
teacher's server is asked, and its answers compared with the student's tokenizer (the one the run rendered its
prompts with; `agentroll distill`: the folder's):

- `/tokenize` of probe texts (prose, code, numbers, whitespace, accents, CJK, emoji, and the student's added and
  special tokens as text): the same ids;
- the vocabulary's size: `/detokenize` of the student's largest id gives its text there too, and of the next id
  nothing (vLLM decodes an id its tokenizer does not hold to ""). Models of one family often pad their embedding
  to different sizes (Qwen2.5's 0.5B and 72B: 151,936 and 152,064 rows over one 151,665-token vocabulary); the
  padding rows are no tokens, so they do not count, and such a teacher is accepted;
- one scoring call of a probe with the run's K: the teacher takes `prompt_logprobs` K (vLLM's --max-logprobs)
  and answers logprobs (never above 0: a server started with `--logprobs-mode raw_logits` answers logits).

Any difference refuses the run in one line naming the first probe that differs.
"""

from __future__ import annotations

from typing import Any

from ..client import CallFailed, TransportFailure
from ..errors import ServerError, UsageError
from .scorer import Teacher, score

PROBES = (
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m.; isn't it?",
    'def area(r: float) -> float:\n    """Circle."""\n    return 3.14159 * r ** 2  # r >= 0\n',
    "   indented\ttabs\n\n\nnewlines  and  double  spaces ",
    "1234567890 0.000123 -42 1e-9 2^10=1024 0x1F 3/4 ½",
    "Ünïcödé, naïve café — “quotes” ‘single’ … « guillemets » ß Ø",
    "日本語の文章です。中文句子，标点。한국어 문장. Русский текст. ελληνικά. עברית. العربية.",
    "emoji 🙂🚀👍🏽 and math ∑ √ ∞ ≠ ≤ → λx.x",
    '<div class="a">&amp;</div> {"json": [1, 2, {"k": null}]} \\boxed{42} $x_{1}^{2}$',
)
LOGITS = 1e-3  # a logprob above this is no logprob


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def largest_id(tokenizer: Any) -> int:
    """The student's largest token id, added tokens included (as vLLM counts its tokenizer's)."""
    return max(max(tokenizer.get_vocab().values()), len(tokenizer) - 1)


def probe_texts(tokenizer: Any) -> list[str]:
    """The probes, then the student's added and special tokens (the top of most vocabularies) as one text."""
    added = sorted(set(tokenizer.get_added_vocab()) | set(getattr(tokenizer, "all_special_tokens", ()) or ()))
    return [*PROBES, *([" ".join(added)] if added else [])]


async def check_vocabulary(teacher: Teacher, tokenizer: Any) -> None:
    """Refuse (`UsageError`, one line) a teacher whose token ids are not the student's (module docstring)."""
    where = f"--teacher {teacher.url}"
    for text in probe_texts(tokenizer):
        ours = _encode(tokenizer, text)
        theirs = await _ask(teacher, "/tokenize", {"model": teacher.model, "prompt": text, "add_special_tokens": False})
        ids = theirs.get("tokens") if isinstance(theirs, dict) else None
        if ids != ours:
            at = _first_difference(ids, ours)
            raise UsageError(
                f"{where} does not share the student's vocabulary: /tokenize of {text[:40]!r} gives "
                f"{_short(ids, at)} there and {_short(ours, at)} with the student's tokenizer, from token {at} on "
                "(a teacher must give every token id the student samples the same meaning: another tokenizer is no "
                "teacher here)"
            )
    top = largest_id(tokenizer)
    ours_text = tokenizer.decode([top], skip_special_tokens=False)
    for token, expected in ((top, ours_text), (top + 1, "")):
        answer = await _ask(teacher, "/detokenize", {"model": teacher.model, "tokens": [token]}, lenient=token > top)
        text = answer.get("prompt", "") if isinstance(answer, dict) else ""
        if text != expected:
            size = "more tokens than" if token > top else "another token at the end of"
            raise UsageError(
                f"{where} does not share the student's vocabulary: it has {size} the student's {top + 1} "
                f"(/detokenize of [{token}] gives {text[:40]!r} there, {expected[:40]!r} with the student's tokenizer)"
            )
    await _probe_scores(teacher, tokenizer)


async def _probe_scores(teacher: Teacher, tokenizer: Any) -> None:
    ids = _encode(tokenizer, PROBES[0])
    try:
        done = (await score(teacher.client, [ids], [1], teacher.model, teacher.settings.logprobs))[0]
    except CallFailed as exc:
        raise ServerError(
            f"--teacher {teacher.url} cannot score (prompt_logprobs {teacher.settings.logprobs}, one token): {exc}"
            + (" (vllm serve --max-logprobs raises vLLM's limit of 20)" if teacher.settings.logprobs > 20 else "")
        ) from None
    worst = max(done.logprobs, default=0.0)
    if worst > LOGITS:
        raise UsageError(
            f"--teacher {teacher.url} answers prompt_logprobs of {worst:.3f}, above 0: those are logits, not "
            "logprobs (serve the teacher with --logprobs-mode raw_logprobs, vLLM's default)"
        )


async def _ask(teacher: Teacher, path: str, body: dict[str, Any], lenient: bool = False) -> Any:
    """A probe's answer, retried as the run's own probes are; a server without the endpoint is refused (its
    vocabulary cannot be checked). `lenient`: an error answer means "no such token" (a tokenizer that raises on
    an id it does not hold)."""
    client = teacher.client
    if lenient:
        try:
            status, answer = await client.post_json(path, body)
        except ServerError:
            return {}
        return answer if status == 200 else {}
    try:
        answer = await client.post_with_retries(path, body, absent=frozenset({404, 405}))
    except (CallFailed, TransportFailure) as exc:
        raise ServerError(f"--teacher {teacher.url}{path} failed: {exc}") from None
    if answer is None:
        raise UsageError(
            f"--teacher {teacher.url} has no {path}: the vocabulary it shares with the student cannot be checked "
            "(a teacher is a vLLM server)"
        )
    return answer


def _first_difference(theirs: Any, ours: list[int]) -> int:
    if not isinstance(theirs, list):
        return 0
    return next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b), min(len(theirs), len(ours)))


def _short(ids: Any, at: int = 0) -> str:
    """The ids around position `at`, where two tokenizations part."""
    if not isinstance(ids, list):
        return repr(ids)[:60]
    begin = max(0, at - 2)
    shown = ", ".join(map(str, ids[begin : begin + 8]))
    return f"[{'..., ' if begin else ''}{shown}{', ...' if begin + 8 < len(ids) else ''}]"
