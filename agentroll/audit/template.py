"""Template faults: a first-turn prompt whose ids are not what the model's own chat template makes of its messages.

A record keeps its prompt as rendered text and ids, not the messages. The messages are recovered from the text
as `agentroll convert` does (`convert.messages.ChatMessages`: the model's template rendered around placeholder
messages, a user message with an optional system message, accepted only if rendering the recovered messages
gives the record's text exactly). They are then rendered and tokenized as agentroll and vLLM's chat endpoint do
(`apply_chat_template(add_generation_prompt=True)`, then the tokenizer without special tokens added again),
and the ids compared with `prompt_token_ids`. A difference is a fault: the run's server or tokenizer rendered
the conversation otherwise than this model's template does (a doubled BOS, another template, another
tokenizer). Prompts only: response ids are the model's own samples and are never re-tokenized. A prompt whose
text is not this template's rendering of such messages cannot be checked, and is counted as such; continued
turns are never re-rendered (agentroll continues conversations by ids).
"""

from __future__ import annotations

from typing import Any

from ..convert.messages import ChatMessages

MATCH, MISMATCH, UNRECOVERABLE = "match", "mismatch", "unrecoverable"
CACHE = 4096


class TemplateCheck:
    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.messages = ChatMessages(tokenizer, self.kwargs, "the model's tokenizer")
        self._ids: dict[str, list[int] | None] = {}

    def fresh(self, prompt: str) -> list[int] | None:
        """The ids of a fresh rendering of the messages behind `prompt`, or None when they cannot be recovered."""
        if prompt not in self._ids:
            if len(self._ids) >= CACHE:  # prompts repeat within a group, rarely across: a small memory will do
                self._ids.clear()
                self.messages._cache.clear()
            messages = self.messages(prompt)
            self._ids[prompt] = (
                None
                if messages is None
                else list(self.tokenizer.encode(self.messages.render(messages), add_special_tokens=False))
            )
        return self._ids[prompt]

    def check(self, record: dict[str, Any]) -> tuple[str, str | None]:
        """(verdict, what differs) for a first-turn record."""
        prompt = record.get("prompt")
        fresh = self.fresh(prompt) if isinstance(prompt, str) else None
        if fresh is None:
            return UNRECOVERABLE, None
        ids = record["prompt_token_ids"]
        if fresh == ids:
            return MATCH, None
        at = next((i for i, (a, b) in enumerate(zip(fresh, ids, strict=False)) if a != b), min(len(fresh), len(ids)))
        return MISMATCH, (
            f"prompt_token_ids differ from the model's chat template at token {at} "
            f"({len(ids)} recorded, {len(fresh)} rendered; recorded {ids[at : at + 3]}, rendered "
            f"{fresh[at : at + 3]})"
        )
