"""`agentroll view` in a real headless Chromium (Debian's; skipped, with the reason, without one): what a person
sees, checked against the records. The list and its figures, a filter, a search, three-stage's tree and its
pick, a tool-use conversation turn by turn, token colours, a masked span and injected tokens, the teacher's
colours and policies side by side, a page written once working offline, a live run's new group appearing."""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentroll.render.chat import load_by_class
from agentroll.tools.view.static import write_page

from . import synthetic
from . import test_head_to_head as h2h
from .browser import Browser, Page, chromium_path
from .conftest import TOKENIZER, read_records, run_cli, write_problems
from .test_agent_folders import branchy  # noqa: F401 (a fixture)
from .test_routes import group, write
from .view_support import index_of, served, sim_run, with_teacher_and_policies

pytestmark = pytest.mark.skipif(
    chromium_path() is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
)

# a sampled token's background by its probability: >= 0.9, 0.5, 0.1, 0.01, less (view.css: .tok.lp1 ... lp4)
COLOURS = ["rgba(0, 0, 0, 0)", "rgb(253, 224, 208)", "rgb(249, 176, 143)", "rgb(239, 116, 80)", "rgb(183, 28, 28)"]


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return sim_run(tmp_path_factory.mktemp("three"), "three-stage")


@pytest.fixture(scope="module")
def tools(tmp_path_factory) -> Path:
    return sim_run(tmp_path_factory.mktemp("tools"), "tool-use")


async def opened(browser: Browser, url: str) -> Page:
    page = await browser.page()
    await page.load(url)
    await page.until("document.body.dataset.ready === '1'")
    return page


async def click(page: Page, query: str, index: int = 0) -> None:
    await page.evaluate(f"document.querySelectorAll({json.dumps(query)})[{index}].click()")


async def set_value(page: Page, query: str, value: Any, event: str = "change") -> None:
    field = "checked" if isinstance(value, bool) else "value"
    await page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(query)}); e.{field} = {json.dumps(value)}; "
        f"e.dispatchEvent(new Event({json.dumps(event)})); }})()"
    )


async def rows_shown(page: Page) -> int:
    return int(await page.evaluate("document.querySelectorAll('#list tbody tr').length"))


