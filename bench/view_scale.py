"""`agentroll view` on a folder of 100,000 records: how long until the list is whole, what the server holds, how
fast it answers, and how the page in headless Chromium keeps up.

    python bench/view_scale.py [--records 100000] [--folder /tmp/agentroll-view-bench] [--groups-opened 30]
    python bench/view_scale.py --records 5000 --page   # the single page (`view -o`): its size against the folder's

The folder is written once by the real writer (`ShardWriter`), kept and reused: `single` system records, K = 8
per problem, prompts of 120-200 tokens and responses of 200-800 (one in ten cut at max tokens), a metadata
field of three values, random token ids and logprobs (the text is not the tokens' decoding: the viewer decodes
the ids with the simulated server's tokenizer). The viewer runs as the user runs it (`agentroll view DIR
--port 0`, its own process); the figures are its process's: wall seconds and CPU seconds until the index is
whole, RSS after it and after opening groups, the answers' times; then Chromium's: the page ready with every
row, a filter applied and the list redrawn, a group opened. Needs Debian's chromium for the last part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentroll.folder import ShardWriter  # noqa: E402
from agentroll.inputs import Problem  # noqa: E402
from agentroll.record.group import Group, annotate  # noqa: E402
from agentroll.record.schema import Sample  # noqa: E402
from bench.common import TOKENIZER, spawn, stop  # noqa: E402

K = 8
WORDS = ("the", "so", "then", "check", "value", "sum", "product", "first", "compute", "step", "answer", "because")


def build(folder: Path, records: int) -> None:
    rng = random.Random(0)
    writer = ShardWriter(folder, {"tokenizer": str(TOKENIZER), "samples_per_prompt": K,
                                  "system": {"name": "single", "stages": ["solver"], "options": {}}})  # fmt: skip
    writer.open()
    for p in range(records // K):
        pid = f"p{p:06d}"
        problem = Problem(id=pid, prompt=f"Problem {p}: what is {p} plus {p + 3}?", label=str(2 * p + 3),
                          metadata={"topic": ("algebra", "geometry", "counting")[p % 3]}, line=p + 1)  # fmt: skip
        prompt = [rng.randrange(3, 1000) for _ in range(rng.randrange(120, 200))]
        executions = []
        for k in range(K):
            n = rng.randrange(200, 800)
            cut = rng.random() < 0.1
            words = " ".join(rng.choice(WORDS) for _ in range(n // 2)) + (" zebra" if p % 997 == 0 else "")
            raw = float(rng.random() < 0.4)
            sample = Sample(
                problem_id=pid, problem_hash=f"h{p:014d}", rollout_id=f"{pid}-{k}", sample_index=k, group_size=K,
                stage="solver", worker=0, prompt=problem.prompt, prompt_token_ids=prompt, response=words,
                response_token_ids=[rng.randrange(3, 1000) for _ in range(n)],
                response_logprobs=[round(-rng.expovariate(1.5), 6) for _ in range(n)], loss_mask=[1] * n,
                status="truncated" if cut else "completed", finish_reason="length" if cut else "stop", stop_reason=None,
                content=None if cut else f"\\boxed{{{2 * p + 3 if raw else p}}}", raw_reward=raw, reward=raw,
                label=problem.label, model="m", endpoint="http://e", latency_s=1.0, attempts=1, rollout_size=1,
                final_reward=raw, problem=problem.prompt, metadata=problem.metadata,
            )  # fmt: skip
            executions.append([sample])
        annotate(executions, [e[0].final_reward for e in executions])
        writer.commit(Group(problem, executions))
    writer.close(complete=True)


def get(url: str) -> tuple[float, int, object]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as answer:
        body = answer.read()
    return time.perf_counter() - start, len(body), json.loads(body)


async def browse(url: str, groups: int) -> dict[str, float]:
    from tests.browser import Browser

    async with Browser() as browser:
        page = await browser.page()
        start = time.perf_counter()
        await page.load(url)
        await page.until(
            f"document.body.dataset.ready === '1' && document.querySelector('#count').textContent === "
            f"'{groups:,} groups'",
            timeout=600,
        )
        ready = time.perf_counter() - start
        heap = await page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : 0")
        filtered = await page.evaluate(
            "(() => { const t = performance.now(); const e = document.querySelector('#f-trunc'); e.checked = true; "
            "e.dispatchEvent(new Event('change')); return performance.now() - t; })()"
        )
        sorted_ms = await page.evaluate(
            "(() => { const t = performance.now(); const e = document.querySelector('#f-sort'); e.value = '-longest'; "
            "e.dispatchEvent(new Event('change')); return performance.now() - t; })()"
        )
        start = time.perf_counter()
        await page.evaluate("document.querySelector('#list tbody tr').click()")
        await page.until("!!document.querySelector('.record .tokens[data-kind=response]')", timeout=120)
        opened = time.perf_counter() - start
    return {"ready_s": ready, "js_heap_mb": heap / 2**20, "filter_ms": filtered, "sort_ms": sorted_ms, "open_s": opened}


def page(folder: Path, size: int) -> None:
    """`agentroll view DIR -o page.html` as a user runs it: its wall and CPU seconds, peak RSS, the page's bytes."""
    import resource
    import subprocess

    out = folder.parent / f"{folder.name}.html"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "agentroll", "view", str(folder), "-o", str(out), "--tokenizer", str(TOKENIZER)]
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    written = out.stat().st_size
    print(
        f"page: {written / 2**20:.1f} MiB against the folder's {size / 2**20:.1f} MiB ({written / size:.2f} of it); "
        f"written in {wall:.1f}s wall, {usage.ru_utime + usage.ru_stime:.1f}s CPU, "
        f"peak RSS {usage.ru_maxrss / 1024:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/agentroll-view-bench"))
    parser.add_argument("--groups-opened", type=int, default=30)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--page", action="store_true", help="write the single page (view -o) and measure it instead")
    args = parser.parse_args()
    folder = args.folder / str(args.records)
    if not (folder / "manifest.json").exists():
        start = time.perf_counter()
        build(folder, args.records)
        print(f"built {folder}: {args.records:,} records in {time.perf_counter() - start:.0f}s")
    size = sum(p.stat().st_size for p in folder.glob("rollouts-*"))
    groups = args.records // K
    print(f"folder: {args.records:,} records, {groups:,} groups, {size / 2**30:.2f} GiB; load {os.getloadavg()}")
    if args.page:
        return page(folder, size)
    cmd = [sys.executable, "-m", "agentroll", "view", str(folder), "--port", "0", "--tokenizer", str(TOKENIZER)]
    proc = spawn(cmd, stderr=__import__("subprocess").PIPE, text=True)
    try:
        started = time.perf_counter()
        line = proc.stderr.readline() if proc.stderr else ""
        url = line.split(" at ", 1)[1].split()[0]
        listening = time.perf_counter() - started
        me = psutil.Process(proc.pid)
        first = None
        while True:
            status = get(url + "api/status")[2]
            assert isinstance(status, dict)
            if first is None and status["groups"]:
                first = time.perf_counter() - started
            if not status["live"]:
                break
            time.sleep(0.2)  # the bench's own poll of the server's progress
        indexed = time.perf_counter() - started
        cpu = me.cpu_times()
        rss = me.memory_info().rss
        print(f"listening after {listening:.2f}s; first rows after {first:.2f}s; index whole after {indexed:.1f}s "
              f"wall, {cpu.user + cpu.system:.1f}s CPU; RSS {rss / 2**20:.0f} MiB")  # fmt: skip
        total, fetched, rows = 0.0, 0, 0
        while True:
            took, size, answer = get(url + f"api/rows?start={rows}")
            assert isinstance(answer, dict)
            total, fetched, rows = total + took, fetched + size, rows + len(answer["rows"])
            if rows >= answer["groups"]:
                break
        print(f"all {rows:,} rows: {total:.2f}s over HTTP, {fetched / 2**20:.1f} MiB of JSON")
        rng = random.Random(1)
        times, sizes = [], []
        for n in rng.sample(range(rows), args.groups_opened):
            took, size, _ = get(url + f"api/group?n={n}")
            times.append(took)
            sizes.append(size)
        median, most = statistics.median(times) * 1000, max(times) * 1000
        each, rss = statistics.median(sizes) / 2**20, me.memory_info().rss / 2**20
        print(f"{len(times)} groups opened: median {median:.0f} ms, max {most:.0f} ms, median {each:.2f} MiB each; "
              f"RSS {rss:.0f} MiB")  # fmt: skip
        for query in ("zebra", "product first"):
            took, _, found = get(url + f"api/search?q={urllib.request.quote(query)}")
            assert isinstance(found, dict)
            print(f"search {query!r}: {len(found['groups']):,} groups in {took:.2f}s")
        if not args.no_browser:
            seen = asyncio.run(browse(url, rows))
            print(f"chromium: page ready with every row after {seen['ready_s']:.2f}s "
                  f"(JS heap {seen['js_heap_mb']:.0f} MiB); "
                  f"filter + redraw {seen['filter_ms']:.0f} ms; sort + redraw {seen['sort_ms']:.0f} ms; "
                  f"a group opened in {seen['open_s']:.2f}s")  # fmt: skip
        print(f"RSS at the end {me.memory_info().rss / 2**20:.0f} MiB; load {os.getloadavg()}")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
