"""`agentroll view`: where each group lies and reading it back, the tokens as text, the rows and the group data
in the system's words (checked against the records), the server's boundaries (loopback, no file), search, a live
run followed, and the command line. The page itself, in a real browser: tests/test_view_browser.py."""

from __future__ import annotations

import base64
import gzip
import json
import random
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentroll.cli import app
from agentroll.folder import ShardWriter
from agentroll.folder.follow import placed
from agentroll.folder.places import Moved, Shelf
from agentroll.folder.shards import read_lines
from agentroll.record.parsing import last_boxed
from agentroll.render.chat import load_by_class
from agentroll.tools.view import static
from agentroll.tools.view.tokens import Decoder

from . import synthetic
from .conftest import TOKENIZER, read_records, user_env
from .test_routes import SETTINGS, crash, group, write
from .view_support import get, index_of, served, sim_run, with_teacher_and_policies

VIEW = Path(__file__).resolve().parent.parent / "agentroll" / "tools" / "view"


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    return sim_run(tmp_path_factory.mktemp("three"), "three-stage")


def lines_of(path: Path) -> dict[int, dict]:
    with open(path, "rb") as f:
        return {
            n: json.loads(line) for n, line in read_lines(f, path.name.split(".")[-1] == "zst" or ".zst." in path.name)
        }


# -- where each group lies ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_each_group_is_read_back_from_its_place_at_its_line_while_written_and_once_finished(tmp_path, compression):
    writer = write(tmp_path, [group(p, None) for p in "abcde"], compression=compression, shard_size=12)
    live = list(placed(tmp_path, follow=False))  # two finished shards and the partial one
    assert [p.problem_id for _, p, _, fresh in live if fresh] == list("abcde")
    assert any(not p.finished for _, p, _, _ in live) and any(p.finished for _, p, _, _ in live)
    shelf = Shelf()
    for _, place, records, _ in live:
        assert shelf.records(place) == records  # read back whole, from a finished shard or the one written
        assert lines_of(place.path)[place.line] == records[0]  # its line, as validate counts (zstd: decompressed)
    partial = next(p for _, p, _, _ in live if not p.finished)
    writer.close(complete=True)
    with pytest.raises(Moved, match="not there any more"):
        shelf.records(partial)  # the run finished (and renamed) that shard
    again = {p.problem_id: p for _, p, _, _ in placed(tmp_path, follow=False)}
    assert all(p.finished for p in again.values()) and set(again) == set("abcde")
    assert shelf.records(again[partial.problem_id])[0]["problem_id"] == partial.problem_id


def test_a_follower_gives_a_group_again_with_its_new_place_once_its_shard_is_finished(tmp_path):
    writer = write(tmp_path, [group("a", None)], shard_size=1000)
    stop = threading.Event()
    seen: list[tuple[str, bool, bool]] = []
    follower = placed(tmp_path, follow=True, poll_s=0.01, stop=stop)
    _, first, _, fresh = next(follower)
    seen.append((first.problem_id, first.finished, fresh))
    writer.commit(group("b", None))
    writer.close(complete=True)
    for _, place, _, fresh in follower:  # ends by itself: the folder is complete
        seen.append((place.problem_id, place.finished, fresh))
    assert seen[0] == ("a", False, True)
    assert ("b", True, True) in seen or ("b", False, True) in seen
    assert ("a", True, False) in seen  # read again from the finished shard, not fresh
    assert [p for p, _, fresh in seen if fresh] == ["a", "b"]


def test_a_place_whose_shard_was_overwritten_says_so(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)])
    crash(writer)
    (_, place, _, _), *_ = placed(tmp_path, follow=False)
    again = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    again.open()
    again.commit(group("x", None))
    again.close(complete=True)
    with pytest.raises(Moved):
        Shelf().records(place)


# -- tokens as text -------------------------------------------------------------------------------------------------


