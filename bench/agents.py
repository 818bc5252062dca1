"""An OpenAI Agents SDK agent run as a program (one process per execution) and as a function (one process for the
run): the wall clock of `agentroll generate --system agent` each way, against the simulated server.

    python bench/agents.py                       # 8 problems x 4 executions, each form
    python bench/agents.py --problems 16 --k 8

A program pays its interpreter's start-up and the SDK's import on every execution; a function pays them once. Both
use the SDK's defaults (the Responses API) and one function tool.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, TOKENIZER, start_sim, stop, write_problems

TOOL = '''
from agents import Agent, Runner, function_tool


@function_tool
def python(code: str) -> str:
    """Run Python code and see what it prints.

    Args:
        code: the program
    """
    return "17"  # not run: the simulated model's code may loop forever, and start-up is what is measured


AGENT = Agent(name="solver", instructions="Use the python tool.", tools=[python])
'''
PROGRAM = (
    TOOL
    + """
import json, sys
print(Runner.run_sync(AGENT, json.load(sys.stdin)["prompt"]).final_output)
"""
)
FUNCTION = (
    TOOL
    + """
from agents import OpenAIResponsesModel


async def run(client, problem):
    agent = AGENT.clone(model=OpenAIResponsesModel(model="m", openai_client=client))
    return (await Runner.run(agent, problem["prompt"])).final_output
"""
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--k", type=int, default=4, help="executions per problem")
    args = parser.parse_args()
    sim, url = start_sim(latency=0.0, reasoning_words=12)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            problems = write_problems(work / "p.jsonl", args.problems)
            (work / "program.py").write_text(PROGRAM)
            (work / "function.py").write_text(FUNCTION)
            forms = {
                "program": f"command={sys.executable} {work / 'program.py'}",
                "function": f"agent={work / 'function.py'}:run",
            }
            for name, option in forms.items():
                command = [sys.executable, "-m", "agentroll", "generate", str(problems), "-o", str(work / name)]
                command += ["--base-url", url, "--tokenizer", str(TOKENIZER), "--system", "agent", "-q"]
                command += ["--system-option", option, "--samples-per-prompt", str(args.k), "--reward", "exact"]
                started = time.monotonic()
                done = subprocess.run(
                    command,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                wall = time.monotonic() - started
                executions = args.problems * args.k
                print(
                    f"{name:8s} exit {done.returncode}  {executions} executions in {wall:6.1f} s "
                    f"({executions / wall:5.2f}/s){'  ' + done.stderr[-300:] if done.returncode else ''}"
                )
    finally:
        stop(sim)


if __name__ == "__main__":
    main()
