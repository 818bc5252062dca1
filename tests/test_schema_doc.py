import dataclasses
import re
from pathlib import Path

from agentroll.record.schema import Sample

DOC = Path(__file__).resolve().parent.parent / "docs" / "schema.md"


def test_the_schema_doc_lists_exactly_the_record_fields_in_order():
    documented = re.findall(r"^\| `(\w+)` \|", DOC.read_text(), re.M)
    assert documented == [f.name for f in dataclasses.fields(Sample)]


def test_the_schema_doc_shows_the_folder_layout_as_the_folder_package_spells_it():
    from agentroll.folder import layout

    block = layout.__doc__.split("\n\n")[1]
    spelled = "\n".join(line[4:] for line in block.splitlines())
    assert f"```\n{spelled}\n```" in DOC.read_text()