def test_the_pieces_of_a_response_join_into_its_decoding_and_a_split_character_goes_to_its_last_token():
    tokenizer = load_by_class(TOKENIZER)
    decoder = Decoder("sim", tokenizer)
    rng = random.Random(3)
    alphabet = [*"ab d\n\t{}", "é", "日本", "😀", "ß", "<|im_end|>", "\\boxed{4}"]
    for _ in range(200):
        ids = tokenizer.encode(
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))), add_special_tokens=False
        )
        ids = ids[: rng.randint(0, len(ids))] if rng.random() < 0.3 else ids  # cut inside a character too
        assert "".join(decoder.pieces(ids) or []) == tokenizer.decode(ids, skip_special_tokens=False)
    ids = tokenizer.encode("日<|im_end|>", add_special_tokens=False)
    assert len(ids) == 4 and decoder.pieces(ids) == ["", "", "日", "<|im_end|>"]  # three bytes, then EOS kept


def test_without_its_tokenizer_the_tokens_are_ids_and_the_reason_is_said():
    decoder = Decoder("/nowhere/tokenizer")
    decoder.load()
    assert decoder.pieces([1, 2]) is None and "no such folder" in (decoder.status()["error"] or "")
    assert Decoder(None).status()["error"] == "the folder's manifest names none"


# -- rows and group data, in the system's words -----------------------------------------------------------------------


