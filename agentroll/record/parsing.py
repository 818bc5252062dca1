"""Reading model text: the answer after the think block, the last \\boxed{...}, and `Judgment: K`."""

from __future__ import annotations

import re

THINK_CLOSE = "</think>"
_JUDGMENT = re.compile(r"Judgment\s*:\s*\**\s*(\d+)")


def answer_content(text: str, think: bool = True) -> str | None:
    """The answer a stage passes on, or None when it has none.

    With thinking, a well-formed response closes its think block exactly once: the answer is the stripped text
    after that `</think>`. No closing tag, nothing after it, or more than one `</think>` (a format violation, as
    the reference semantics say) means no answer. Without thinking (`--no-think`) the whole stripped response
    is the answer.
    """
    if think:
        parts = text.split(THINK_CLOSE)
        if len(parts) != 2:
            return None
        text = parts[1]
    content = text.strip()
    return content or None


def last_boxed(text: str) -> str | None:
    """The inside of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def parse_judgment(text: str) -> int | None:
    """The K of the first `Judgment: K` (as written, 1-based), or None."""
    match = _JUDGMENT.search(text)
    if not match or len(match.group(1)) > 18:  # a rambling model's endless digits are no list position
        return None
    return int(match.group(1))