TOKENS = """((kind, k) => [...document.querySelectorAll(`.record[data-k] .tokens[data-kind=${kind}]`)][k || 0]
  .querySelectorAll('.tok'))"""


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_list_a_filter_a_search_and_three_stages_tree_with_its_token_colours(three):
    records = read_records(three)
    index = index_of(three)
    tokenizer = load_by_class(TOKENIZER)

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, url)
            seen: dict[str, Any] = {"rows": await rows_shown(page)}
            seen["heads"] = await page.evaluate("[...document.querySelectorAll('#list th')].map(t => t.textContent)")
            await set_value(page, "#f-trunc", True)
            seen["truncated"] = await rows_shown(page)
            await set_value(page, "#f-stage", "rewriter")
            seen["truncated_rewriters"] = await rows_shown(page)
            await set_value(page, "#f-stage", "")
            await set_value(page, "#f-trunc", False)
            await set_value(page, "#f-q", "judgment: 2", "input")
            await page.until("document.querySelector('#pager').textContent.includes('matching')")
            seen["searched"] = await page.evaluate(
                "[...document.querySelectorAll('#list tbody tr')].map(r => +r.dataset.n)"
            )
            await set_value(page, "#f-q", "", "input")
            await page.until(f"document.querySelectorAll('#list tbody tr').length === {len(index.rows)}")
            await click(page, f"#list tbody tr[data-n='{target}']")
            await page.until("!!document.querySelector('.execution .card') && !!document.querySelector('.record')")
            seen["tree"] = await page.evaluate(
                """[...document.querySelectorAll('.execution')].map(e => ({
                    stages: [...e.querySelectorAll('.stage > h4')].map(h => h.textContent),
                    cards: [...e.querySelectorAll('.card')].map(c => c.querySelector('.label').textContent),
                    marks: [...e.querySelectorAll('.card .mark')].map(m => m.textContent.trim())}))"""
            )
            await click(page, ".execution .card", picked_at)
            await page.until(f"!!document.querySelector('.record[data-at=\"{picked_at}\"]')")
            seen["tokens"] = await page.evaluate(
                f"[...{TOKENS}('response')].map(t => [t.textContent, getComputedStyle(t).backgroundColor, t.className])"
            )
            await page.evaluate(
                f"{TOKENS}('response')[{lowest}].dispatchEvent(new MouseEvent('mouseover', {{bubbles: true}}))"
            )
            seen["tip"] = await page.evaluate("document.querySelector('#tip').textContent")
            seen["copy"] = await page.evaluate(
                "[...document.querySelectorAll('.record .copy')].map(b => b.dataset.copy)"
            )
            seen["shot"] = await page.screenshot(height=1400)
            seen["requests"], seen["errors"] = page.requests, page.errors
            return seen

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        # a group whose selector picked a rewrite, and a rewrite it picked (the record shown token by token)
        target = next(r["n"] for r in index.rows if r["tags"].get("candidate right, pick right"))
        data = index.group(target)
        first = data["executions"][0]["records"]
        picked_at = next(i for i, r in enumerate(first) if r["mark"])
        lps = first[picked_at]["tokens"]["lp"]
        lowest = min(range(len(lps)), key=lambda i: lps[i])
        seen = run(go(server.url or ""))
    assert seen["rows"] == len(index.rows) == 12
    labels = [f["label"] for f in index.status()["system"]["figures"]]
    assert seen["heads"][2 : 2 + len(labels)] == labels  # the system's figures, under its names
    groups = {r["problem_id"] for r in records if r["status"] == "truncated"}
    assert seen["truncated"] == len(groups) > 0
    rewriters = {r["problem_id"] for r in records if r["status"] == "truncated" and r["stage"] == "rewriter"}
    assert seen["truncated_rewriters"] == len(rewriters) < seen["truncated"]
    assert seen["searched"] == index.search("judgment: 2")[0] and 0 < len(seen["searched"]) < 12
    for execution, shown in zip(data["executions"], seen["tree"], strict=True):
        assert shown["stages"] == [s["heading"] for s in execution["stages"]]  # solvers -> rewriters -> selector
        assert shown["stages"][0].startswith("solvers (") and shown["stages"][2].startswith("selector (shown ")
        assert shown["cards"] == [execution["records"][i]["label"] for s in execution["stages"] for i in s["records"]]
    assert "◀ picked by the selector" in seen["tree"][0]["marks"]
    picked = first[picked_at]
    record = next(r for r in records if r["rollout_id"] == picked["rollout_id"] and r["stage"] == picked["stage"]
                  and r["worker"] == picked["worker"])  # fmt: skip
    decoded = tokenizer.decode(record["response_token_ids"], skip_special_tokens=False)
    assert "".join(t[0].replace("↵\n", "\n").replace("▫", "") for t in seen["tokens"]) == decoded
    buckets = []
    for (_, colour, _), lp in zip(seen["tokens"], record["response_logprobs"], strict=True):
        p = math.exp(lp)
        bucket = 0 if p >= 0.9 else 1 if p >= 0.5 else 2 if p >= 0.1 else 3 if p >= 0.01 else 4
        assert colour == COLOURS[bucket], (lp, colour)
        buckets.append(bucket)
    assert len(set(buckets)) >= 3  # the scale was seen at work
    assert f"logprob {record['response_logprobs'][lowest]}" in seen["tip"]
    assert f"{data['where']['file']}:{picked['line']}" in seen["copy"]  # its file and line, to copy
    assert picked["rollout_id"] in seen["copy"]
    assert all(u.startswith(server.url or "") for u in seen["requests"]) and seen["errors"] == []
    assert seen["shot"][:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.bwrap  # its tool-use run calls the python tool: the local sandbox
def test_a_tool_use_conversation_turn_by_turn_with_its_calls_and_what_was_injected(tools):
    records = read_records(tools)
    index = index_of(tools)

    async def go(url: str, n: int, k: int, at: int) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, f"{url}#g={n}&r={k}.{at}")
            await page.until(f"!!document.querySelector('.record[data-at=\"{at}\"]')")
            column = f"document.querySelectorAll('.execution')[{k}]"
            return {
                "turns": await page.evaluate(f"[...{column}.querySelectorAll('.card')].map(c => c.className)"),
                "calls": await page.evaluate(f"[...{column}.querySelectorAll('.card .call')].map(c => c.textContent)"),
                "injected": await page.evaluate(f"[...{TOKENS}('injected')].map(t => t.textContent).join('')"),
                "classes": await page.evaluate(f"[...new Set([...{TOKENS}('injected')].map(t => t.className))]"),
                "errors": page.errors,
            }

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        row = next(r for r in index.rows if r["records"] > r["k"])  # a conversation of several turns
        data = index.group(row["n"])
        k = next(i for i, e in enumerate(data["executions"]) if len(e["records"]) > 1)
        execution = data["executions"][k]
        at = next(i for i, r in enumerate(execution["records"]) if r["continues"] is not None)
        seen = run(go(server.url or "", row["n"], k, at))
    earlier = execution["records"][execution["records"][at]["continues"]]
    mine = [r for r in records if r["rollout_id"] == execution["rollout_id"]]
    assert len(seen["turns"]) == len(mine) and sum("turn" in c.split() for c in seen["turns"]) == len(mine) - 1
    calls = [c for r in mine for c in r["tool_calls"] or []]
    assert len(seen["calls"]) == len(calls) and all(f"{c['name'] or '?'}(" in s and c["status"] in s
                                                    for c, s in zip(calls, seen["calls"], strict=True))  # fmt: skip
    for call in earlier["tool_calls"] or []:
        assert (call["result"] or "").splitlines()[0] in seen["injected"]  # the tool's answer, as the model read it
    assert seen["classes"] and all("injected" in c.split() for c in seen["classes"])
    assert seen["errors"] == []