def executions(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        out.setdefault(r["rollout_id"], []).append(r)
    return out


def test_rows_hold_the_systems_figures_and_labels_as_counted_from_the_records(three):
    index = index_of(three, follow=False)
    index.run()
    records = read_records(three)
    assert [r["id"] for r in index.rows] == list(dict.fromkeys(r["problem_id"] for r in records))
    labels = [f["label"] for f in index.status()["system"]["figures"]]
    assert labels == ["solver", "majority vote", "best of N", "rewriter", "selector (its pick)", "system"]
    for row in index.rows:
        mine = [r for r in records if r["problem_id"] == row["id"]]
        execs = list(executions(mine).values())
        finals = [e[0]["final_reward"] for e in execs]
        solvers = [r for r in mine if r["stage"] == "solver"]
        assert row["finals"] == finals and row["records"] == len(mine)
        assert row["truncated"] == sum(r["status"] == "truncated" for r in mine)
        assert row["pass"] == [len(finals), sum(f == 1.0 for f in finals)]  # the executions solved
        assert row["figures"]["system_accuracy"] == sum(f == 1.0 for f in finals) / len(finals)
        assert row["figures"]["solver_accuracy"] == pytest.approx(sum(r["raw_reward"] for r in solvers) / len(solvers))
        cases: Counter[str] = Counter()  # three-stage's own chart labels: a right candidate or not, a right pick or not
        for e in execs:
            picks = [r for r in e if r["stage"] == "selector"]
            if picks:
                right = any(r["raw_reward"] == 1.0 for r in e if r["listed_as"] is not None)
                good = picks[0]["raw_reward"] == 1.0
                cases[
                    f"{'candidate right' if right else 'no candidate right'}, pick {'right' if good else 'wrong'}"
                ] += 1
        assert {k: v for k, v in row["tags"].items() if "pick" in k} == dict(cases)
        assert row["checks"] == 0 and row["meta"] == {"topic": mine[0]["metadata"]["topic"]}
    shards = index.status()["shards"]
    assert [index.rows[0]["shard"], index.rows[0]["line"]] == [0, 1] and shards[0] == "rollouts-00000.jsonl"


def test_a_groups_data_is_the_systems_tree_with_every_token(three):
    index = index_of(three, follow=False)
    index.run()
    index.decoder.load()
    records = read_records(three)
    tokenizer = load_by_class(TOKENIZER)
    picked = 0
    for number in range(len(index.rows)):
        data = index.group(number)
        mine = [r for r in records if r["problem_id"] == data["id"]]
        flat = [r for e in data["executions"] for r in e["records"]]
        assert [r["rollout_id"] for r in flat] == [r["rollout_id"] for r in mine]
        for shown, record in zip(flat, mine, strict=True):
            assert (
                shown["tokens"]["id"] == record["response_token_ids"]
                and shown["tokens"]["lp"] == record["response_logprobs"]
            )
            assert "".join(shown["tokens"]["t"]) == tokenizer.decode(
                record["response_token_ids"], skip_special_tokens=False
            )
            prompt = data["prompts"][shown["prompt"]["key"]]
            assert prompt["id"][: shown["prompt"]["n"]] == record["prompt_token_ids"]
            assert shown["answer"] == (last_boxed(record["content"]) if record["content"] else None)
            assert lines_of(three / data["where"]["file"])[shown["line"]] == record  # its file and line
        for e in data["executions"]:
            assert [s["stage"] for s in e["stages"]] == ["solver", "rewriter", "selector"]
            assert e["stages"][0]["heading"].startswith("solvers (")
            selector = next((r for r in e["records"] if r["stage"] == "selector"), None)
            chosen = [r for r in e["records"] if r["mark"] == "◀ picked by the selector"]
            if selector is not None and selector["judgment"] is not None and chosen:
                picked += 1
                assert chosen[0]["listed_as"] == selector["judgment"]
                assert f"→ rewrite {selector['judgment']} (rewriter {chosen[0]['worker']})" in selector["label"]
        assert len({tuple(p["id"]) for p in data["prompts"]}) == len(data["prompts"])  # each prompt once
    assert picked > 0


def test_a_conversations_turns_share_its_prompt_and_say_what_was_injected(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    index = index_of(folder, follow=False)
    index.run()
    records = synthetic.records_of(folder)
    data = index.group(0)
    e = data["executions"][0]
    assert [r["stage"] for r in e["records"]] == ["solver", "critic", "reviser"]
    keys = {r["prompt"]["key"] for r in e["records"]}
    assert len(keys) == 1  # one conversation: its longest prompt, each turn a prefix of it
    whole = data["prompts"][keys.pop()]["id"]
    for shown, record in zip(e["records"], records, strict=False):
        assert whole[: shown["prompt"]["n"]] == record["prompt_token_ids"]
        assert shown["prompt"]["hm"] == record["history_mask"]
    assert e["records"][0]["tokens"]["m"] == [1, 1, 0, 1, 1, 1]  # the forced token, outside the loss mask


def test_a_system_check_that_fails_is_on_the_row_and_on_its_record(three, tmp_path):
    folder = synthetic.edit(synthetic.three_stage(tmp_path / "t"), lambda rs: rs[4].update(raw_reward=0.5))
    index = index_of(folder, follow=False)
    index.run()
    assert index.rows[0]["checks"] == 2  # the pick's reward, and the outcome that is not the selector's
    records = index.group(0)["executions"][0]["records"]
    assert "final_reward 0.0 is not the selector's raw_reward (0.5)" in records[0]["findings"][0]
    assert records[4]["stage"] == "selector" and "selector raw_reward 0.5" in records[4]["findings"][0]
    assert index_of(synthetic.three_stage(tmp_path / "fine"), follow=False).rows == []  # not run: nothing yet


def test_teacher_logprobs_and_policies_are_carried_to_rows_and_tokens(tmp_path):
    folder = with_teacher_and_policies(tmp_path / "t")
    index = index_of(folder, follow=False)
    index.run()
    row = index.rows[0]
    records = synthetic.records_of(folder)
    assert row["policies"] == ["old", "new"]
    for name, k in (("old", 0), ("new", 1)):  # each policy's own figures: its executions only
        mine = [r for r in records if r["sample_index"] == k]
        assert row["by_policy"][name]["mean"] == mine[0]["final_reward"]
        assert row["by_policy"][name]["figures"]["system_accuracy"] == float(mine[0]["final_reward"] == 1.0)
        solved = len({r["rollout_id"] for r in mine if r["final_reward"] == 1.0})
        assert row["by_policy"][name]["pass"] == [len({r["rollout_id"] for r in mine}), solved]
    gaps = [abs(a - b) for r in records for a, b in zip(r["response_logprobs"], r["teacher_logprobs"], strict=True)]
    assert row["teacher"]["max"] == pytest.approx(max(gaps)) and row["teacher"]["mean"] == pytest.approx(
        sum(gaps) / len(gaps)
    )
    data = index.group(0)
    assert [e["policy"] for e in data["executions"]] == ["old", "new"]
    first = data["executions"][0]["records"][0]
    assert first["tokens"]["tl"] == records[0]["teacher_logprobs"]
    assert first["tokens"]["ttop"] == [records[0]["teacher_top_ids"], records[0]["teacher_top_logprobs"]]
    assert first["tokens"]["trank"] == records[0]["teacher_ranks"]  # beside each token, not a raw list of facts
    assert all("teacher_ranks" not in r["extra"] for e in data["executions"] for r in e["records"])
    tokenizer = load_by_class(TOKENIZER)
    assert data["vocab"] == {str(i): tokenizer.decode([i]) for i in (7, 8, 9)}  # the alternatives, decoded


def test_a_system_that_cannot_be_loaded_here_is_shown_in_generic_words_and_says_so(tmp_path):
    index = index_of(synthetic.debate(tmp_path / "d"), follow=False)
    index.run()
    system = index.status()["system"]
    assert system["name"] == "debate.py:Debate" and "left out" in system["warning"]
    assert [f["label"] for f in system["figures"]] == ["proposer", "judge", "system"]
    e = index.group(0)["executions"][0]
    assert [r["label"] for r in e["records"]] == [
        "proposer 0 · record 0",
        "proposer 1 · record 1",
        "judge 0 · record 2",
    ]
    assert [s["heading"] for s in e["stages"]] == ["proposer (2)", "judge (1)"] and e["records"][2][
        "trainable"
    ] is False


def test_an_audit_report_marks_the_records_it_names(three, tmp_path):
    records = read_records(three)
    named = records[3]
    who = {k: named[k] for k in ("problem_id", "rollout_id", "stage", "turn", "worker", "sample_index")}
    worst = {"position": 2, "token": named["response_token_ids"][2], "recorded": -1.0, "recomputed": -1.4, "delta": 0.4}
    report = {
        "model": "/ckpt", "ok": False, "tolerance": {"max_abs": 0.01}, "overall": {"records": 10},
        "failed": [{**who, "tokens": 40, "mean_abs": 0.03, "max_abs": 0.4, "share_over": 0.1, "tokens_outside": 0,
                    "worst_token": worst, "faults": [], "fails": ["max |Δ| 0.4 > 0.01"]}],
        "worst": [],
    }  # fmt: skip
    (tmp_path / "audit.json").write_text(json.dumps(report))
    index = index_of(three, audit=tmp_path / "audit.json", follow=False)
    index.run()
    row = next(r for r in index.rows if r["id"] == named["problem_id"])
    assert row["audit"] == [1, 1] and sum("audit" in r for r in index.rows) == 1
    shown = [r for e in index.group(row["n"])["executions"] for r in e["records"] if r.get("audit")]
    assert len(shown) == 1 and shown[0]["audit"]["worst_token"] == worst and shown[0]["audit"]["failed"]
    (tmp_path / "bad.json").write_text("{}")
    code, output = cli("view", str(three), "-o", str(tmp_path / "p.html"), "--audit", str(tmp_path / "bad.json"))
    assert code == 2 and "not the report of agentroll audit --json" in output


def test_the_viewer_holds_no_stage_name_of_its_own():
    names = {"solver", "rewriter", "selector", "critic", "reviser", "agent", "proposer", "judge"}
    for path in sorted(VIEW.iterdir()):
        if path.suffix in (".py", ".js", ".css"):
            words = set(re.findall(r"[a-z]+", path.read_text().lower()))
            assert not words & names, (path.name, sorted(words & names))


# -- the server -------------------------------------------------------------------------------------------------------


def test_the_server_listens_on_loopback_answers_loopback_names_only_and_serves_no_file(three):
    index = index_of(three)
    with served(index) as server:
        url = server.url or ""
        assert url.startswith("http://127.0.0.1:") and index.wait_for(lambda i: i.done.is_set(), 60)
        status, page = get(url)
        assert status == 200 and "<script>" in page and 'id="agentroll-data"' not in page
        assert get(url + "api/status", host="localhost:9999")[0] == 200  # an ssh tunnel's port
        assert get(url + "api/status", host="[::1]:80")[0] == 200
        assert get(url + "api/status", host="rebound.example.com")[0] == 403  # a DNS rebinding page
        for path in ("../../../etc/passwd", "%2e%2e/%2e%2e/etc/passwd", "manifest.json", "rollouts-00000.jsonl",
                     "view.js", "api/group?n=../../etc/passwd", "api/raw?n=0&at=x", "api/group?n=-1"):  # fmt: skip
            status, _ = get(url + path)
            assert status in (400, 404), path
        assert get(url + "api/group?n=999")[0] == 404
        status, raw = get(url + "api/raw?n=1&at=2")
        assert status == 200 and lines_of(three / raw["file"])[raw["line"]] == raw["record"]


def test_search_finds_the_groups_whose_text_holds_the_query_and_nothing_else(three):
    index = index_of(three, follow=False)
    index.run()
    records = read_records(three)
    texts = {"response", "content", "reward_info", "label", "problem", "metadata", "tool_calls"}

    def expected(query: str) -> list[int]:
        hit = {
            r["problem_id"]
            for r in records
            if any(query.casefold() in (v if isinstance(v, str) else json.dumps(v)).casefold()
                   for k, v in r.items() if k in texts and v is not None)
            or query.casefold() in r["problem_id"].casefold()
        }  # fmt: skip
        return [row["n"] for row in index.rows if row["id"] in hit]

    queries = ("\\boxed{21}", "JUDGMENT: 2", "What is 14 plus", "no answer", "addition", "p011", "nothing like it")
    for query in queries:
        assert index.search(query) == (expected(query), False), query
    assert [bool(expected(q)) for q in queries] == [True] * 6 + [False]  # each query meant something
    assert 0 < len(index.search("judgment: 2")[0]) < len(index.rows)
    token = str(records[0]["response_token_ids"][0])
    assert index.search(f"[{token},") == ([], False)  # token ids are not text
    assert index.search("日本") == ([], False)
    assert index.search("what is", most=3) == (expected("what is")[:3], True)  # a common word: the first ones


def test_a_live_run_is_followed_its_groups_listed_as_written_then_moved_to_the_finished_shard(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)])
    index = index_of(tmp_path, tokenizer="/nowhere")
    with served(index) as server:
        url = server.url or ""
        assert index.wait_for(lambda i: len(i.rows) == 2, 60)
        status, rows = get(url + "api/rows")
        assert status == 200 and [r["id"] for r in rows["rows"]] == ["a", "b"] and all(r["live"] for r in rows["rows"])
        assert get(url + "api/status")[1]["live"] is True
        writer.commit(group("c", None))
        assert index.wait_for(lambda i: len(i.rows) == 3, 60)
        status, more = get(url + "api/rows?start=2")
        assert [r["id"] for r in more["rows"]] == ["c"] and more["groups"] == 3
        writer.close(complete=True)
        assert index.wait_for(lambda i: i.done.is_set() and len(i.moved) == 3, 60)
        status, after = get(url + "api/rows?start=3&moved=0")
        assert sorted(r["id"] for r in after["moved"]) == ["a", "b", "c"] and not any(r["live"] for r in after["moved"])
        status, data = get(url + "api/group?n=2")  # read back from its finished shard
        assert status == 200 and data["id"] == "c" and data["where"]["file"] == "rollouts-00000.jsonl"
        assert data["executions"][0]["records"][0]["tokens"]["t"] is None  # no tokenizer: ids only
        status, final = get(url + "api/status")
        assert final["live"] is False and "no such folder" in final["tokenizer"]["error"]


