"""The output folder as one owner (agentroll.folder): each defect the review found, reproduced, then held."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

import agentroll
from agentroll.cli import app
from agentroll.errors import OutputError
from agentroll.folder import Layout, Manifest, ShardWriter, consumed, merge, read_groups, read_records
from agentroll.record.group import Group

from .conftest import TOKENIZER, run_cli
from .test_routes import SETTINGS, Model, assert_same, crash, group, write

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def renamed(g: Group, pid: str) -> Group:
    """The same calls (prompt ids, routes) under another problem id."""
    problem = dataclasses.replace(g.problem, id=pid, content_hash=f"h-{pid}")
    executions = [[dataclasses.replace(s, problem_id=pid, problem_hash=f"h-{pid}") for s in e] for e in g.executions]
    return Group(problem, executions)


def finished(folder: Path, pids: list[str], **kwargs) -> Path:
    writer = write(folder, [group(p, None) for p in pids], **kwargs)
    writer.close(complete=True)
    return folder


# -- 1. --overwrite starts over for consumers too ---------------------------------------------------------------


def test_overwrite_resets_consumer_positions(tmp_path):
    finished(tmp_path, ["a", "b", "c"])
    taken = read_groups(tmp_path, consumer="trainer")
    assert [next(taken).problem_id for _ in range(3)] == ["a", "b", "c"]
    taken.close()
    assert consumed(tmp_path, "trainer") == 2  # the third counts once the next is asked for
    writer = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    writer.open()
    for pid in ("x", "y"):
        writer.commit(group(pid, None))
    writer.close(complete=True)
    assert consumed(tmp_path, "trainer") == 0
    assert [g.problem_id for g in read_groups(tmp_path, consumer="trainer")] == ["x", "y"]


def test_a_position_of_another_dataset_counts_for_none(tmp_path):
    finished(tmp_path, ["a", "b"])
    Layout(tmp_path).consumers.mkdir()
    Layout(tmp_path).consumer("old").write_bytes(orjson.dumps({"groups": 2, "folder_id": "elsewhere"}))
    assert consumed(tmp_path, "old") == 0
    assert [g.problem_id for g in read_groups(tmp_path, consumer="old")] == ["a", "b"]


def test_a_follower_across_an_overwrite_sees_the_new_groups(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)])
    follower = read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60)
    assert [next(follower).problem_id, next(follower).problem_id] == ["a", "b"]
    crash(writer)
    again = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    again.open()
    for pid in ("a", "b", "c"):  # regenerated: the same problem ids, new rollouts
        again.commit(group(pid, None))
    again.close(complete=True)
    assert [g.problem_id for g in follower] == ["a", "b", "c"]


# -- 2. follow works on merged folders ----------------------------------------------------------------------


def test_follow_reads_a_merged_folder(tmp_path):
    finished(tmp_path / "p0", ["a", "b"])
    finished(tmp_path / "p1", ["c"])
    merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all")
    followed = [g.problem_id for g in read_groups(tmp_path / "all", follow=True, poll_s=0.01, timeout_s=60)]
    assert followed == ["a", "b", "c"]


# -- 3. no stray temporary file is ever taken for a shard -------------------------------------------------------


def test_a_temporary_left_while_joining_frames_is_removed_not_taken_for_a_shard(tmp_path):
    writer = write(tmp_path, [group("a", None), group("b", None)], compression="zstd")
    crash(writer)
    stray = tmp_path / "rollouts-00000.jsonl.zst.partial.tmp"
    stray.write_bytes(b"\x28\xb5\x2f\xfd half a frame")  # the kill came while the joined frame was written
    older = tmp_path / "rollouts-00007.jsonl.tmp"  # and one no join would overwrite
    older.write_bytes(b"{")
    again = ShardWriter(tmp_path, SETTINGS, compression="zstd")
    assert set(again.open()) == {"a", "b"}
    again.close(complete=True)
    assert not stray.exists() and not older.exists()
    assert [g.problem_id for g in read_groups(tmp_path)] == ["a", "b"]
    assert sorted(p.name for p in tmp_path.glob("rollouts-*")) == ["rollouts-00000.jsonl.zst"]


# -- 4. a damaged complete folder raises in follow mode -----------------------------------------------------------


def test_following_a_complete_folder_with_a_damaged_shard_raises(tmp_path):
    finished(tmp_path, ["a", "b", "c"], shard_size=6)
    shard = tmp_path / "rollouts-00000.jsonl"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 40])
    with pytest.raises(OutputError, match="damaged"):
        list(read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60))
    with pytest.raises(OutputError, match="damaged"):
        list(read_groups(tmp_path))


def test_following_a_complete_folder_without_its_routes_sidecar_raises(tmp_path):
    write(tmp_path, [group("a", Model()), group("b", Model())]).close(complete=True)
    (tmp_path / "rollouts-00000.routes").unlink()
    with pytest.raises(OutputError):
        list(read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60, routes=True))


def test_following_a_complete_folder_whose_shard_was_moved_away_raises(tmp_path):
    finished(tmp_path, ["a", "b", "c"], shard_size=6)
    (tmp_path / "rollouts-00001.jsonl").rename(tmp_path / "elsewhere.jsonl")
    with pytest.raises(OutputError, match="not there"):
        list(read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60))


# -- 5. every folder tool gives one line and exit 6 on a broken folder ---------------------------------------------


@pytest.mark.parametrize("command", [["stats"], ["inspect"], ["convert", "--to", "trl", "-o", "OUT"], ["validate"]])
def test_folder_tools_say_a_moved_shard_in_one_line_with_exit_6(tmp_path, command):
    folder = finished(tmp_path / "f", ["a", "b", "c"], shard_size=6)
    (folder / "rollouts-00000.jsonl").rename(tmp_path / "moved.jsonl")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    code, output = cli(args[0], str(folder), *args[1:])
    assert code == 6, output
    assert "Traceback" not in output and "rollouts-00000.jsonl" in output


@pytest.mark.parametrize(
    "command", [["stats"], ["inspect"], ["convert", "--to", "trl", "-o", "OUT"], ["merge", "-o", "OUT"]]
)
@pytest.mark.parametrize("damage", ["no settings", "no file", "not json"])
def test_folder_tools_say_a_broken_manifest_in_one_line_with_exit_6(tmp_path, command, damage):
    folder = finished(tmp_path / "f", ["a"])
    manifest = json.loads((folder / "manifest.json").read_text())
    if damage == "no settings":
        del manifest["settings"]
    elif damage == "no file":
        del manifest["shards"][0]["file"]
    text = "{not json" if damage == "not json" else json.dumps(manifest)
    (folder / "manifest.json").write_text(text)
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    code, output = cli(args[0], str(folder), *args[1:])
    assert code == 6, output
    assert "Traceback" not in output and "manifest.json" in output
    assert len([line for line in output.splitlines() if line.strip()]) == 1, output


# -- 6. --overwrite works on an unreadable manifest ------------------------------------------------------------


def test_overwrite_recovers_a_folder_whose_manifest_is_unreadable(tmp_path):
    finished(tmp_path, ["a", "b"])
    (tmp_path / "manifest.json").write_bytes(b"\x00garbage")
    with pytest.raises(OutputError, match="--overwrite"):
        ShardWriter(tmp_path, SETTINGS).open()
    writer = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    assert writer.open() == {}
    writer.commit(group("z", None))
    writer.close(complete=True)
    assert [g.problem_id for g in read_groups(tmp_path)] == ["z"]


# -- 7. prompt routes are shared only when their bytes are equal ----------------------------------------------------


def test_two_calls_on_one_prompt_routed_differently_keep_their_own_prompt_routes(tmp_path):
    first = group("a", Model(seed=1))
    second = renamed(group("a", Model(seed=2)), "b")  # the same prompt ids after a weight change: other routes
    write(tmp_path, [first, second]).close(complete=True)
    assert_same(list(read_records(tmp_path, routes=True)), [first, second])


def test_equal_prompt_routes_are_still_stored_once(tmp_path):
    model = Model()
    write(tmp_path, [group("a", model)]).close(complete=True)
    shared = [r["routed_experts"]["prompt"] for r in read_records(tmp_path) if r["stage"] == "solver"]
    assert len({tuple(span) for span in shared}) == 1 and len(shared) == 4


# -- merge ----------------------------------------------------------------------------------------------------


def test_merge_adds_up_the_parts_run_stats(tmp_path):
    for name, problems in (("p0", 3), ("p1", 5)):
        writer = write(tmp_path / name, [group(f"{name}-{i}", None) for i in range(problems)])
        writer.run_info = {"stats": {"problems": problems, "groups_written": problems}, "requests": {"requests": 10}}
        writer.close(complete=True)
    merged = merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all")
    assert merged.last_run["stats"]["problems"] == 8 and merged.last_run["stats"]["groups_written"] == 8
    assert merged.last_run["requests"]["requests"] == 20
    assert Manifest.load(tmp_path / "all").last_run["stats"]["problems"] == 8


def test_merge_refuses_a_part_whose_run_did_not_complete_unless_allowed(tmp_path):
    finished(tmp_path / "p0", ["a"])
    write(tmp_path / "p1", [group("b", None)]).close(complete=False)
    code, output = cli("merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "-o", str(tmp_path / "all"))
    assert code == 6 and "did not complete" in output and "--allow-incomplete" in output
    assert not (tmp_path / "all" / "manifest.json").exists()
    code, output = cli(
        "merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "-o", str(tmp_path / "all"), "--allow-incomplete"
    )
    assert code == 0, output
    merged = Manifest.load(tmp_path / "all")
    assert not merged.complete
    assert [m["complete"] for m in merged.merged_from or []] == [True, False]


def test_merge_can_be_redone_with_overwrite_but_never_over_a_run(tmp_path):
    finished(tmp_path / "p0", ["a"])
    write(tmp_path / "p1", [group("b", None)]).close(complete=False)
    parts = [str(tmp_path / "p0"), str(tmp_path / "p1")]
    assert cli("merge", *parts, "-o", str(tmp_path / "all"), "--allow-incomplete", "--copy")[0] == 0
    again = ShardWriter(tmp_path / "p1", SETTINGS)  # the part is finished later
    again.open()
    again.commit(group("c", None))
    again.close(complete=True)
    code, output = cli("merge", *parts, "-o", str(tmp_path / "all"))
    assert code == 6 and "--overwrite" in output
    code, output = cli("merge", *parts, "-o", str(tmp_path / "all"), "--overwrite", "--copy")
    assert code == 0, output
    assert Manifest.load(tmp_path / "all").complete
    assert [g.problem_id for g in read_groups(tmp_path / "all")] == ["a", "b", "c"]
    code, output = cli("merge", str(tmp_path / "p0"), "-o", str(tmp_path / "p1"), "--overwrite")
    assert code == 6 and "not a merge" in output


@pytest.mark.parametrize("copy", [[], ["--copy"]])
@pytest.mark.parametrize("damage", ["moved", "sha256"])
def test_merge_overwrite_checks_the_new_parts_before_it_replaces_the_earlier_merge(tmp_path, copy, damage):
    finished(tmp_path / "p0", ["a"])
    finished(tmp_path / "p1", ["b", "c"])
    parts = [str(tmp_path / "p0"), str(tmp_path / "p1")]
    assert cli("merge", *parts, "-o", str(tmp_path / "all"), *copy)[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "all").iterdir() if p.is_file()}
    shard = tmp_path / "p1" / "rollouts-00000.jsonl"
    if damage == "moved":
        shard.rename(tmp_path / "elsewhere.jsonl")
    else:
        shard.write_bytes(shard.read_bytes().replace(b'"c"', b'"x"'))
    code, output = cli("merge", *parts, "-o", str(tmp_path / "all"), "--overwrite", "--verify", *copy)
    assert code == 6 and "rollouts-00000.jsonl" in output, output
    assert {p.name: p.read_bytes() for p in (tmp_path / "all").iterdir() if p.is_file()} == before


# -- the folder's edges ------------------------------------------------------------------------------------------


def test_an_output_that_is_a_file_is_said_in_our_words(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(OutputError, match="afile is a file, not a folder"):
        ShardWriter(afile, SETTINGS).open()
    assert afile.read_text() == "mine"


def test_demo_refuses_a_folder_it_did_not_make_whatever_the_model_was_called(tmp_path):
    folder = tmp_path / "made-by-generate"
    writer = ShardWriter(folder, {**SETTINGS, "model": "agentroll-sim"})  # generate against serve-sim
    writer.open()
    writer.commit(group("a", None))
    writer.close(complete=True)
    code, output = cli("demo", "-o", str(folder), "-q")
    assert code == 6 and "demo writes only into a new or empty folder" in output
    assert [g.problem_id for g in read_groups(folder)] == ["a"]


def test_demo_runs_again_in_its_own_folder(tmp_path):
    folder = tmp_path / "demo"
    assert cli("demo", "-o", str(folder), "-q")[0] == 0
    assert Layout(folder).demo_marker.exists()
    first = Manifest.load(folder).folder_id
    assert cli("demo", "-o", str(folder), "-q")[0] == 0
    assert Manifest.load(folder).folder_id != first and Manifest.load(folder).complete


def test_layout_tells_shards_from_strays(tmp_path):
    names = [
        "rollouts-00000.jsonl",
        "rollouts-00001.jsonl.zst",
        "rollouts-00002.jsonl.partial",
        "rollouts-00000.routes",
        "rollouts-00002.routes.partial",
        "rollouts-00003.jsonl.zst.partial.tmp",
        "rollouts-00004.jsonl.tmp",
        "rollouts-x.jsonl",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    layout = Layout(tmp_path)
    assert [p.name for p in layout.finished()] == ["rollouts-00000.jsonl", "rollouts-00001.jsonl.zst"]
    assert [p.name for p in layout.partials()] == ["rollouts-00002.jsonl.partial"]
    assert [p.name for p in layout.strays()] == [
        "rollouts-00003.jsonl.zst.partial.tmp",
        "rollouts-00004.jsonl.tmp",
        "rollouts-x.jsonl",
    ]
    assert os.path.basename(layout.keys("rollouts-00001.jsonl.zst")) == "rollouts-00001.keys"


def test_the_public_readers_are_the_folder_packages(tmp_path):
    assert agentroll.read_groups is read_groups and agentroll.read_records is read_records


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_input_is_said_in_one_line_naming_the_file_with_exit_3(sim, tmp_path, content):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    code, output = cli(
        "generate", str(empty), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "-q"
    )
    assert code == 3, output
    assert str(empty) in output and "empty" in output
    assert not (tmp_path / "out").exists()  # checked before the folder is touched


def generated(sim, problems: Path, out: Path, *extra: str) -> tuple[int, str]:
    return cli("generate", str(problems), "-o", str(out), "--base-url", sim.url, "--tokenizer", TOKENIZER, "-q", *extra)


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("content", ["", "\n \n", '{"prompt": "What is 1 plus', '{"id": "x"}\n'])
def test_an_empty_or_bad_input_leaves_an_existing_folder_as_it_was(sim, problems, tmp_path, content, overwrite):
    out = tmp_path / "out"
    assert generated(sim, problems, out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    code, output = generated(sim, bad, out, *overwrite)
    assert code == 3, output
    assert str(bad) in output
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert Manifest.load(out).complete and len(list(read_groups(out))) == 8


def test_an_input_that_cannot_be_read_leaves_the_output_folder_untouched(sim, tmp_path):
    misnamed = tmp_path / "rows.parquet"
    misnamed.write_text('{"prompt": "What is 1 plus 1?", "label": "2"}\n')
    code, output = cli(
        "generate", str(misnamed), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER, "-q"
    )
    assert code == 3 and "does not start as a Parquet file" in output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_rows_none_of_which_can_be_read_under_skip_invalid_leave_an_existing_folder_as_it_was(
    sim, problems, tmp_path, overwrite
):
    out = tmp_path / "out"
    assert generated(sim, problems, out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    wrong = tmp_path / "wrong-key.jsonl"  # a dataset whose prompt is under another key: every row refused
    wrong.write_text('{"question": "What is 1+1?", "label": "2"}\n{"question": "2+2?", "label": "4"}\n')
    code, output = generated(sim, wrong, out, "--skip-invalid", *overwrite)
    assert code == 3 and "every row read (2) was invalid" in output, output
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert Manifest.load(out).complete and len(list(read_groups(out))) == 8


def test_a_first_row_clashing_with_a_done_id_leaves_a_complete_folder_as_it_was(sim, problems, tmp_path):
    out = tmp_path / "out"
    assert generated(sim, problems, out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    first = json.loads(problems.read_text().splitlines()[0])
    clash = tmp_path / "clash.jsonl"
    clash.write_text(json.dumps({**first, "label": str(first["label"]) + "0"}) + "\n")
    code, output = generated(sim, clash, out)
    assert code == 3 and "is already in the output folder" in output, output
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # still complete, untouched


def test_the_summary_counts_invalid_rows_apart_from_the_problems(sim, problems, tmp_path):
    """Five rows, four of them bad, under --skip-invalid: one problem and four invalid rows, not "problems 5 ...
    invalid rows 4" (the bad rows counted twice, as problems and as invalid)."""
    first = problems.read_text().splitlines()[0]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(first + "\n" + '{"question": "What is 1+1?", "label": "2"}\n' * 3 + "not json\n")
    done = run_cli("generate", str(rows), "-o", str(tmp_path / "out"), "--base-url", sim.url,
                   "--tokenizer", TOKENIZER, "--skip-invalid", "--samples-per-prompt", "2")  # fmt: skip
    said = " ".join(done.stderr.decode().split())
    assert done.returncode == 0, said
    assert "problems 1 (already done 0), invalid rows 4" in said
    assert Manifest.load(tmp_path / "out").last_run["stats"]["invalid_rows"] == 4
