"""What the simulated model says: scripted, seeded answers for each stage of the agent system.

The stage is recognised from the script's own earlier answers, never from the templates' wording (users bring
their own `--prompts`). Every answer content the script writes holds a fixed sentence that says which stage
wrote it: a solver's "Working it out directly, the answer is \\boxed{V}.", a rewriter's "Weighing the candidate
solutions together, the answer is \\boxed{V}." (before a program, for a problem with code tests: "Working it out
directly, here is my program." and "Weighing the candidate solutions together, here is my program."). The
pipeline lists solver contents in rewriter prompts and rewriter contents in selector prompts, so a prompt quoting
a rewriter sentence is a selector prompt, one quoting a solver sentence a rewriter prompt, and any other a solver
prompt; the order in which the rewriter sentences appear is the 1-based numbering the selector's `Judgment: K`
refers to. Being stateless, this keeps working across a server restart mid-run (a resumed run's prompts quote
answers an earlier server wrote). In a multi-turn prompt only its last user turn says the stage (earlier turns
hold the model's own earlier answers), so a follow-up turn such as critique-revise's is answered like a solver,
from the problem it still contains.

The answer key (problem statement -> label) decides right and wrong, and `Behavior` mixes in what the pipeline
must handle: no closing think tag, nothing after it, truncation, wrong answers, answers in an equal but
different form, out-of-range or missing judgments.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .programs import CRASH, LOOP, MALFORMED, arguments_for, call_text, code_tests, offered_tools, program, tool_results

SOLVER_SAYS = "Working it out directly, the answer is \\boxed{"
REWRITER_SAYS = "Weighing the candidate solutions together, the answer is \\boxed{"
SOLVER_CODES = "Working it out directly, here is my program."  # the same, for a problem with code tests
REWRITER_CODES = "Weighing the candidate solutions together, here is my program."
_INT = re.compile(r"-?\d+")
# a judge's prompt asks for `Score: X` (or `Score i: X`, a group's), in backticks as the built-in rubrics write it
JUDGE_ASKS = re.compile(r"`Score(?: i)?: ")
_GROUP_ANSWER = re.compile(r"^Answer (\d+):\n", re.M)


@dataclass(slots=True)
class Behavior:
    """Probabilities of each kind of answer (independent draws per call)."""

    correct: float = 0.6  # a solver or rewriter answers right
    equivalent_form: float = 0.5  # a right answer is written in another, equal form (\frac{84}{2} for 42)
    no_think_close: float = 0.1  # the think block never closes
    empty_after_think: float = 0.05  # the think block closes and nothing follows
    truncate: float = 0.08  # runs to max_tokens (finish_reason "length")
    select_correct: float = 0.7  # the selector picks a right rewrite when there is one
    bad_judgment: float = 0.1  # the selector names a solution number that was not listed
    no_judgment: float = 0.05  # the selector writes no "Judgment:" line
    judge_no_score: float = 0.0  # a judge's prompt (`Score: X` asked for) is answered without a score
    reasoning_words: int = 12  # length of the think block, in words (raise it for realistic token counts)
    # a code problem (its label holds tests): the program is right with `correct`; else one of these, else wrong
    program_crash: float = 0.1
    program_loop: float = 0.05
    program_memory: float = 0.05
    # tools on offer (programs.py)
    tool_call: float = 0.8  # the first response calls a tool
    tool_again: float = 0.2  # a response after tool results calls again
    tool_parallel: float = 0.15  # a response that calls makes two calls
    tool_malformed: float = 0.05  # a call that cannot be read
    tool_unknown: float = 0.05  # a call of a tool not on offer
    tool_code_crash: float = 0.05  # the python tool is given code that raises
    tool_code_loop: float = 0.03  # ... or code that never ends


@dataclass(slots=True)
class Scripted:
    text: str
    truncate: bool = False


def equivalent(label: str) -> str:
    """An equal value in another form: integers as a fraction, 0.5 as \\frac{1}{2}, else unchanged."""
    if _INT.fullmatch(label.strip()):
        return f"\\frac{{{2 * int(label)}}}{{2}}"
    if label.strip() == "0.5":
        return "\\frac{1}{2}"
    return label


def wrong(label: str) -> str:
    if _INT.fullmatch(label.strip()):
        return str(int(label) + 1)
    return f"{label}+1"


def _longest(table: dict[str, Any], prompt: str) -> Any:
    best: tuple[int, Any] | None = None
    for problem, value in table.items():
        if (best is None or len(problem) > best[0]) and problem in prompt:
            best = (len(problem), value)
    return best[1] if best else None


def _statement(prompt: str) -> str:
    """The first user message of a ChatML prompt (the problem, in the bundled templates)."""
    at = prompt.find("<|im_start|>user\n")
    if at < 0:
        return prompt
    start = at + len("<|im_start|>user\n")
    return prompt[start : prompt.find("<|im_end|>", start) if "<|im_end|>" in prompt[start:] else None]


def last_turn(prompt: str) -> str:
    """The text from a ChatML prompt's last user turn on: a multi-turn prompt is answered as its last request."""
    at = prompt.rfind("<|im_start|>user")
    return prompt[at:] if at > 0 else prompt