def test_an_overwritten_folder_starts_the_list_over(tmp_path):
    writer = write(tmp_path, [group("a", None)])
    index = index_of(tmp_path, tokenizer="/nowhere")
    with served(index):
        assert index.wait_for(lambda i: len(i.rows) == 1, 60)
        crash(writer)
        again = ShardWriter(tmp_path, SETTINGS, overwrite=True)
        again.open()
        again.commit(group("x", None))
        again.commit(group("y", None))
        assert index.wait_for(lambda i: i.generation == 1 and [r["id"] for r in i.rows] == ["x", "y"], 60)
        again.close(complete=True)


# -- the command line --------------------------------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"HF_HUB_OFFLINE": "1"})
    return result.exit_code, result.output


def inlined(page: Path) -> dict:
    text = page.read_text()
    start = text.index('id="agentroll-data">') + len('id="agentroll-data">')
    return json.loads(text[start : text.index("</script>", start)])


def test_a_page_written_once_holds_its_groups_or_a_sample(three, tmp_path, monkeypatch):
    count = len(read_records(three))
    code, output = cli("view", str(three), "-o", str(tmp_path / "all.html"))
    assert code == 0 and f"12 groups, {count} records -> {tmp_path / 'all.html'}" in output.replace("\n", "")
    data = inlined(tmp_path / "all.html")
    assert len(data["rows"]) == 12 and sorted(data["groups"], key=int) == [str(n) for n in range(12)]
    index = index_of(three, follow=False)
    index.run()
    index.decoder.load()
    for row in data["rows"]:  # each group gzip-compressed in base64, unpacked by the page when it is opened
        held = json.loads(gzip.decompress(base64.b64decode(data["groups"][str(row["n"])])))
        group, pieces = held["group"], held["pieces"]
        assert group["n"] == row["n"] and group["id"] == row["id"]
        assert sum(len(e["records"]) for e in group["executions"]) == row["records"]
        whole = index.group(row["n"])  # the pieces by id, and those apart, give every token's text back
        for ours, theirs in zip(group["executions"], whole["executions"], strict=True):
            for mine, real in zip(ours["records"], theirs["records"], strict=True):
                texts = [pieces[str(t)] for t in mine["tokens"]["id"]]
                for i, piece in mine["tokens"]["tx"]:
                    texts[i] = piece
                assert texts == real["tokens"]["t"] and "t" not in mine["tokens"]
    text = (tmp_path / "all.html").read_text()
    assert (
        data["status"]["live"] is False
        and "<" not in text[text.index('id="agentroll-data">') + 20 : text.rindex("</script><script>")]
    )
    code, output = cli("view", str(three), "-o", str(tmp_path / "some.html"), "--sample", "3", "--seed", "1")
    assert code == 0 and "3 groups (a sample of 12)" in output.replace("\n", "")
    some = inlined(tmp_path / "some.html")
    chosen = sorted(random.Random(1).sample(range(12), 3))
    assert [r["n"] for r in some["rows"]] == chosen and some["sample"] == {"n": 3, "of": 12, "seed": 1}
    monkeypatch.setattr(static, "MOST_RECORDS", 100)
    code, output = cli("view", str(three), "-o", str(tmp_path / "big.html"))
    assert code == 2 and f"holds {count} records" in output and "--sample N" in output
    assert not (tmp_path / "big.html").exists()


