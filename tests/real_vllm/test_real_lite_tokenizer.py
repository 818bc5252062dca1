"""The tokenizer loaded without transformers (start-up without torch) is proven by a real vLLM's /tokenize."""

from __future__ import annotations

import asyncio

from agentroll import tokenizer_lite
from agentroll.chat import ChatEncoder
from agentroll.client import CompletionClient
from agentroll.parity import check_parity, probe_messages
from agentroll.templates import Templates

from .conftest import SUMMARY
from .helpers import TOKENIZER


def test_vllm_renders_every_stage_prompt_as_the_lite_tokenizer_does(real_vllm):
    async def check() -> tuple[object, object]:
        encoder = ChatEncoder(tokenizer_lite.load(TOKENIZER), {})
        client = CompletionClient([real_vllm])
        try:
            conversations = [*probe_messages(Templates()), [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ein Dreieck: 30° + 60°?"},
                {"role": "assistant", "content": "<think>\nsum\n</think>\n\n90°"},
                {"role": "user", "content": "And the third angle, with <|im_end|> in the text?"}]]
            return await check_parity(client, encoder, "tiny", conversations), encoder.tokenizer
        finally:
            await client.aclose()

    parity, tokenizer = asyncio.run(check())
    assert parity.supported and parity.mismatch is None  # type: ignore[attr-defined]
    assert isinstance(tokenizer, tokenizer_lite.LiteTokenizer)  # kept: vLLM proved it
    SUMMARY.append(f"real vLLM: {parity.checked} prompts rendered without transformers match vLLM's "  # type: ignore[attr-defined]
                   "/tokenize token for token")
