"""Make docs/report.png: `agentroll report` of a run on the simulated server, photographed by headless Chromium.

    python scripts/report_screenshot.py [OUT.png]

Needs Debian's chromium (`apt-get install chromium`) and the test extra. Nothing is downloaded: the run is the
simulated server's, the browser is driven by tests/browser.py over its DevTools port on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentroll.cli import run_generate  # noqa: E402
from agentroll.process.resources import sim_tokenizer_dir  # noqa: E402
from agentroll.sim.script import Script  # noqa: E402
from agentroll.sim.server import SimServer  # noqa: E402
from agentroll.tools.html import report  # noqa: E402
from tests.browser import Browser  # noqa: E402

TOPICS = ("addition", "multiplication", "subtraction")


def make_folder(root: Path) -> Path:
    problems = root / "problems.jsonl"
    with problems.open("w") as f:
        for i in range(36):
            topic = TOPICS[i % 3]
            a, b = 7 + i, 3 + 2 * i
            answer = {"addition": a + b, "multiplication": a * b, "subtraction": a - b}[topic]
            sign = {"addition": "plus", "multiplication": "times", "subtraction": "minus"}[topic]
            f.write(
                json.dumps(
                    {"id": f"q{i:02d}", "prompt": f"What is {a} {sign} {b}?", "label": str(answer), "topic": topic}
                )
                + "\n"
            )
    server = SimServer(script=Script.from_jsonl(problems), seed=11, record=False)
    url = server.start()
    try:
        code = run_generate(
            {"input": str(problems), "output": str(root / "out"), "shard_size": 60},
            {
                "base_url": [url],
                "tokenizer": str(sim_tokenizer_dir()),
                "num_parallel": 4,
                "samples_per_prompt": 4,
                "max_tokens": 320,
                "seed": 0,
            },
            quiet=True,
            debug=False,
        )
    finally:
        server.stop()
    if code != 0:
        raise SystemExit(f"the run failed (exit {code})")
    return root / "out"


async def photograph(page_path: Path, out: Path) -> None:
    async with Browser() as browser:
        page = await browser.page()
        await page.load(page_path.as_uri(), width=1340)
        out.write_bytes(await page.screenshot(scale=0.5))


def main() -> None:
    out = (Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "report.png").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the page's title names the folder as given: `out`
        make_folder(Path("."))
        report("out", "report.html", by="topic")
        asyncio.run(photograph(Path(tmp) / "report.html", out))
    print(f"{out} ({out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