@pytest.mark.parametrize(
    "args, code, said",
    [
        (["-o", "X", "--port", "0"], 2, "give one of them"),
        (["--sample", "2"], 2, "picks the groups of a page written with -o"),
        (["-o", "NOWHERE/p.html"], 6, "cannot write the page (no folder"),
        (["-o", "X", "--sample", "0"], 2, "--sample 0: must be 1 or more"),
    ],
)
def test_view_refuses_bad_usage_in_one_line(three, tmp_path, args, code, said):
    done, output = cli(
        "view",
        str(three),
        *[a.replace("X", str(tmp_path / "p.html")).replace("NOWHERE", str(tmp_path / "no")) for a in args],
    )
    assert done == code and said in " ".join(output.split()), output


def test_view_of_a_missing_folder_is_one_line_and_exit_6(tmp_path):
    code, output = cli("view", str(tmp_path / "nowhere"))
    assert code == 6 and output.strip() == f"error: {tmp_path / 'nowhere'}: no such folder"


def test_view_serves_until_sigterm_and_exits_0(three):
    process = subprocess.Popen(
        [sys.executable, "-m", "agentroll", "view", str(three), "--port", "0", "--tokenizer", TOKENIZER],
        stderr=subprocess.PIPE, text=True, env=user_env(),
    )  # fmt: skip
    try:
        line = process.stderr.readline() if process.stderr else ""
        url = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert url, line
        status, found = get(url.group(1) + "api/status")
        assert status == 200 and found["folder"] == str(three)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()
        if process.stderr:
            process.stderr.close()


def test_a_run_that_ended_without_completing_is_shown_as_far_as_it_went_and_said(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)])
    writer.close(complete=False)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["last_run"]["exit"] = {"code": 8, "reason": "1 group could not be produced"}  # as the runner records it
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    index = index_of(tmp_path, tokenizer="/nowhere")
    with served(index) as server:
        assert index.wait_for(lambda i: i.done.is_set(), 60)
        status = get((server.url or "") + "api/status")[1]
    assert [r["id"] for r in index.rows] == ["a", "b"] and status["error"] is None and status["live"] is False
    assert "ended with exit 8 (1 group could not be produced) before completing" in status["ended"]
    (tmp_path / "file").write_text("x")
    code, output = cli("view", str(tmp_path / "file"))
    assert code == 6 and "is a file, not a folder" in output
