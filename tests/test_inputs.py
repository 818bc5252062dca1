import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from agentroll.errors import InputError
from agentroll.inputs import InputKeys, aread_problems, content_hash, read_problems


def rows(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_become_problems_with_metadata_and_content_hash_ids(tmp_path):
    path = rows(
        tmp_path / "in.jsonl",
        '{"prompt": "2+2?", "label": 4, "src": "x"}',
        "",
        '{"id": "b", "prompt": [{"role": "user", "content": "hi"}], "label": "1"}',
    )
    first, second = read_problems(str(path))
    assert (first.id, first.label, first.metadata, first.statement) == (
        content_hash("2+2?", 4),
        4,
        {"src": "x"},
        "2+2?",
    )
    assert (second.id, second.statement, second.line) == ("b", "hi", 3)
    assert second.content_hash == content_hash([{"role": "user", "content": "hi"}], "1")


def test_the_default_id_depends_on_prompt_and_label_only_and_is_stable(tmp_path):
    a = rows(tmp_path / "a.jsonl", '{"prompt": "2+2?", "label": 4, "src": "x"}')
    b = rows(
        tmp_path / "b.jsonl",
        '{"label": 4, "other": 1, "prompt": "2+2?"}',
        '{"prompt": "2+2?", "label": 5}',
        '{"prompt": "2+2?", "label": "4"}',
        '{"prompt": "2+3?", "label": 4}',
    )
    (one,) = read_problems(str(a))
    same, *others = read_problems(str(b))
    assert one.id == same.id and len({one.id, *(o.id for o in others)}) == 4
    # the documented rule: blake2b (8 bytes, hex) of the compact JSON [prompt, label], keys sorted
    assert one.id == hashlib.blake2b(json.dumps(["2+2?", 4], separators=(",", ":")).encode(), digest_size=8).hexdigest()


def test_a_byte_order_mark_at_the_start_of_a_file_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a", "label": 1}\n{"prompt": "b", "label": 2}\n')
    assert [p.statement for p in read_problems(str(path))] == ["a", "b"]
    assert [p.statement for p in asyncio.run(collect(str(path)))] == ["a", "b"]


async def collect(path: str, **kw) -> list:
    return [p async for p in aread_problems(path, **kw)]


def test_the_async_reader_gives_the_same_rows_and_errors_as_the_sync_one(tmp_path):
    lines = [json.dumps({"prompt": "p" * (i * 5000 + 1), "label": i}) for i in range(40)]  # lines across chunks
    path = rows(tmp_path / "in.jsonl", *lines, '{"prompt": "x"}')
    skipped: list = []
    got = asyncio.run(collect(str(path), on_invalid=skipped.append))
    assert [p.label for p in got] == list(range(40)) and [e.line for e in skipped] == [41]
    with pytest.raises(InputError, match=":41: field 'label'"):
        asyncio.run(collect(str(path)))


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"prompt": "x"', None, "malformed JSON"),
        ('["x"]', None, "expected a JSON object"),
        ('{"label": "1"}', "prompt", "missing"),
        ('{"prompt": 3, "label": "1"}', "prompt", "non-empty string"),
        ('{"prompt": [{"role": "user"}], "label": "1"}', "prompt", "message 0"),
        ('{"prompt": "x"}', "label", "missing"),
        ('{"prompt": "x", "label": null}', "label", "string or a number"),
        ('{"prompt": "x", "label": "1", "id": [1]}', "id", "string or an integer"),
    ],
)
def test_a_bad_row_names_file_line_and_field(tmp_path, line, field, reason):
    path = rows(tmp_path / "in.jsonl", '{"prompt": "a", "label": 1}', line)
    with pytest.raises(InputError) as info:
        list(read_problems(str(path)))
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), 2, field)
    assert reason in str(err) and str(err).startswith(f"{path}:2: ")
    assert (f"field '{field}'" in str(err)) == (field is not None)


def test_duplicate_ids_are_reported(tmp_path):
    path = rows(tmp_path / "in.jsonl", '{"id": 1, "prompt": "a", "label": 1}', '{"id": "1", "prompt": "b", "label": 1}')
    with pytest.raises(InputError, match="duplicate id '1' \\(first on line 1\\)"):
        list(read_problems(str(path)))


def test_skip_invalid_hands_bad_rows_to_a_callback_and_goes_on(tmp_path):
    path = rows(tmp_path / "in.jsonl", "nope", '{"prompt": "a", "label": 1}', '{"prompt": "b"}')
    skipped = []
    got = list(read_problems(str(path), on_invalid=skipped.append))
    assert [p.statement for p in got] == ["a"]
    assert [e.line for e in skipped] == [1, 3]


def test_renamed_keys(tmp_path):
    path = rows(tmp_path / "in.jsonl", '{"q": "a", "a": 1, "uid": "z"}')
    (problem,) = read_problems(str(path), InputKeys(prompt="q", label="a", id="uid"))
    assert (problem.id, problem.statement, problem.label) == ("z", "a", 1)
