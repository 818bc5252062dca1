"""A multi-turn system (critique-revise) against a real vLLM: each turn continues the last by token ids, and what
vLLM was sent and answered is exactly what the records hold, masks included."""

from __future__ import annotations

import json
import urllib.request
from itertools import pairwise

import pytest
from transformers import AutoTokenizer

from ..conftest import read_records
from .conftest import SUMMARY
from .helpers import TOKENIZER, RecordingProxy, generate, manifest, problems
from .test_real_vllm import check_exact


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_critique_revise_is_token_exact_over_its_turns_on_real_vllm(api, real_vllm, tmp_path):
    inputs = problems(tmp_path / "p.jsonl", 4)
    out = tmp_path / "out"
    with RecordingProxy(real_vllm) as proxy:
        proc = generate(
            proxy.url,
            inputs,
            out,
            "--api",
            api,
            "--system",
            "critique-revise",
            "--samples-per-prompt",
            "2",
            max_tokens=16,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    assert manifest(out)["settings"]["system"]["stages"] == ["solver", "critic", "reviser"]
    records = read_records(out)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    assert check_exact(records, proxy.log, api, tokenizer) == len(records)  # ids, logprobs: vLLM's own
    executions: dict[str, list[dict]] = {}
    for r in records:
        executions.setdefault(r["rollout_id"], []).append(r)
    assert len(executions) == 8
    rerendered_differs = 0
    for rows in executions.values():
        assert [r["stage"] for r in rows] == ["solver", "critic", "reviser"]
        for before, now in pairwise(rows):
            head = before["prompt_token_ids"] + before["response_token_ids"]
            assert now["prompt_token_ids"][: len(head)] == head
            injected = len(now["prompt_token_ids"]) - len(head)
            assert injected > 0
            history = (before["history_mask"] or [0] * len(before["prompt_token_ids"])) + before["loss_mask"]
            assert now["history_mask"] == history + [0] * injected
        # what a re-rendering of the same conversation from text would have sent instead
        solver, critic = rows[0], rows[1]
        body = {
            "model": solver["model"],
            "add_generation_prompt": True,
            "messages": [
                {"role": "user", "content": _last_user(tokenizer, solver)},
                {"role": "assistant", "content": solver["response"]},
                {"role": "user", "content": _last_user(tokenizer, critic)},
            ],
        }
        request = urllib.request.Request(
            f"{real_vllm}/tokenize", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as answer:
            rerendered = json.loads(answer.read())["tokens"]
        rerendered_differs += rerendered != critic["prompt_token_ids"]
    SUMMARY.append(
        f"real vLLM, critique-revise --api {api}: {len(records)} samples over {len(executions)} "
        f"conversations token-exact; re-rendering the conversation as text would have sent other ids in "
        f"{rerendered_differs} of {len(executions)} critic prompts"
    )


def _last_user(tokenizer, record: dict) -> str:
    """A prompt's last user message, read back from its ChatML rendering (the tiny model's template)."""
    text = tokenizer.decode(record["prompt_token_ids"])
    start = text.rfind("<|im_start|>user\n") + len("<|im_start|>user\n")
    return text[start : text.find("<|im_end|>", start)]
