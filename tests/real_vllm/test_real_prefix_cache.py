"""vLLM's own prefix-cache counters after a run whose executions share their prompts (issue 11: affinity).

A problem's K executions and N solvers send one solver prompt; on one server vLLM's prefix cache serves all but
the first from cache. The counters count tokens (`vllm:prefix_cache_queries_total`, `..._hits_total`), at the
server's block size (128 on the CPU build: only whole blocks of a prompt can hit), so the problems are long.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from ..conftest import run_cli
from .conftest import SUMMARY
from .helpers import TOKENIZER, manifest

WORDS = (
    "a train leaves the station at noon and travels east while another one waits for the signal to turn green "
    "so that the passengers can board before the doors close and the journey continues across the plain"
)


def counters(url: str) -> tuple[float, float]:
    """(tokens queried, tokens hit) so far, summed over engines."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    return total("vllm:prefix_cache_queries_total"), total("vllm:prefix_cache_hits_total")


def test_executions_of_one_problem_hit_vllms_prefix_cache(real_vllm, tmp_path: Path):
    path = tmp_path / "long.jsonl"
    with path.open("w") as f:
        for i in range(3):
            story = " ".join([f"Story {i}:", WORDS, WORDS])
            f.write(
                json.dumps(
                    {"id": f"long{i}", "prompt": f"{story}. What is {i} times {i + 2}?", "label": str(i * (i + 2))}
                )
                + "\n"
            )
    queried, hit = counters(real_vllm)
    # No --seed: vLLM 0.32's CPU build kills its engine ("CPU Generator does not use offset") when a seeded
    # request's prompt is prefilled in chunks, as these long prompts are when many arrive at once.
    run = run_cli(
        "generate",
        str(path),
        "-o",
        str(tmp_path / "out"),
        "--base-url",
        real_vllm,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--samples-per-prompt",
        "3",
        "--no-think",
        "--max-tokens",
        "24",
        "--reward",
        "exact",
        "--api",
        "completions",
        timeout=900,
    )
    assert run.returncode == 0, run.stderr.decode()
    assert manifest(tmp_path / "out")["groups"] == 3
    queried2, hit2 = counters(real_vllm)
    rate = (hit2 - hit) / (queried2 - queried)
    SUMMARY.append(
        f"real vLLM prefix cache, 3 problems x 3 executions x 2 solvers (+ rewriters, selector): "
        f"{hit2 - hit:.0f} of {queried2 - queried:.0f} prompt tokens from cache, hit rate {rate:.3f}"
    )
    print(SUMMARY[-1])
    assert rate > 0
