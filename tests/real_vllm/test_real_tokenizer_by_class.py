"""The tokenizer loaded by the class its config names (start-up without torch) renders the stage prompts and a
multi-turn conversation to the very ids of a real vLLM's /tokenize, so the parity check keeps it."""

from __future__ import annotations

import asyncio
from typing import Any

from agentroll.client import CompletionClient
from agentroll.engine.parity import check_parity, probe_messages
from agentroll.render.chat import ChatEncoder, load_by_class
from agentroll.render.templates import Templates

from .conftest import SUMMARY
from .helpers import TOKENIZER


def test_vllm_renders_every_stage_prompt_as_the_tokenizer_loaded_by_its_class_does(real_vllm):
    tokenizer = load_by_class(TOKENIZER)
    assert tokenizer is not None

    def fallback() -> Any:  # AutoTokenizer's turn comes only when vLLM disagrees
        raise AssertionError("vLLM rendered the prompts otherwise")

    async def check() -> tuple[Any, Any]:
        encoder = ChatEncoder(tokenizer, {})
        client = CompletionClient([real_vllm])
        try:
            conversations = [
                *probe_messages(Templates()),
                [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Ein Dreieck: 30° + 60°?"},
                    {"role": "assistant", "content": "<think>\nsum\n</think>\n\n90°"},
                    {"role": "user", "content": "And the third angle, with <|im_end|> in the text?"},
                ],
            ]
            return await check_parity(client, encoder, "tiny", conversations, fallback), encoder.tokenizer
        finally:
            await client.aclose()

    parity, kept = asyncio.run(check())
    assert parity.supported and parity.mismatch is None
    assert kept is tokenizer  # kept: vLLM agrees token for token
    SUMMARY.append(
        f"real vLLM: {parity.checked} prompts rendered by {type(tokenizer).__name__} (loaded by its class name, "
        "no torch) match vLLM's /tokenize token for token"
    )
