"""The call journal's price per finished call: CPU (user and system) and bytes appended, in-process.

    python bench/journal.py                      # answers of 470 tokens, groups of 18 calls
    python bench/journal.py --tokens 2000 --calls 20000

Each call is what `Context` does for a finished call: `call_key` (the digest of the request), `Journal.put` of the
answer (one appended line), and per group `Journal.settle` (a tombstone). Logprobs are full doubles, as vLLM
sends them. CPU from this process's rusage (the system part is the kernel copying lines into the page cache).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
from pathlib import Path

from agentroll.client.wire import Completion
from agentroll.context.calls import call_key
from agentroll.folder.journal import Journal
from agentroll.inputs import Problem


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--tokens", type=int, default=470, help="response tokens per call")
    parser.add_argument("--prompt", type=int, default=300, help="prompt tokens per call")
    parser.add_argument("--group", type=int, default=18, help="calls per group (N = 2 of three-stage: 18)")
    args = parser.parse_args()
    rng = random.Random(1)
    answers = [
        Completion(
            prompt_token_ids=[rng.randrange(150000) for _ in range(args.prompt)],
            token_ids=[rng.randrange(150000) for _ in range(args.tokens)],
            logprobs=[-abs(rng.gauss(0, 2)) for _ in range(args.tokens)],
            text=" ".join("word" for _ in range(args.tokens)),
            finish_reason="stop",
            stop_reason=None,
            endpoint="http://127.0.0.1:8000",
            latency_s=0.1,
        )
        for _ in range(64)
    ]
    params = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 4096, "seed": 7}
    folder = Path(tempfile.mkdtemp()) / "journal"
    journal = Journal(folder)
    journal.open()
    before = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(args.calls):
        problem = Problem(id=f"p{i // args.group}", prompt="q", label="1", metadata={}, line=i // args.group)
        done = answers[i % len(answers)]
        sent = call_key(problem, 0, 0, "solver", i % args.group, (done.prompt_token_ids, params, "m", 0))
        journal.put(*sent, (problem.id, problem.content_hash), done.to_json())
        if i % args.group == args.group - 1:
            journal.settle(problem.id, problem.content_hash)
    after = resource.getrusage(resource.RUSAGE_SELF)
    journal.close()
    print(
        json.dumps(
            {
                "calls": args.calls,
                "tokens": args.tokens,
                "user_us_per_call": round(1e6 * (after.ru_utime - before.ru_utime) / args.calls, 1),
                "sys_us_per_call": round(1e6 * (after.ru_stime - before.ru_stime) / args.calls, 1),
                "line_bytes": len(json.dumps(answers[0].to_json())) + 80,  # the answer, key, digest and group
            }
        )
    )


if __name__ == "__main__":
    main()
