"""Peak memory against input size, and start-up time to the first request.

    python bench/memory_startup.py
    python bench/memory_startup.py --startup-only --source /path/to/another/checkout   # its agentroll instead

Peak RSS of `agentroll generate --limit 3000` on a 10,000-line and on a 1,000,000-line input (the server answers
at once): memory must not grow with the input. Start-up: from launching the command to the first completion
request the server sees (its `agentroll_sim_first_request_unix` gauge). The last row loads the tokenizer with
`AutoTokenizer` (`--chat-render local`): with torch installed, that imports torch. `--startup-only` skips the
1,000,000-line row (the start-up rows alone, for trees compared side by side); `--source` runs the generate of
another checkout (its own package, imported from its folder), against the simulator of this one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from common import TOKENIZER, metrics, spawn, start_sim, stop, write_problems


def run(
    problems: Path, url: str, out: Path, limit: int, extra: tuple[str, ...] = (), source: Path | None = None
) -> tuple[float, float]:
    """(peak RSS in MB, seconds from launch to the first request the server saw)."""
    launched = time.time()
    proc = spawn(
        [
            sys.executable,
            "-m",
            "agentroll",
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            url,
            "--tokenizer",
            str(TOKENIZER),
            "--limit",
            str(limit),
            "--reward",
            "exact",
            "--quiet",
            "--overwrite",
            *extra,
        ],
        cwd=str(source) if source else None,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: `stop` must not signal that pid again
    first = metrics(url)["agentroll_sim_first_request_unix"]
    return usage.ru_maxrss / 1024, first - launched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup-only", action="store_true", help="skip the 1,000,000-line memory row")
    parser.add_argument("--source", type=Path, help="the checkout whose agentroll generate runs")
    args = parser.parse_args()
    source = args.source.resolve() if args.source else None
    tmp = Path(tempfile.mkdtemp())
    results: dict[str, object] = {"source": str(source or Path(__file__).resolve().parent.parent)}
    rows = ((10_000, ()), (1_000_000, ()), (10_000, ("--chat-render", "local")))
    for lines, extra in rows[::2] if args.startup_only else rows:
        problems = write_problems(tmp / f"p{lines}.jsonl", lines)
        sim, url = start_sim(0.0, 150)
        try:
            rss, startup = run(problems, url, tmp / f"out{lines}", 3000, extra, source)
        finally:
            stop(sim)
        name = f"input_{lines}_lines" + ("_transformers" if extra else "")
        results[name] = {"peak_rss_mb": round(rss, 1), "startup_s": round(startup, 2)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
