"""A damaged folder is never read short without a word: every reader (plain, follow, records, the torch dataset,
and so every folder tool) checks a finished shard against its manifest entry, and says what is wrong in one line
(`OutputError`, exit 6) naming the file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from agentroll.cli import app
from agentroll.errors import OutputError
from agentroll.folder import Layout, ShardWriter, merge, read_groups, read_records
from agentroll.folder.shards import shard_groups

from .test_routes import SETTINGS, Model, group, write

runner = CliRunner()
PIDS = [f"p{i:02d}" for i in range(21)]


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def finished(folder: Path, pids: list[str], **kwargs) -> Path:
    write(folder, [group(p, None) for p in pids], **kwargs).close(complete=True)
    return folder


def cut_after_groups(shard: Path, groups: int) -> None:
    """Keep the shard's first `groups` whole groups: what a copy cut short leaves, every line whole."""
    ends = [end for end, _ in shard_groups(shard.read_bytes(), False)]
    shard.write_bytes(shard.read_bytes()[: ends[groups - 1]])


def drop_last_lines(shard: Path, lines: int) -> None:
    kept = shard.read_bytes().split(b"\n")[:-1][:-lines]
    shard.write_bytes(b"\n".join(kept) + b"\n")


@pytest.fixture
def cut(tmp_path: Path) -> Path:
    """A complete 21-group folder whose one shard holds only its first 10 groups."""
    folder = finished(tmp_path / "f", PIDS)
    cut_after_groups(folder / "rollouts-00000.jsonl", 10)
    return folder


# -- 1. a shard that is not what the manifest says ------------------------------------------------------------------


def test_the_plain_reader_refuses_a_shard_cut_after_whole_groups(cut):
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl.*manifest"):
        list(read_groups(cut))


def test_the_follow_reader_refuses_a_shard_cut_after_whole_groups(cut):
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl.*manifest"):
        list(read_groups(cut, follow=True, poll_s=0.01, timeout_s=60))


def test_read_records_refuses_a_shard_missing_its_last_lines(tmp_path):
    folder = finished(tmp_path, ["a", "b", "c"])
    drop_last_lines(folder / "rollouts-00000.jsonl", 3)
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl.*manifest"):
        list(read_records(folder))


def test_a_shard_of_the_right_size_with_a_record_too_few_is_caught_by_its_counts(tmp_path):
    folder = finished(tmp_path, ["a", "b"])
    shard = folder / "rollouts-00000.jsonl"
    lines = shard.read_bytes().split(b"\n")[:-1]
    lines[-1] = b" " * len(lines[-1])  # the same bytes, one record fewer (blank lines are skipped)
    shard.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(OutputError, match="records where"):
        list(read_records(folder))
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl"):
        list(read_groups(folder))


def test_a_merged_view_of_a_cut_part_is_refused(tmp_path):
    finished(tmp_path / "p0", ["a", "b", "c"])
    finished(tmp_path / "p1", ["d", "e"])
    merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all")
    cut_after_groups(tmp_path / "p1" / "rollouts-00000.jsonl", 1)
    for follow in (False, True):
        with pytest.raises(OutputError, match=r"p1/rollouts-00000\.jsonl"):
            list(read_groups(tmp_path / "all", follow=follow, poll_s=0.01, timeout_s=60))


@pytest.mark.parametrize("command", [["stats"], ["inspect"], ["convert", "--to", "trl", "-o", "OUT"], ["validate"]])
def test_every_folder_tool_exits_6_on_a_cut_shard(cut, tmp_path, command):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    code, output = cli(args[0], str(cut), *args[1:])
    assert code == 6, output
    assert "Traceback" not in output and "rollouts-00000.jsonl" in output


def test_the_torch_dataset_refuses_a_shard_missing_its_last_lines(tmp_path):
    pytest.importorskip("torch")
    from agentroll.torch import RolloutDataset

    folder = finished(tmp_path, ["a", "b", "c"])
    data = RolloutDataset(folder)
    drop_last_lines(folder / "rollouts-00000.jsonl", 3)  # after the dataset was made: checked when read
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl.*manifest"):
        list(data)
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl.*manifest"):
        RolloutDataset(folder)


# -- 2. a torn line is one line naming the file and the line ----------------------------------------------------------


def tear(shard: Path, line: int) -> None:
    """Replace line `line` (1-based) by a torn one of the same length: the shard keeps its size."""
    lines = shard.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1][:-1] + b"\xff"
    shard.write_bytes(b"\n".join(lines))


def test_read_records_says_a_torn_line_by_file_and_line(tmp_path):
    folder = finished(tmp_path, ["a", "b"])
    tear(folder / "rollouts-00000.jsonl", 4)
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl:4: "):
        list(read_records(folder))


def test_the_torch_dataset_says_a_torn_line_by_file_and_line(tmp_path):
    pytest.importorskip("torch")
    from agentroll.torch import RolloutDataset

    folder = finished(tmp_path, ["a", "b"])
    tear(folder / "rollouts-00000.jsonl", 5)
    for trajectory in (False, True):
        with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl:5: "):
            list(RolloutDataset(folder, trajectory=trajectory))


# -- 7. a missing sidecar is said to be missing ---------------------------------------------------------------------


def test_following_without_a_listed_sidecar_says_it_is_missing(tmp_path):
    write(tmp_path, [group("a", Model()), group("b", Model())]).close(complete=True)
    (tmp_path / "rollouts-00000.routes").unlink()
    with pytest.raises(OutputError, match=r"rollouts-00000\.routes.*(missing|does not exist)") as caught:
        list(read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60, routes=True))
    assert "after byte 0" not in str(caught.value)


