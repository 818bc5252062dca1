from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readmes_test_command_word_for_word():
    ci_command = ROOT.joinpath(".ci", "run").read_text().strip().splitlines()[-1]
    readme = ROOT.joinpath("README.md").read_text()
    assert ci_command.startswith("pip install") and f"\n{ci_command}\n" in readme


def test_the_readme_documents_every_generate_flag():
    from typer.main import get_command

    from agentroll.cli import app

    generate = get_command(app).commands["generate"]  # type: ignore[attr-defined]
    readme = ROOT.joinpath("README.md").read_text()
    missing = [opt for p in generate.params for opt in p.opts if opt.startswith("--") and f"`{opt}" not in readme]
    assert missing == []
