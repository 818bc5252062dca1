import dataclasses
import re
from pathlib import Path

from agentroll.schema import Sample

DOC = Path(__file__).resolve().parent.parent / "docs" / "schema.md"


def test_the_schema_doc_lists_exactly_the_record_fields_in_order():
    documented = re.findall(r"^\| `(\w+)` \|", DOC.read_text(), re.M)
    assert documented == [f.name for f in dataclasses.fields(Sample)]
