"""`POST /v1/chat/completions`: the simulated model answering chat messages, as an LLM judge is asked.

The messages are rendered with the model's chat template (as vLLM does, `add_generation_prompt` on), the text is
answered by the script like any prompt (a judge's prompt gets a verdict: `Script.answer`), and the reply is
vLLM 0.32's `chat.completion` body. Token-level options (logprobs, token ids) are not served: agentroll asks the
judge for text only, and a body asking for them is refused with a 400 rather than answered wrongly.
"""

from __future__ import annotations

from typing import Any

from .wire import bad_request

SUPPORTED = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n"}
    | {"stop", "priority", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "user"}
)


def chat_request(engine: Any, data: Any) -> tuple[dict[str, Any], list[int]]:
    """The completion request a chat body stands for, and its prompt ids; a 400 for what is not served."""
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("Field required (parameter=messages)", "messages")
    unserved = sorted(k for k, v in data.items() if k not in SUPPORTED and v not in (None, False))
    if unserved:
        raise bad_request(f"the simulated server does not serve {', '.join(unserved)} for chat", unserved[0])
    try:
        text = engine.render_chat(messages, add_generation_prompt=True)
    except Exception as exc:  # a template that refuses the messages: vLLM answers 400
        raise bad_request(str(exc)) from None
    body = {k: v for k, v in data.items() if k != "messages" and k != "max_completion_tokens"}
    body["prompt"] = text
    if data.get("max_completion_tokens") is not None:
        body["max_tokens"] = data["max_completion_tokens"]
    if body.get("max_tokens") is None:  # vLLM's default: what the context leaves
        body["max_tokens"] = max(1, engine.max_model_len - len(engine.tokenizer.encode(text).ids))
    request, ids_batch = engine.prompts(body)
    return request, ids_batch[0]


def chat_response(completion: dict[str, Any]) -> dict[str, Any]:
    """A `text_completion` body as vLLM's `chat.completion` one (its fields, in its order)."""
    choices = [
        {
            "index": c["index"],
            "message": {
                "role": "assistant",
                "content": c["text"],
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": None,
            "finish_reason": c["finish_reason"],
            "stop_reason": c.get("stop_reason"),
            "token_ids": None,
        }
        for c in completion["choices"]
    ]
    return {
        "id": "chatcmpl-" + completion["id"].removeprefix("cmpl-"),
        "object": "chat.completion",
        "created": completion["created"],
        "model": completion["model"],
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": completion["system_fingerprint"],
        "usage": completion["usage"],
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
