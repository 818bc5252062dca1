"""A tiny random-weight Mixtral (MoE) with the simulator's tokenizer, and its router's choices per token.

    python tiny_moe.py build OUT_DIR TOKENIZER_DIR
    python tiny_moe.py route MODEL_DIR < sequences.json > routes.json

Run with the real-vLLM venv's python (torch and transformers come with vLLM), never imported by pytest: agentroll
is not installed there. `build` writes the model (2 layers, 4 experts, 2 per token, about 470k parameters,
seeded, nothing downloaded). `route` reads a JSON list of token id sequences and writes, for each, transformers'
own forward: `experts[position][layer]` the router's top-k expert ids in descending score (what vLLM returns as
routed experts), and `logits[position][layer]` the router logits of every expert.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, MixtralConfig, MixtralForCausalLM

LAYERS, EXPERTS, PER_TOKEN = 2, 4, 2


def build(out: Path, tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,  # the CPU attention kernel wants 32+
        num_local_experts=EXPERTS,
        num_experts_per_tok=PER_TOKEN,
        max_position_embeddings=2048,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = MixtralForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters())} parameters)")


def route(model_dir: Path) -> None:
    model = MixtralForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    answers = []
    for ids in json.load(sys.stdin):
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_router_logits=True)
        logits = torch.stack([layer.reshape(len(ids), -1) for layer in out.router_logits], dim=1)  # (seq, layers, E)
        experts = torch.topk(torch.softmax(logits, dim=-1), PER_TOKEN, dim=-1).indices
        answers.append({"experts": experts.tolist(), "logits": logits.tolist()})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "route":
        route(Path(sys.argv[2]))
    else:
        raise SystemExit(__doc__)