def quoted_values(prompt: str, says: str) -> list[str]:
    """The boxed values of every quoted `says` sentence, in order of appearance (braces balanced)."""
    values = []
    start = prompt.find(says)
    while start != -1:
        i = start + len(says)
        depth, j = 1, i
        while j < len(prompt) and depth:
            depth += {"{": 1, "}": -1}.get(prompt[j], 0)
            j += 1
        if depth == 0:
            values.append(prompt[i : j - 1])
        start = prompt.find(says, j)
    return values


@dataclass
class Script:
    behavior: Behavior = field(default_factory=Behavior)
    answers: dict[str, str] = field(default_factory=dict)  # problem statement -> label
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)  # problem statement -> code tests
    _thoughts: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_jsonl(cls, path: Path | None, behavior: Behavior | None = None) -> Script:
        """The answer key from prompt rows (`label`: an answer, or code tests). A row it cannot read is a
        `ValueError` naming the file and line."""
        answers: dict[str, str] = {}
        tests: dict[str, dict[str, Any]] = {}
        if path is not None:
            for line, raw in enumerate(Path(path).read_bytes().split(b"\n"), 1):
                if not raw.strip():
                    continue
                try:
                    row = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line}: malformed JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{line}: expected a JSON object, got {type(row).__name__}")
                prompt = row.get("prompt")
                if isinstance(prompt, list):
                    user = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
                    prompt = user[-1].get("content", "") if user else ""
                if isinstance(prompt, str) and "label" in row:
                    found = code_tests(row["label"])
                    if found is not None:
                        tests[prompt] = found
                    else:
                        answers[prompt] = str(row["label"])
        return cls(behavior or Behavior(), answers, tests)

    def label_for(self, prompt: str) -> str | None:
        """The label of the longest problem statement the prompt contains (a short statement can sit inside a
        longer one)."""
        return _longest(self.answers, prompt)

    def tests_for(self, prompt: str) -> dict[str, Any] | None:
        """The code tests of the longest problem statement the prompt contains."""
        return _longest(self.tests, prompt)

    @staticmethod
    def stage(prompt: str) -> str:
        """Which stage a prompt is for, from the answers it quotes (see the module docstring)."""
        if REWRITER_SAYS in prompt or REWRITER_CODES in prompt:
            return "selector"
        return "rewriter" if SOLVER_SAYS in prompt or SOLVER_CODES in prompt else "solver"

    def answer(self, prompt: str, rng: random.Random, request: dict[str, Any] | None = None) -> Scripted:
        """The text for one completion. `request` is the raw body, for scripts that key on its fields."""
        turn = last_turn(prompt)
        if JUDGE_ASKS.search(turn):
            return self._judge(turn, rng)
        stage = self.stage(turn)  # a conversation's earlier turns quote earlier answers
        if stage == "selector":
            return self._select(prompt, rng)
        tools = offered_tools(prompt)
        if tools:
            return self._with_tools(prompt, tools, rng)
        return self._solve(prompt, stage, rng)

    def _judge(self, prompt: str, rng: random.Random) -> Scripted:
        """A judge's verdict: 1 for an answer whose last boxed value is the label (or its equal form), else 0; a
        group prompt's answers (`Answer i:` sections) each so, one `Score i: X` line each. `judge_no_score` of the
        replies give none."""
        if rng.random() < self.behavior.judge_no_score:
            return Scripted("I cannot settle on a score for this one.")
        label = self.label_for(prompt)
        right = set() if label is None else {label, equivalent(label)}

        def score(text: str) -> int:
            start = text.rfind("\\boxed{")
            if start < 0:
                return 0
            depth, at = 1, start + len("\\boxed{")
            for end in range(at, len(text)):  # the braces balanced: \frac{84}{2} is one value
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    return int(text[at:end].strip() in right)
            return 0

        sections = _GROUP_ANSWER.split(prompt)
        if len(sections) > 2:  # [before, "1", text, "2", text, ...]
            lines = [f"Score {sections[i]}: {score(sections[i + 1])}" for i in range(1, len(sections), 2)]
            return Scripted("Comparing the answers with the reference.\n" + "\n".join(lines))
        return Scripted(f"Checking the final result against the reference.\nScore: {score(prompt)}")

    def _think(self, rng: random.Random, stage: str) -> str:
        """A think block drawn from a fixed set of 64 per stage: varied, yet cheap for the server to encode."""
        variant = rng.randrange(64)
        key = (stage, variant)
        if key not in self._thoughts:
            words = ["first", "compute", "check", "the", "value", "so", "then", "step", "sum", "product"]
            local = random.Random(variant)
            filler = " ".join(local.choice(words) for _ in range(self.behavior.reasoning_words))
            opener = "Comparing the candidate solutions," if stage == "rewriter" else "Let me think step by step:"
            self._thoughts[key] = f"<think>{opener} {filler}."
        return self._thoughts[key]

    def _solve(self, prompt: str, stage: str, rng: random.Random) -> Scripted:
        b = self.behavior
        think = self._think(rng, stage)
        roll = rng.random()
        if roll < b.truncate:
            return Scripted(think + " and so on", truncate=True)  # the server pads it to max_tokens
        roll -= b.truncate
        if roll < b.no_think_close:
            return Scripted(think + " I am not sure yet")
        roll -= b.no_think_close
        if roll < b.empty_after_think:
            return Scripted(think + "</think>\n\n")
        tests = self.tests_for(prompt)
        if tests is not None:
            return self._program(think, tests, rng, REWRITER_CODES if stage == "rewriter" else SOLVER_CODES)
        label = self.label_for(prompt)
        if label is None:
            value = str(rng.randint(0, 1000))
        elif rng.random() < b.correct:
            value = equivalent(label) if rng.random() < b.equivalent_form else label
        else:
            value = wrong(label)
        says = REWRITER_SAYS if stage == "rewriter" else SOLVER_SAYS
        return Scripted(f"{think}</think>\n\n{says}{value}}}.")

    def _program(self, think: str, tests: dict[str, Any], rng: random.Random, says: str = SOLVER_CODES) -> Scripted:
        b, kind = self.behavior, "right"
        if rng.random() >= b.correct:
            roll, kind = rng.random(), "wrong"
            for name, p in (("crash", b.program_crash), ("loop", b.program_loop), ("memory", b.program_memory)):
                if roll < p:
                    kind = name
                    break
                roll -= p
        return Scripted(f"{think}</think>\n\n{says}\n```python\n{program(tests, kind)}```")

    def _with_tools(self, prompt: str, tools: list[dict[str, Any]], rng: random.Random) -> Scripted:
        """A turn of a conversation with tools: call (one or two calls), or answer, reading the tools' results."""
        b = self.behavior
        think = self._think(rng, "solver")
        if rng.random() < b.truncate:
            return Scripted(think + " and so on", truncate=True)
        results = tool_results(last_turn(prompt))
        if rng.random() < (b.tool_again if results else b.tool_call):
            count = 2 if rng.random() < b.tool_parallel else 1
            return Scripted(f"{think}</think>\n\n" + "\n".join(self._call(prompt, tools, rng) for _ in range(count)))
        tests = self.tests_for(prompt)
        if tests is not None:
            return self._program(think, tests, rng)
        said = results[-1].strip() if results else ""
        if said and "\n" not in said and not said.startswith(("error:", "[")) and len(said) < 40:
            value = said  # what the python tool printed
        else:
            label = self.label_for(prompt)
            value = str(rng.randint(0, 1000)) if label is None else label if rng.random() < b.correct else wrong(label)
        return Scripted(f"{think}</think>\n\n{SOLVER_SAYS}{value}}}.")

    def _call(self, prompt: str, tools: list[dict[str, Any]], rng: random.Random) -> str:
        b, roll = self.behavior, rng.random()
        if roll < b.tool_malformed:
            return MALFORMED
        if roll < b.tool_malformed + b.tool_unknown:
            return call_text("web_search_v2", {"query": "the answer"})
        names = [t.get("name") for t in tools]
        if "python" not in names:
            known = [k for k in (*self.answers, *self.tests) if k in prompt]
            statement = max(known, key=len) if known else _statement(prompt)
            return call_text(str(names[0]), arguments_for(tools[0], statement))
        roll = rng.random()
        if roll < b.tool_code_crash:
            return call_text("python", {"code": CRASH})
        if roll < b.tool_code_crash + b.tool_code_loop:
            return call_text("python", {"code": LOOP})
        label = self.label_for(prompt)
        value = str(rng.randint(0, 1000)) if label is None else label if rng.random() < b.correct else wrong(label)
        return call_text("python", {"code": f"print({json.dumps(value)})"})

    def _select(self, prompt: str, rng: random.Random) -> Scripted:
        b = self.behavior
        listed = quoted_values(prompt, REWRITER_SAYS)
        count = len(listed) or prompt.count(REWRITER_CODES)  # programs: listed, but no value to judge them by
        think = self._think(rng, "selector") + "</think>\n\n"
        roll = rng.random()
        if roll < b.no_judgment:
            return Scripted(think + "All of them look plausible to me.")
        if roll < b.no_judgment + b.bad_judgment:
            return Scripted(think + f"Judgment: {count + 1}")
        pick = rng.randint(1, max(count, 1))
        label = self.label_for(prompt)
        if label is not None and rng.random() < b.select_correct:
            right = [i for i, value in enumerate(listed, 1) if value.strip() in {label, equivalent(label)}]
            if right:
                pick = rng.choice(right)
        return Scripted(think + f"Solution {pick} is the most convincing.\nJudgment: {pick}")