def test_a_masked_span_injected_turns_and_the_whole_sequence_as_trained(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    records = synthetic.records_of(folder)
    index = index_of(folder)

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, f"{url}#g=0&r=0.0,0.1")
            await page.until("document.querySelectorAll('.record').length === 2")
            looks = "t => [t.className, getComputedStyle(t).backgroundImage]"
            seen = {
                "first": await page.evaluate(f"[...{TOKENS}('response', 0)].map({looks})"),
                "injected": await page.evaluate(f"{TOKENS}('injected').length"),
            }
            await page.evaluate(
                "[...document.querySelectorAll('.record')[1].querySelectorAll('details')]"
                ".find(d => d.textContent.startsWith('the whole sequence')).open = true"
            )
            await page.until(f"{TOKENS}('whole', 0).length > 0")
            seen["whole"] = await page.evaluate(f"[...{TOKENS}('whole', 0)].map(t => t.className)")
            seen["legend"] = await page.evaluate("document.querySelector('.legend').textContent")
            seen["errors"] = page.errors
            return seen

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        seen = run(go(server.url or ""))
    solver, critic = records[0], records[1]
    masked = [i for i, m in enumerate(solver["loss_mask"]) if not m]
    assert masked == [2]
    assert [i for i, (cls, _) in enumerate(seen["first"]) if "masked" in cls.split()] == masked
    assert "repeating-linear-gradient" in seen["first"][2][1] and seen["first"][1][1] == "none"
    assert seen["injected"] == 3  # the template's separator and the critic's message: [7, 8, 9]
    n = len(critic["prompt_token_ids"])
    assert len(seen["whole"]) == n + len(critic["response_token_ids"])
    history = [i for i, cls in enumerate(seen["whole"][:n]) if "history" in cls.split()]
    assert history == [
        i for i, m in enumerate(critic["history_mask"]) if m
    ]  # the solver's sampled tokens, less the forced one
    assert [i for i, cls in enumerate(seen["whole"][:n]) if "injected" in cls.split()] == [
        i for i, m in enumerate(critic["history_mask"]) if not m
    ]
    assert "outside the loss mask" in seen["legend"] and seen["errors"] == []


