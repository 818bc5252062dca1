"""What `--return-sampling-mask` costs: bytes per response token it adds to a folder, and the run's rate with and
without it, side by side against one simulated server (`serve-sim --enable-scale-out --return-sampling-mask`).

    python bench/sampling_mask.py                     # 24 problems x 2 samples, top-k 50, top-p 0.95, 2 rounds
    python bench/sampling_mask.py --problems 64 --top-k 512 --top-p 0.9

Each round runs `agentroll generate` twice on the same problems and seed, once with the mask and once without, in
alternating order. Bytes: the sidecar's (the masks' `.npy` blobs, CSR: a count per token and the kept ids) plus
what the references add to the JSONL over `"sampling_mask": null`, over the run's response tokens. Rate: records
and response tokens per second of the whole command (start-up included), the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, TOKENIZER, start_sim, stop, write_problems


def run(url: str, problems: Path, out: Path, args: argparse.Namespace, masks: bool) -> dict[str, float]:
    command = [sys.executable, "-m", "agentroll", "generate", str(problems), "-o", str(out), "--overwrite"]
    command += ["--base-url", url, "--tokenizer", str(TOKENIZER), "--reward", "exact", "--seed", "7"]
    command += ["--samples-per-prompt", "2", "--top-k", str(args.top_k), "--top-p", str(args.top_p)]
    command += ["--temperature", "0.8", "--max-tokens", "512", *(["--return-sampling-mask"] if masks else [])]
    began = time.monotonic()
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    wall = time.monotonic() - began
    records = [json.loads(line) for shard in sorted(out.glob("rollouts-*.jsonl")) for line in shard.open()]
    tokens = sum(len(r["response_token_ids"]) for r in records)
    side = sum(p.stat().st_size for p in out.glob("rollouts-*.routes"))
    refs = sum(len(json.dumps(r["sampling_mask"])) - len("null") for r in records if r["sampling_mask"])
    return {"wall": wall, "records": len(records), "tokens": tokens, "sidecar": side, "refs": refs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.95)
    args = parser.parse_args()
    proc, url = start_sim(0.0, extra=["--enable-scale-out", "--return-sampling-mask"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            problems = write_problems(Path(tmp) / "p.jsonl", args.problems)
            results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for i in range(args.rounds):
                for masks in (True, False) if i % 2 == 0 else (False, True):
                    results[masks].append(run(url, problems, Path(tmp) / f"out-{masks}", args, masks))
    finally:
        stop(proc)
    masked = results[True][-1]
    per_token = (masked["sidecar"] + masked["refs"]) / masked["tokens"]
    print(f"top-k {args.top_k}, top-p {args.top_p}: {masked['records']:.0f} records, {masked['tokens']:.0f} tokens")
    print(
        f"mask bytes per response token: {per_token:.2f} (sidecar {masked['sidecar'] / masked['tokens']:.2f}, "
        f"JSONL references {masked['refs'] / masked['tokens']:.2f})"
    )
    for masks in (False, True):
        walls = [r["wall"] for r in results[masks]]
        wall = statistics.median(walls)
        done = results[masks][-1]
        print(
            f"{'with' if masks else 'without'} --return-sampling-mask: {done['records'] / wall:.1f} records/s, "
            f"{done['tokens'] / wall:.0f} response tokens/s (median wall {wall:.2f}s of {len(walls)})"
        )


if __name__ == "__main__":
    main()
