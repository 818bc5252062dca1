"""`--reward code`: programs from the answer run against the row's tests in the local sandbox."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentroll import Generator
from agentroll.errors import InputError, RewardError
from agentroll.inputs import content_hash, problem_from_row
from agentroll.rewards import RewardRequest, RewardSet, RewardSettings
from agentroll.rewards.code import last_python_block, parse_tests
from agentroll.sandbox import SandboxSettings

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

DOUBLE = {"inputs": ["2\n", "5\n", "-1\n"], "outputs": ["4\n", "10\n", "-2\n"]}


def answer(program: str, before: str = "Here it is.") -> str:
    return f"{before}\n```python\n{program}\n```\n"


def score(
    content: str | None,
    label,
    partial: bool = False,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    url: str | None = None,
):
    async def main():
        settings = RewardSettings(
            "code",
            sandbox=SandboxSettings(memory_mb=memory_mb, url=url, max_retries=0),
            code_test_timeout_s=timeout_s,
            code_partial_credit=partial,
        )
        rewards = RewardSet(settings)
        try:
            return (await rewards.get("code").score([RewardRequest(content, label, "p", "solver")]))[0]
        finally:
            await rewards.aclose()

    return asyncio.run(main())


def test_a_right_program_passes_every_test():
    result = score(answer("print(2 * int(input()))"), DOUBLE)
    assert (result.value, result.info, result.failed) == (1.0, "passed 3 of 3 tests", None)


def test_the_last_python_block_is_the_one_run_and_trailing_white_space_is_ignored():
    content = answer("print('wrong')", "A first try:") + answer("print(2 * int(input()), '  ')\nprint()", "Better:")
    assert score(content, DOUBLE).value == 1.0
    assert last_python_block("```py\na\n```\ntext\n```Python\nb\n```") == "b\n"
    assert last_python_block("```bash\nls\n```") is None


def test_a_wrong_program_says_which_test_and_line_failed():
    result = score(answer("n = int(input())\nprint(2 * n if n > 0 else n)"), DOUBLE)
    assert result.value == 0.0
    assert result.info == "passed 2 of 3 tests; test 3: wrong output: line 1: expected '-2', got '-1'"


def test_partial_credit_is_the_fraction_passed_and_every_test_runs():
    result = score(answer("n = int(input())\nprint(2 * n if n < 5 else 0)"), DOUBLE, partial=True)
    assert result.value == pytest.approx(2 / 3)
    assert result.info == "passed 2 of 3 tests; test 2: wrong output: line 1: expected '10', got '0'"


@pytest.mark.parametrize(
    ("program", "timeout_s", "why"),
    [
        ("raise ValueError('no idea')", 10.0, "test 1: error: ValueError: no idea (later tests not run)"),
        ("while True:\n    pass", 1.0, "test 1: timeout after 1s (later tests not run)"),
        (
            "blocks = []\nwhile True:\n    blocks.append(bytes(1 << 26))",
            10.0,
            "test 1: memory: over its 256 MB (later tests not run)",
        ),
    ],
)
def test_crashing_looping_and_memory_hungry_programs_score_0_and_say_why(program, timeout_s, why):
    result = score(answer(program), DOUBLE, timeout_s=timeout_s, memory_mb=256)
    assert (result.value, result.info, result.failed) == (0.0, f"passed 0 of 3 tests; {why}", None)


def test_an_input_that_ends_in_a_newline_is_fed_as_it_is():
    program = "import sys\nfor line in sys.stdin:\n    a, b = map(int, line.split())\n    print(a + b)"
    label = {"inputs": ["1 2\n3 4\n", "5 6"], "outputs": ["3\n7\n", "11\n"]}
    assert score(answer(program), label).info == "passed 2 of 2 tests"
    seen = {"inputs": ["1 2\n", "1 2", ["a", "b"], ""], "outputs": ["'1 2\\n'", "'1 2\\n'", "'a\\nb\\n'", "'\\n'"]}
    assert score(answer("import sys\nprint(repr(sys.stdin.read()))"), seen).info == "passed 4 of 4 tests"


def test_partial_credit_names_each_failed_test_within_a_bound():
    program = "n = int(input())\nif n == 5:\n    raise ValueError('five')\nprint(2 * n if n > 0 else n)"
    result = score(answer(program), DOUBLE, partial=True)
    assert result.value == pytest.approx(1 / 3)
    assert result.info == (
        "passed 1 of 3 tests; test 2: error: ValueError: five; test 3: wrong output: line 1: expected '-2', got '-1'"
    )
    many = {"inputs": [f"{i}\n" for i in range(12)], "outputs": ["x\n"] * 12}
    result = score(answer("print(input() * 40)"), many, partial=True)
    assert result.value == 0.0 and len(result.info) <= 600
    assert result.info.startswith("passed 0 of 12 tests; test 1: wrong output: line 1: expected 'x', got '0000")
    assert result.info.endswith("; and 7 more failed") and result.info.count("; test ") == 5


def test_paths_of_the_sandbox_never_reach_reward_info():
    result = score(answer("import os\nraise ValueError(os.path.abspath(__file__))"), DOUBLE)
    assert result.info == "passed 0 of 3 tests; test 1: error: ValueError: main.py (later tests not run)"


def test_call_based_tests_call_the_function_or_a_solution_method():
    label = {"fn_name": "add", "inputs": [[1, 2], [3, 4], ["a", "b"]], "outputs": [[3], 7, ["ab"]]}
    assert score(answer("def add(a, b):\n    return a + b"), label).value == 1.0
    leet = "class Solution:\n    def add(self, a, b):\n        print('noise')\n        return a + b"
    assert score(answer(leet), label).value == 1.0
    wrong = score(answer("def add(a, b):\n    return a"), label)
    assert wrong.info == "passed 0 of 3 tests; test 1: wrong output: expected [3], got 1 (later tests not run)"
    missing = score(answer("def plus(a, b):\n    return a + b"), label)
    assert missing.info.startswith("passed 0 of 3 tests; test 1: error: NameError: the program defines no function add")


def test_a_call_based_solution_is_loaded_as_a_module_so_its_main_block_stays_idle():
    label = {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}
    program = (
        "import sys\n\ndef add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    print(sys.stdin.read())"
    )
    assert score(answer(program), label).value == 1.0  # its main block would have eaten the arguments
    named = "def add(a, b):\n    return __name__"
    assert score(answer(named), {"fn_name": "add", "inputs": [[1, 2]], "outputs": ["solution"]}).value == 1.0


def test_a_label_in_a_json_string_and_arguments_in_lines_are_read():
    label = json.dumps({"fn_name": "scale", "inputs": ["[1, 2]\n3", "[0]\n5"], "outputs": [[3, 6], [0]]})
    assert score(answer("def scale(xs, k):\n    return [x * k for x in xs]"), label).value == 1.0
    assert score(answer("print(input())"), json.dumps({"inputs": [["a", "b"]], "outputs": [["a"]]})).value == 1.0


def test_no_program_or_no_content_scores_0():
    assert score("The answer is 4.", DOUBLE).info == "no ```python block in the answer"
    assert score(None, DOUBLE).info == "no answer content"


def test_a_sandbox_that_cannot_run_code_stops_the_run():
    with pytest.raises(
        RewardError, match=re.escape("--reward code: sandbox http://127.0.0.1:9/run_code failed 1 times")
    ):
        score(answer("print(1)"), DOUBLE, url="http://127.0.0.1:9")


@pytest.mark.parametrize(
    ("label", "why"),
    [
        ({"inputs": ["1"]}, 'needs "inputs" and "outputs" lists'),
        ({"inputs": ["1"], "outputs": []}, "has 1 inputs and 0 outputs"),
        ("not json", "is a string that is not JSON"),
        (7, "got an integer"),
        ("7", re.escape("got the string '7' (JSON for an integer)")),  # the label as the user wrote it
        ("[1, 2]", re.escape("got the string '[1, 2]' (JSON for an array)")),
        ({"inputs": [[1]], "outputs": [1], "fn_name": "no good"}, "is not a function name"),
    ],
)
def test_a_code_row_with_a_bad_label_is_a_bad_row(label, why):
    with pytest.raises(ValueError, match=why):
        parse_tests(label)
    generator = Generator(base_url="http://127.0.0.1:9", reward="code")
    with pytest.raises(InputError, match=f":4: field 'label': for the code reward it .*{why}"):
        generator.problem({"prompt": "Write a program.", "label": label}, 4, "in.jsonl")


def test_object_labels_are_for_code_rows_and_leave_other_rows_as_they_were():
    row = {"prompt": "Write a program.", "label": DOUBLE, "reward": "code"}
    problem = Generator(base_url="http://127.0.0.1:9").problem(row, 2, "in.jsonl")  # a row may name "code"
    assert problem.label == DOUBLE and problem.reward == "code"
    with pytest.raises(InputError, match="an object is a label for the code reward or a reward function, not for math"):
        Generator(base_url="http://127.0.0.1:9").problem({"prompt": "p", "label": DOUBLE}, 3, "in.jsonl")
    assert problem_from_row({"prompt": "p", "label": {"b": 1, "a": 2}}).id == content_hash("p", {"a": 2, "b": 1})
    # the identity of a row with a string label is what it always was
    assert (
        problem_from_row({"prompt": "What is 1 plus 1?", "label": "2"}).id == "bc903b21bf9b6eb1"
    )  # as main computed it


def test_the_three_stage_system_judges_programs_on_the_simulator(tmp_path):
    """The simulator tells a selector prompt over programs from a rewriter's: every selector call is judged."""
    from agentroll.folder import read_records
    from agentroll.sim.script import Behavior, Script
    from agentroll.sim.server import SimServer

    from .conftest import TOKENIZER, run_cli

    problems = tmp_path / "code.jsonl"
    rows = [
        {"id": "double", "prompt": "Read n and print 2n.", "label": DOUBLE},
        {"id": "add", "prompt": "Write add(a, b).", "label": {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]}},
    ]
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    quiet = Behavior(truncate=0, no_think_close=0, empty_after_think=0, no_judgment=0, bad_judgment=0, correct=0.5)
    server = SimServer(script=Script.from_jsonl(problems, quiet))
    server.start()
    try:
        out = tmp_path / "out"
        done = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "code",
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "4",
            "--seed",
            "5",
            "-q",
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    finally:
        server.stop()
    records = list(read_records(out))
    selectors = [r for r in records if r["stage"] == "selector"]
    assert len(selectors) == 8 and all(isinstance(r["judgment"], int) for r in selectors)
    rewriters = [r for r in records if r["stage"] == "rewriter"]
    assert all("```python" in r["content"] for r in rewriters) and {r["raw_reward"] for r in rewriters} == {0.0, 1.0}