def test_a_page_written_once_works_offline_with_teacher_colours_and_policies_side_by_side(tmp_path):
    folder = with_teacher_and_policies(tmp_path / "t")
    records = synthetic.records_of(folder)
    out = tmp_path / "page.html"
    write_page(index_of(folder, follow=False), out)

    async def go() -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, out.as_uri() + "#g=0&r=1.0")
            await page.until("!!document.querySelector('.record')")
            seen = {
                "policies": await page.evaluate("[...document.querySelectorAll('.policy')].map(p => p.dataset.policy)")
            }
            seen["heads"] = await page.evaluate("[...document.querySelectorAll('#list th')].map(t => t.textContent)")
            seen["policy_figures"] = await page.evaluate(
                "[...document.querySelectorAll('.policy > .figs')].map(f => f.textContent)"
            )
            await set_value(page, "#f-mode", "teacher")
            seen["classes"] = await page.evaluate(f"[...{TOKENS}('response')].map(t => t.className)")
            await page.evaluate(
                f"{TOKENS}('response')[1].dispatchEvent(new MouseEvent('mouseover', {{bubbles: true}}))"
            )
            seen["tip"] = await page.evaluate("document.querySelector('#tip').textContent")
            await set_value(page, "#f-q", "t-1", "input")
            await page.until("document.querySelector('#pager').textContent.includes('matching')")
            seen["found"] = await rows_shown(page)
            await set_value(page, "#f-q", "nothing like this", "input")
            await page.until("document.querySelector('#pager').textContent.includes('matching “nothing')")
            seen["none"] = await rows_shown(page)
            seen["requests"], seen["errors"] = page.requests, page.errors
            return seen

    seen = run(go())
    assert seen["requests"] == [out.as_uri() + "#g=0&r=1.0"] or seen["requests"] == [out.as_uri()]
    assert seen["errors"] == [] and seen["policies"] == ["old", "new"]
    assert "mean · old" in seen["heads"] and "mean · new" in seen["heads"]
    finals = {r["sample_index"]: r["final_reward"] for r in records}
    assert [f"system {finals[k]:g}" in text for k, text in enumerate(seen["policy_figures"])] == [True, True]
    solver = next(r for r in records if r["sample_index"] == 1)  # execution 1's first record
    for cls, lp, tl in zip(seen["classes"], solver["response_logprobs"], solver["teacher_logprobs"], strict=True):
        d = abs(lp - tl)
        want = "" if d < 0.1 else "d1" if d < 0.5 else "d2" if d < 1 else "d3" if d < 2 else "d4"
        assert (want in cls.split()) if want else not any(c.startswith("d") for c in cls.split())
    assert seen["found"] == 1 and seen["none"] == 0
    tokenizer = load_by_class(TOKENIZER)
    piece = {i: json.dumps(tokenizer.decode([i])) for i in (7, 8, 9)}
    tl = solver["teacher_logprobs"][1]
    assert (
        f"teacher logprob {tl} · rank {solver['teacher_ranks'][1]} · |student − teacher| "
        f"{round(abs(solver['response_logprobs'][1] - tl), 4):g}" in seen["tip"]
    )
    assert f"top: {piece[9]} -0.2 · {piece[7]} -1.9" in seen["tip"]  # --logprobs K's alternatives, decoded
    assert f"teacher top: {piece[7]} -0.1 · {piece[8]} -2.5" in seen["tip"]


def test_a_live_runs_new_group_appears_and_tokens_are_ids_without_a_tokenizer(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)])
    index = index_of(tmp_path, tokenizer="/nowhere/tokenizer")

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, f"{url}#g=0")
            await page.until("!!document.querySelector('.record')")
            seen: dict[str, Any] = {"rows": await rows_shown(page)}
            seen["badge"] = await page.evaluate("document.querySelector('#live').textContent")
            seen["warning"] = await page.until(
                "document.querySelector('#no-tokenizer') && document.querySelector('#no-tokenizer').textContent"
            )
            seen["ids"] = await page.evaluate(f"[...{TOKENS}('response')].map(t => t.textContent)")
            writer.commit(group("c", None))
            await page.until("document.querySelectorAll('#list tbody tr').length === 3", timeout=60)
            seen["new"] = await page.evaluate("document.querySelector('#list tbody tr:last-child').className")
            writer.close(complete=True)
            seen["done"] = await page.until(
                "document.querySelector('#live').textContent === 'complete' && 'complete'", timeout=60
            )
            seen["errors"] = page.errors
            return seen

    with served(index) as server:
        assert index.wait_for(lambda i: len(i.rows) == 2, 60)
        seen = run(go(server.url or ""))
    first = index.group(0)["executions"][0]["records"][0]
    assert seen["rows"] == 2 and seen["badge"] == "following the run (not complete yet)"
    assert "no such folder" in seen["warning"] and "pass --tokenizer" in seen["warning"]
    assert seen["ids"] == [f"⟨{i}⟩" for i in first["tokens"]["id"]]
    assert "new" in seen["new"].split() and seen["done"] == "complete" and seen["errors"] == []


