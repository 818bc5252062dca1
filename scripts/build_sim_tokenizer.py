"""Build the tiny byte-level BPE tokenizer that ships with the simulated server.

Run from the repo root: ``python scripts/build_sim_tokenizer.py``. The output is
committed (``agentroll/sim/tokenizer/``), so nobody needs to run this unless the
corpus or the chat template changes. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "agentroll" / "sim" / "tokenizer"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]  # ordinary added tokens, as in Qwen3 and DeepSeek-R1
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus() -> list[str]:
    texts = [p.read_text() for p in sorted((ROOT / "prompts").glob("*.jinja"))]
    texts += (ROOT / "samples" / "math.jsonl").read_text().splitlines()
    words = (
        "Let me think step by step. First we compute the value, then we check it. "
        "The answer is therefore. So the final answer is. Solution Judgment: "
        "I compare the candidate solutions and choose the one that is correct. "
        "sum product fraction square root probability remainder divisor equation"
    )
    texts += [words] * 20
    texts += [f"{i} + {j} = {i + j}. \\frac{{{i}}}{{{j}}} \\boxed{{{i * j}}}" for i in range(30) for j in range(1, 30)]
    return texts


def main() -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.add_tokens(THINK_TOKENS)
    OUT.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} (vocab {tokenizer.get_vocab_size()})")


if __name__ == "__main__":
    main()
