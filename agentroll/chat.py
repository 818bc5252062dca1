"""Local prompt rendering: the model's chat template applied with its own `transformers` tokenizer."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import UsageError


def load_tokenizer(name_or_path: str) -> Any:
    """`AutoTokenizer.from_pretrained`, with a one-line error instead of a hub traceback."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # hides the "PyTorch was not found" advisory
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except Exception as exc:  # transformers raises OSError, ValueError, HF hub errors...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot load tokenizer {name_or_path!r}: {first} (pass --tokenizer with a local path or a hub id)"
        ) from None
    if not getattr(tokenizer, "chat_template", None):
        raise UsageError(f"tokenizer {name_or_path!r} has no chat template")
    return tokenizer


class ChatEncoder:
    """Messages -> (rendered text, token ids), exactly as vLLM renders a chat request: the template with
    `add_generation_prompt=True`, then tokenized without adding special tokens a second time."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None,
                 server_render: Callable[[list[dict[str, Any]]], Awaitable[list[int]]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.server_render = server_render  # set: prompts are rendered by the server's /tokenize instead

    async def render(self, messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
        """The prompt of one call: rendered here, or by the server when its template differs from ours (the
        text is then the local decoding of the server's ids)."""
        if self.server_render is None:
            return self.encode(messages)
        ids = await self.server_render(messages)
        return self.tokenizer.decode(ids, skip_special_tokens=False), ids

    def encode(self, messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.kwargs
        )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text, list(ids)
