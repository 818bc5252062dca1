"""A command imports what it needs (docs/performance.md, "Start-up"): the folder commands read a folder without
loading the HTTP client or the generate stack (they import `cli.folders` alone, not `cli.rescore`)."""

from __future__ import annotations

import subprocess
import sys

from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, run_cli

# the real command line, saying as the process ends which of the heavy modules it had imported
COMMAND = """
import atexit, sys
heavy = ("aiohttp", "agentroll.client", "agentroll.runner", "agentroll.generator", "transformers")
atexit.register(lambda: print("loaded", *[m for m in heavy if m in sys.modules], file=sys.stderr))
sys.argv = ["agentroll", *sys.argv[1:]]
from agentroll.cli import main
main()
"""


def loaded(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", COMMAND, *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr.strip().splitlines()[-1]


def test_folder_commands_do_not_load_the_http_client(problems, tmp_path):
    server = SimServer(script=Script.from_jsonl(problems))
    server.start()
    try:
        done = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", server.url,
                       "--tokenizer", TOKENIZER, "--limit", "2", "-q")  # fmt: skip
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr.decode()
    out = str(tmp_path / "out")
    for command in (
        ("stats", out),
        ("validate", out),
        ("inspect", out),
        ("convert", out, "-o", str(tmp_path / "trl"), "--to", "trl"),
        ("report", out, "-o", str(tmp_path / "report.html")),
    ):
        assert loaded(*command) == (0, "loaded"), command
    code, said = loaded("rescore", out, "-o", str(tmp_path / "new"), "--reward", "exact", "-q")
    assert code == 0 and "aiohttp" in said  # the one that scores: its rewards may call a server
