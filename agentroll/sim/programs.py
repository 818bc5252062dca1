"""What the simulated model writes when it has tools or is asked for a program (`script.py` decides when).

Programs: for a code problem (a row whose label holds `{"inputs", "outputs"}` tests, `--reward code`) the model
writes a fenced python block that is right (it looks the answer to its input up in the tests it was given: a
stand-in for solving), wrong (the right output with its first line spoiled), crashing, looping forever or eating
memory. A right program knows its input only as a grader should feed it, byte for byte (the input, ending in
one newline): it strips nothing, so a grader that feeds anything else fails it.

Tool calls: in Hermes format, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, for the tools
the prompt offers (the chat template lists their schemas between `<tools>` and `</tools>`, one a line, as
the bundled template and Qwen3's do); the `python` tool is asked to print the answer, which the model then
reads back from the tool's turn, so a run proves the results reach the model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..rewards.code import call_arguments

_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_TOOL_TURN = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>|<tool_response>\n(.*?)\n</tool_response>", re.S)
CRASH = "raise RuntimeError('the simulated program gives up')\n"
LOOP = "while True:\n    pass\n"
HOG = "blocks = []\nwhile True:\n    blocks.append(bytes(1 << 26))\n"  # zero pages: address space, little RAM


def code_tests(label: Any) -> dict[str, Any] | None:
    """A row's label as code tests (an object, or a JSON string of one), or None for any other label."""
    if isinstance(label, str) and label.lstrip().startswith("{"):
        try:
            label = json.loads(label)
        except ValueError:
            return None
    if isinstance(label, dict) and isinstance(label.get("inputs"), list) and isinstance(label.get("outputs"), list):
        return label
    return None


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(map(str, value))
    return value if isinstance(value, str) else json.dumps(value)


def _stdin(value: Any) -> str:
    """What a grader feeds a stdin test: the input as given, with a final newline when it has none."""
    text = _text(value)
    return text if text.endswith("\n") else text + "\n"


def program(tests: dict[str, Any], kind: str) -> str:
    """The source of a program of `kind`: right, wrong, crash, loop or memory."""
    if kind in ("crash", "loop", "memory"):
        return {"crash": CRASH, "loop": LOOP, "memory": HOG}[kind]
    name = tests.get("fn_name")
    if name:
        table = {json.dumps(call_arguments(i)): o for i, o in zip(tests["inputs"], tests["outputs"], strict=False)}
        body = "return None" if kind == "wrong" else "return _ANSWERS[json.dumps(list(args))]"
        return f"import json\n_ANSWERS = json.loads({json.dumps(table)!r})\n\n\ndef {name}(*args):\n    {body}\n"
    answers = {_stdin(i): _text(o) for i, o in zip(tests["inputs"], tests["outputs"], strict=False)}
    if kind == "wrong":
        answers = {
            k: (v.split("\n", 1)[0] + " 0\n" + v.split("\n", 1)[1]) if "\n" in v else v + " 0"
            for k, v in answers.items()
        }
    return (
        f"import json\nimport sys\n\nANSWERS = json.loads({json.dumps(answers)!r})\n"
        "sys.stdout.write(ANSWERS.get(sys.stdin.read(), ''))\n"
    )


def offered_tools(prompt: str) -> list[dict[str, Any]]:
    """The tool schemas the prompt lists (none: the model has no tools)."""
    found = _TOOLS.search(prompt)
    if found is None:
        return []
    tools = []
    for line in found.group(1).split("\n"):
        try:
            tool = json.loads(line)
        except ValueError:
            continue
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict):
            tools.append(tool["function"])
    return tools


def tool_results(turn: str) -> list[str]:
    """The tool results in a conversation's last request, in order (the bundled template's `tool` turns, or
    Qwen3's `<tool_response>` blocks)."""
    return [a or b for a, b in _TOOL_TURN.findall(turn)]


def arguments_for(tool: dict[str, Any], statement: str) -> dict[str, Any]:
    """Plausible arguments for a tool by its schema: each required parameter of its JSON type."""
    parameters = tool.get("parameters") or {}
    properties = parameters.get("properties") or {}
    samples = {"string": statement[:80], "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    out = {}
    for name in parameters.get("required") or ():
        kind = (properties.get(name) or {}).get("type", "string")
        out[name] = samples.get(kind if isinstance(kind, str) else kind[0], statement[:80])
    return out


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


MALFORMED = '<tool_call>\n{"name": "python", "arguments": {"code": \n</tool_call>'