# -- 9. a complete folder is what its manifest lists ------------------------------------------------------------------


def test_following_a_complete_folder_reads_only_what_its_manifest_lists(tmp_path):
    finished(tmp_path, ["a", "b"])
    other = finished(tmp_path / "other", ["z"])
    (other / "rollouts-00000.jsonl").rename(tmp_path / "rollouts-00050.jsonl")
    plain = [g.problem_id for g in read_groups(tmp_path)]
    followed = [g.problem_id for g in read_groups(tmp_path, follow=True, poll_s=0.01, timeout_s=60)]
    assert plain == followed == ["a", "b"]


# -- 6. a merged view is final ----------------------------------------------------------------------------------------


def test_following_an_incomplete_merged_view_ends_after_its_groups(tmp_path):
    finished(tmp_path / "p0", ["a"])
    write(tmp_path / "p1", [group("b", None)]).close(complete=False)
    merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all", allow_incomplete=True)
    followed = read_groups(tmp_path / "all", follow=True, poll_s=0.01, timeout_s=5)
    assert [g.problem_id for g in followed] == ["a", "b"]  # no TimeoutError: nothing will ever complete it


# -- 4. a damaged keys file is rebuilt from its shard -----------------------------------------------------------------


@pytest.mark.parametrize("keys", [b'[["add-1"', b'{"a":1}', b"[[1]]", b'[["a", "h", "x"]]', b"null"])
def test_a_damaged_keys_file_is_rebuilt_from_its_shard(tmp_path, keys):
    finished(tmp_path, ["a", "b"])
    path = Layout(tmp_path).keys("rollouts-00000.jsonl")
    want = orjson.loads(path.read_bytes())
    path.write_bytes(keys)
    writer = ShardWriter(tmp_path, SETTINGS)
    assert set(writer.open()) == {"a", "b"}
    writer.close(complete=True)
    assert orjson.loads(path.read_bytes()) == want
    assert [g.problem_id for g in read_groups(tmp_path)] == ["a", "b"]


def test_a_damaged_keys_file_of_a_damaged_shard_is_one_line(tmp_path):
    finished(tmp_path, ["a", "b"])
    Layout(tmp_path).keys("rollouts-00000.jsonl").write_bytes(b"{")
    tear(tmp_path / "rollouts-00000.jsonl", 2)
    with pytest.raises(OutputError, match=r"rollouts-00000\.jsonl"):
        ShardWriter(tmp_path, SETTINGS).open()


# -- 8. a manifest that is a directory ------------------------------------------------------------------------------


def test_a_manifest_that_is_a_directory_gives_advice_that_is_true(tmp_path):
    """Not ours, so not removed: the advice is to move it away, and --overwrite says the same, deleting nothing
    (it used to be advised, and then failed with "Is a directory")."""
    finished(tmp_path, ["a"])
    manifest = Layout(tmp_path).manifest
    manifest.unlink()
    manifest.mkdir()
    (manifest / "mine.txt").write_text("kept")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match=r"manifest\.json is a directory.*move it away") as caught:
            ShardWriter(tmp_path, SETTINGS, overwrite=overwrite).open()
        assert "pass --overwrite" not in str(caught.value)
    assert (manifest / "mine.txt").read_text() == "kept"
    assert (tmp_path / "rollouts-00000.jsonl").exists()
    code, output = cli("stats", str(tmp_path))
    assert code == 6 and "is a directory" in output
    finished(tmp_path / "part", ["b"])
    for extra in ([], ["--overwrite"]):
        code, output = cli("merge", str(tmp_path / "part"), "-o", str(tmp_path), *extra)
        assert code == 6 and "is a directory" in output and "pass --overwrite" not in output, output


# -- 5. validate loads the manifest as every other tool does ----------------------------------------------------------


@pytest.mark.parametrize("damage", ["no settings", "settings not an object", "no file", "format"])
def test_validate_refuses_a_manifest_every_other_tool_refuses(tmp_path, damage):
    folder = finished(tmp_path / "f", ["a"])
    path = Layout(folder).manifest
    manifest = orjson.loads(path.read_bytes())
    if damage == "no settings":
        del manifest["settings"]
    elif damage == "settings not an object":
        manifest["settings"] = []
    elif damage == "no file":
        del manifest["shards"][0]["file"]
    else:
        manifest["format"] = "other"
    path.write_bytes(orjson.dumps(manifest))
    assert cli("stats", str(folder))[0] == 6
    code, output = cli("validate", str(folder))
    assert code == 6, output
    assert "manifest" in output and "Traceback" not in output


# -- shards without a manifest ---------------------------------------------------------------------------------------


def test_shards_without_a_manifest_are_never_taken_as_this_runs(tmp_path):
    """Their settings are unknown (K, the model, the sampling): adopting them mixed another run's groups into
    this one's, marked complete. Refused, nothing removed; --overwrite starts over."""
    finished(tmp_path, ["a", "b"])
    Layout(tmp_path).manifest.unlink()
    shard = (tmp_path / "rollouts-00000.jsonl").read_bytes()
    with pytest.raises(OutputError, match=r"holds rollout shards but no manifest\.json.*--overwrite"):
        ShardWriter(tmp_path, SETTINGS).open()
    assert (tmp_path / "rollouts-00000.jsonl").read_bytes() == shard and not Layout(tmp_path).manifest.exists()
    writer = ShardWriter(tmp_path, SETTINGS, overwrite=True)
    assert writer.open() == {}
    writer.close(complete=True)
