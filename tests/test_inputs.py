from pathlib import Path

import pytest

from agentroll.errors import InputError
from agentroll.inputs import InputKeys, read_problems


def rows(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_rows_become_problems_with_metadata_and_line_number_ids(tmp_path):
    path = rows(tmp_path / "in.jsonl", '{"prompt": "2+2?", "label": 4, "src": "x"}', "",
                '{"id": "b", "prompt": [{"role": "user", "content": "hi"}], "label": "1"}')
    first, second = read_problems(str(path))
    assert (first.id, first.label, first.metadata, first.statement) == ("1", 4, {"src": "x"}, "2+2?")
    assert (second.id, second.statement, second.line) == ("b", "hi", 3)


@pytest.mark.parametrize(("line", "field", "reason"), [
    ('{"prompt": "x"', None, "malformed JSON"),
    ('["x"]', None, "expected a JSON object"),
    ('{"label": "1"}', "prompt", "missing"),
    ('{"prompt": 3, "label": "1"}', "prompt", "non-empty string"),
    ('{"prompt": [{"role": "user"}], "label": "1"}', "prompt", "message 0"),
    ('{"prompt": "x"}', "label", "missing"),
    ('{"prompt": "x", "label": null}', "label", "string or a number"),
    ('{"prompt": "x", "label": "1", "id": [1]}', "id", "string or an integer"),
])
def test_a_bad_row_names_file_line_and_field(tmp_path, line, field, reason):
    path = rows(tmp_path / "in.jsonl", '{"prompt": "a", "label": 1}', line)
    with pytest.raises(InputError) as info:
        list(read_problems(str(path)))
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), 2, field)
    assert reason in str(err) and str(err).startswith(f"{path}:2: line 2")
    assert (f"field '{field}'" in str(err)) == (field is not None)


def test_duplicate_ids_are_reported(tmp_path):
    path = rows(tmp_path / "in.jsonl", '{"id": 1, "prompt": "a", "label": 1}', '{"id": "1", "prompt": "b", "label": 1}')
    with pytest.raises(InputError, match="duplicate id '1'"):
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