def test_a_folder_larger_than_the_page_holds_is_listed_by_ranges_of_groups(tmp_path):
    write(tmp_path, [group(p, None) for p in "abcde"]).close(complete=True)
    index = index_of(tmp_path, tokenizer="/nowhere/tokenizer")
    index.window = 2  # rows the page holds at once (100,000 in use: here 2, to see it page)
    shown = "[...document.querySelectorAll('#list tbody tr')].map(r => r.children[1].textContent)"

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, url)
            seen = {"first": await page.evaluate(shown)}
            seen["ranges"] = await page.evaluate(
                "[...document.querySelectorAll('#f-from option')].map(o => o.textContent)"
            )
            await set_value(page, "#f-from", "2")
            await page.until("document.querySelector('#list tbody tr')?.dataset.n === '2'")
            seen["second"] = await page.evaluate(shown)
            seen["count"] = await page.evaluate("document.querySelector('#count').textContent")
            seen["pager"] = await page.evaluate("document.querySelector('#pager').textContent")
            await set_value(page, "#f-q", "-1", "input")  # every group's second rollout id
            await page.until("document.querySelector('#pager').textContent.includes('matching')")
            seen["searched"] = await page.evaluate("document.querySelector('#pager').textContent")
            again = await opened(browser, url + "#from=4")  # a link keeps its range
            seen["last"] = await again.evaluate(shown)
            seen["errors"] = page.errors + again.errors
            return seen

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        seen = run(go(server.url or ""))
    assert seen["first"] == ["a", "b"] and seen["second"] == ["c", "d"] and seen["last"] == ["e"]
    assert seen["ranges"] == ["1 to 2", "3 to 4", "5 to 5"] and seen["count"] == "5 groups"
    assert "showing 2 of 2 groups (3 to 4 of 5)" in seen["pager"]
    assert "matching “-1”" in seen["searched"] and "(3 more in other ranges of groups)" in seen["searched"]
    assert seen["errors"] == []


def test_an_agents_calls_in_its_systems_words_continued_calls_under_theirs_and_branches_apart(request):
    folder = request.getfixturevalue("branchy")  # the agent that rewrites its history (tests/test_agent_folders.py)
    records = read_records(folder)
    index = index_of(folder)

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, f"{url}#g=0&r=0.2")
            await page.until("!!document.querySelector('.record[data-at=\"2\"]')")
            cards = "[...document.querySelectorAll('.execution')[0].querySelectorAll('.card')]"
            return {
                "heads": await page.evaluate("[...document.querySelectorAll('#list th')].map(t => t.textContent)"),
                "labels": await page.evaluate(f"{cards}.map(c => c.querySelector('.label').textContent)"),
                "turns": await page.evaluate(f"{cards}.map(c => c.classList.contains('turn'))"),
                "facts": await page.evaluate(
                    "[...document.querySelectorAll('.record .kv tr')].map(r => r.textContent)"
                ),
                "errors": page.errors,
            }

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        data = index.group(0)
        seen = run(go(server.url or ""))
    first = [r for r in records if r["rollout_id"] == data["executions"][0]["rollout_id"]]
    assert seen["labels"] == [r["label"] for r in data["executions"][0]["records"]]
    assert any("a branch off call" in label for label in seen["labels"])  # the agent system's own words
    assert seen["turns"] == [r["continues"] is not None for r in first]  # a continued call sits under its own
    assert "branches per execution" in seen["heads"] and "calls continued by ids" in seen["heads"]
    facts = " ".join(seen["facts"])
    assert f"branched_from{first[2]['branched_from']}" in facts and "agent_answer" in facts and "rerendered" in facts
    assert seen["errors"] == []


