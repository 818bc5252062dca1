"""`--to sft`: rejection-sampling fine-tuning data, the correct samples as chat messages plus token-exact
`input_ids` / `labels`.

A sample is kept when its own reward check passed (`raw_reward == 1`, its own score, not its execution's; for the
selector: it picked a correct rewrite) and it finished (`completed`): a truncated response would teach the model
not to stop. The shaped `reward` does not decide, so a correct solver of an execution whose selector went wrong
is kept. `labels` is -100 on the prompt (and on any response token outside the loss mask): TRL's `SFTTrainer`
takes a dataset with `input_ids` and `labels` as already processed and uses the labels as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, policy_of
from .messages import ChatMessages, prompt_messages, response_messages
from .trajectory import own_mask

FILE = "sft.jsonl"
IGNORE_INDEX = -100  # the label PyTorch's cross-entropy (and so transformers and TRL) leaves out of the loss


def is_correct(record: Record) -> bool:
    return float(record["raw_reward"]) == 1.0 and record["status"] == "completed"


def row(record: Record, chat: ChatMessages | None) -> dict[str, Any]:
    """A frozen stage's record (kept by default) is trained on its whole response: its `loss_mask` is 0 because
    the tokens are not the policy's samples, which does not matter for fine-tuning on them."""
    prompt_ids, response_ids = record["prompt_token_ids"], record["response_token_ids"]
    labels = [IGNORE_INDEX] * len(prompt_ids) + [
        token if mask else IGNORE_INDEX for token, mask in zip(response_ids, own_mask(record, True), strict=True)
    ]
    text: dict[str, Any] = (
        {"messages": prompt_messages(chat, record) + response_messages(record)}
        if chat is not None
        else {"prompt": record["prompt"], "completion": record["response"]}
    )
    return {
        "problem_id": record["problem_id"],
        "stage": record["stage"],
        **policy_of(record),
        **text,
        "input_ids": prompt_ids + response_ids,
        "labels": labels,
        **(
            {"teacher_logprobs": [0.0] * len(prompt_ids) + list(record["teacher_logprobs"])}
            if record.get("teacher_logprobs") is not None
            else {}
        ),  # a teacher's scores over input_ids (0.0 on the prompt): a distillation column
    }


def write(problems: Iterable[Problem], out: Path, chat: ChatMessages | None) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for record in group.records:
                    if is_correct(record):
                        writer.write(row(record, chat))
    return writer.rows
