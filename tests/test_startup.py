"""A command imports what it needs (docs/performance.md, "Start-up"): the folder commands read a folder without
loading the HTTP client or the generate stack (they import `cli.folders` alone, not `cli.rescore`)."""

from __future__ import annotations

from .conftest import TOKENIZER, cli_at_exit, run_cli

# which of the heavy modules the command had imported as it ended
LOADED = (
    '"loaded", *[m for m in ("aiohttp", "agentroll.client", "agentroll.run.runner", "agentroll.engine.generator", '
    '"transformers") if m in sys.modules]'
)


def loaded(*args: str) -> tuple[int, str]:
    return cli_at_exit(LOADED, *args)


def test_folder_commands_do_not_load_the_http_client(sim, problems, tmp_path):
    done = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url,
                   "--tokenizer", TOKENIZER, "--limit", "2", "-q")  # fmt: skip
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
