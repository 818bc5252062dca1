"""Make docs/view.png: `agentroll view` of a run on the simulated server, photographed by headless Chromium.

    python scripts/view_screenshot.py [OUT.png]

The run is report_screenshot.py's (36 problems of three topics, K = 4, three-stage); the page is served on a
free loopback port, a group whose selector picked a right rewrite is opened, that rewrite shown token by token
beside a truncated record, a token hovered. Needs Debian's chromium and the test extra; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from report_screenshot import make_folder  # noqa: E402

from agentroll.process.resources import sim_tokenizer_dir  # noqa: E402
from agentroll.tools.view import open_folder  # noqa: E402
from agentroll.tools.view.server import ViewServer  # noqa: E402
from tests.browser import Browser  # noqa: E402


async def photograph(url: str, out: Path) -> None:
    async with Browser() as browser:
        page = await browser.page()
        await page.load(url, width=1500, height=860)
        await page.until("!!document.querySelector('.record .tokens[data-kind=response]')")
        await page.evaluate(
            "(() => { const t = [...document.querySelectorAll('.record .tokens[data-kind=response] .tok.lp3')][2];"
            " t && t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true})); })()"
        )
        bottom = await page.evaluate(
            "Math.max(...[...document.querySelectorAll('.record .tokens[data-kind=response]')]"
            ".map(b => b.getBoundingClientRect().bottom + window.scrollY)) + 60"
        )
        out.write_bytes(await page.screenshot(scale=0.6, height=int(bottom)))


def main() -> None:
    out = (Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "view.png").resolve()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the page names the folder as given: `out`
        make_folder(Path("."))
        index = open_folder("out", str(sim_tokenizer_dir()))
        server = ViewServer(index)
        index.start()
        url = server.start()
        try:
            index.wait_for(lambda i: i.done.is_set(), 120)
            n = next(r["n"] for r in index.rows if r["tags"].get("candidate right, pick right") and r["truncated"])
            records = index.group(n)["executions"][0]["records"]
            picked = next((i for i, r in enumerate(records) if r["mark"]), len(records) - 1)
            cut = next((i for i, r in enumerate(records) if r["status"] == "truncated"), 0)
            asyncio.run(photograph(f"{url}#g={n}&r=0.{picked},0.{cut}", out))
        finally:
            server.stop()
    print(f"{out} ({out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