def test_a_head_to_head_runs_policies_side_by_side_with_their_own_figures(tmp_path):
    problems = write_problems(tmp_path / "problems.jsonl", 6)
    strong, weak = h2h.server(problems, "strong", 0.9), h2h.server(problems, "weak", 0.25, seed=1)
    strong.start()
    weak.start()
    try:
        made = run_cli(*h2h.policy_args(problems, tmp_path / "out", strong.url or "", weak.url or "", "-q"))
    finally:
        strong.stop()
        weak.stop()
    assert made.returncode == 0, made.stderr.decode()
    records = read_records(tmp_path / "out")
    index = index_of(tmp_path / "out")

    async def go(url: str) -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, f"{url}#g=0")
            await page.until("document.querySelectorAll('.policy').length === 2")
            cells = "[...document.querySelectorAll('#list tbody tr')].map(r => [...r.children].map(c => c.textContent))"
            found = {
                "heads": await page.evaluate("[...document.querySelectorAll('#list th')].map(t => t.textContent)"),
                "cells": await page.evaluate(cells),
                "policies": await page.evaluate("[...document.querySelectorAll('.policy')].map(p => p.dataset.policy)"),
                "columns": await page.evaluate(
                    "[...document.querySelectorAll('.policy')].map(p => p.querySelectorAll('.execution').length)"
                ),
            }
            for spread in ("mixed", "uniform"):  # each policy's group, never the two models' pooled
                await set_value(page, "#f-spread", spread)
                found[spread] = await rows_shown(page)
            await set_value(page, "#f-spread", "")
            await set_value(page, "#f-rmin", "0.75")
            found["rmin"] = await rows_shown(page)
            return {**found, "errors": page.errors}

    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        seen = run(go(server.url or ""))
    assert seen["policies"] == ["new", "old"] and seen["columns"] == [h2h.K, h2h.K] and seen["errors"] == []
    for name in ("new", "old"):
        column = seen["heads"].index(f"mean · {name}")
        for row, cells in zip(index.rows, seen["cells"], strict=True):
            finals = {
                r["rollout_id"]: r["final_reward"]
                for r in records
                if r["problem_id"] == row["id"] and r["policy"] == name
            }
            assert float(cells[column]) == pytest.approx(
                sum(finals.values()) / len(finals), abs=5e-4
            )  # shown to 3 places
    groups = {}  # (problem, policy) -> its executions' outcomes
    for r in records:
        groups.setdefault((r["problem_id"], r["policy"]), {})[r["rollout_id"]] = r["final_reward"]
    ids = {row["id"] for row in index.rows}
    mine = [[list(groups[i, p].values()) for p in ("new", "old")] for i in ids]
    assert seen["mixed"] == sum(any(len(set(g)) > 1 for g in both) for both in mine)
    assert seen["uniform"] == sum(any(len(set(g)) == 1 for g in both) for both in mine)
    assert seen["rmin"] == sum(any(sum(g) / len(g) >= 0.75 for g in both) for both in mine)


def test_the_copied_command_prints_the_record_from_a_folder_whose_path_has_quotes(tmp_path):
    """The record's "command" copy button is pasted into a shell: the shard's path must be one shell word whatever
    it holds (a folder named by a colleague, an unpacked artifact). Before, the path sat between single quotes
    as it was, so a path holding a quote broke the command, or ran what followed it."""
    folder = synthetic.three_stage(tmp_path / "bob's runs $(touch pwned)" / "out")
    out = tmp_path / "page.html"
    write_page(index_of(folder, follow=False), out)

    async def go() -> list[str]:
        async with Browser() as browser:
            page = await opened(browser, out.as_uri() + "#g=0&r=0.1")
            await page.until("!!document.querySelector('.record')")
            return await page.evaluate(
                "[...document.querySelectorAll('.record .copy')].map(b => b.dataset.copy)"
                ".filter(c => c.includes('sed'))"
            )

    (command,) = run(go())
    printed = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, check=False)
    shard = folder / "rollouts-00000.jsonl"
    assert printed.returncode == 0, printed.stderr.decode()
    assert printed.stdout.decode() == shard.read_text().splitlines(keepends=True)[1]  # record 1 of execution 0
    assert not (tmp_path / "pwned").exists()


def test_a_link_to_a_group_a_sampled_page_does_not_hold_says_so_and_how_to_see_it(three, tmp_path):
    """A `--sample` page holds some groups: a link to another (`#g=N`, pasted from a served page) says it is not
    there and names the command that serves the folder, instead of "reading group N..." for ever; a group it
    holds opens, unpacked from its compressed data."""
    out = tmp_path / "some.html"
    made = write_page(index_of(three, follow=False), out, sample=3, seed=1)
    held = sorted(random.Random(1).sample(range(12), 3))
    missing = next(n for n in range(12) if n not in held)
    assert made["groups"] == 3

    async def go() -> dict[str, Any]:
        async with Browser() as browser:
            page = await opened(browser, out.as_uri() + f"#g={missing}")
            await page.until("!!document.querySelector('main .error')")
            seen = {"missing": await page.evaluate("document.querySelector('main').textContent")}
            await click(page, f'#list tr[data-n="{held[0]}"]')
            await page.until("!!document.querySelector('.record')")
            seen["held"] = await page.evaluate("document.querySelector('main h2').textContent")
            seen["errors"] = page.errors
            return seen

    seen = run(go())
    assert (
        f"Group {missing} is not in this page: this page holds 3 groups of the folder's 12 (--sample 3)"
        in (seen["missing"])
    )
    assert f"agentroll view '{three}'" in seen["missing"] and "reading group" not in seen["missing"]
    ids = [r["problem_id"] for r in read_records(three)]
    assert seen["held"].startswith(f"problem {sorted(set(ids), key=ids.index)[held[0]]}") and seen["errors"] == []
