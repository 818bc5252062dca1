"""A row's identity is its content: new files into one folder, rows appended for cron, and a reused id."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .conftest import TOKENIZER, generations, read_records, run_cli


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows(start: int, count: int, **extra) -> list[dict]:
    return [{"prompt": f"What is {i} plus {i}?", "label": str(2 * i), **extra} for i in range(start, start + count)]


def generate(url: str, source: Path, out: Path, *extra: str):
    return run_cli(
        "generate",
        str(source),
        "-o",
        str(out),
        "--base-url",
        url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "1",
        "--samples-per-prompt",
        "2",
        "--reward",
        "exact",
        *extra,
    )


def groups_on_disk(out: Path) -> Counter:
    return Counter(r["problem_id"] for r in read_records(out) if r["stage"] == "solver")


def test_a_new_file_each_day_into_one_folder_generates_the_new_rows(sim, tmp_path):
    out = tmp_path / "out"
    monday = generate(sim.url, write(tmp_path / "mon.jsonl", rows(0, 3)), out)
    assert monday.returncode == 0, monday.stderr.decode()
    tuesday = generate(sim.url, write(tmp_path / "tue.jsonl", rows(3, 3)), out)
    assert tuesday.returncode == 0, tuesday.stderr.decode()
    on_disk = groups_on_disk(out)
    assert len(on_disk) == 6 and set(on_disk.values()) == {2}  # six problems, K=2 executions each, once
    prompts = {r["problem_id"]: r["prompt"] for r in read_records(out)}
    assert all(f"What is {i} plus {i}?" in "".join(prompts.values()) for i in range(6))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["last_run"]["stats"]["problems_skipped_done"] == 0


def test_rows_appended_to_the_same_file_run_only_the_new_ones(sim, tmp_path):
    out = tmp_path / "out"
    source = write(tmp_path / "daily.jsonl", rows(0, 3))
    assert generate(sim.url, source, out).returncode == 0
    calls = len(generations(sim))
    with source.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows(3, 2)))
    again = generate(sim.url, source, out)
    assert again.returncode == 0, again.stderr.decode()
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert (stats["problems"], stats["problems_skipped_done"], stats["groups_written"]) == (5, 3, 2)
    assert len(generations(sim)) > calls
    asked = {
        sim.tokenizer.decode(e["request"]["prompt"]).split("What is ")[1].split("?")[0]
        for e in generations(sim)[calls:]
    }
    assert asked == {"3 plus 3", "4 plus 4"}  # only the appended rows reached the server
    assert set(groups_on_disk(out).values()) == {2} and len(groups_on_disk(out)) == 5


def test_an_id_already_done_with_another_prompt_or_label_is_refused_with_file_and_line(sim, tmp_path):
    out = tmp_path / "out"
    assert generate(sim.url, write(tmp_path / "a.jsonl", rows(0, 2, id="q7")[:1]), out).returncode == 0
    later = write(tmp_path / "b.jsonl", [*rows(10, 1), {"id": "q7", "prompt": "What is 1 plus 1?", "label": "3"}])
    refused = generate(sim.url, later, out)
    assert refused.returncode == 3
    assert f"{later}:2: field 'id': id 'q7' is already in the output folder".encode() in refused.stderr
    assert b"Traceback" not in refused.stderr
    skipped = generate(sim.url, later, out, "--skip-invalid")
    assert skipped.returncode == 0, skipped.stderr.decode()
    stats = json.loads((out / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["invalid_rows"] == 1
    records = [r for r in read_records(out) if r["problem_id"] == "q7"]
    assert {r["prompt"].count("What is 0 plus 0?") for r in records} == {1}  # the first q7, untouched
    unchanged = generate(sim.url, write(tmp_path / "c.jsonl", rows(0, 2, id="q7")[:1]), out)
    assert unchanged.returncode == 0  # the same row again: already done, not refused
    # an input of nothing but such a row is skipped as asked too: its keys were read right (the guard against
    # wrong --prompt-key/--label-key is for rows that cannot be read)
    clash = write(tmp_path / "d.jsonl", [{"id": "q7", "prompt": "What is 1 plus 1?", "label": "3"}])
    alone = generate(sim.url, clash, out, "--skip-invalid")
    assert alone.returncode == 0, alone.stderr.decode()
    assert b"already in the output folder" in alone.stderr and b"--prompt-key" not in alone.stderr
