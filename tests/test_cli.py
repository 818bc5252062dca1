"""The command line as a user meets it: help that reads at 80 and 160 columns, our own one-line errors."""

from __future__ import annotations

import itertools
import json
import re
import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentroll import __version__
from agentroll.cli import app
from agentroll.cli.generate import PANEL_OF, PANELS

from .conftest import TOKENIZER, read_records, run_cli

runner = CliRunner()


def help_of(*args: str, columns: int) -> str:
    return runner.invoke(app, [*args, "-h"], env={"COLUMNS": str(columns)}, terminal_width=columns).output


@pytest.mark.parametrize("columns", [80, 160])
def test_generate_help_groups_its_options_in_panels_and_shows_values_only_where_taken(columns):
    text = help_of("generate", columns=columns)
    assert re.search(r"Usage: .* generate \[OPTIONS\] \[INPUT\]", text)  # optional: --mix takes its place
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels[0] == "Arguments" and panels[1:] == list(PANELS)
    assert "<bool>" not in text and "{INPUT}" not in text
    assert re.search(r"--overwrite\s{2,}Delete", text)  # a flag: no value after it
    assert re.search(r"--base-url\s+URL\s", text) and re.search(r"--top-k\s+N\s", text)
    flat = re.sub(r"[\s│]+", " ", text)  # the help column's lines joined
    assert "[default: the cluster's" in flat and "(Ray tasks) ." not in flat  # our brackets survive typer's markup
    assert max(len(line) for line in text.splitlines()) <= columns


def test_every_generate_option_has_a_panel():
    from typer.main import get_command

    command = get_command(app).commands["generate"]  # type: ignore[attr-defined]
    names = {p.name for p in command.params} - {"input", "help"}
    assert names <= set(PANEL_OF), sorted(names - set(PANEL_OF))


def test_version_and_short_help():
    assert runner.invoke(app, ["--version"]).output.strip() == f"agentroll {__version__}"
    assert "Usage:" in runner.invoke(app, ["-h"]).output
    assert "<bool>" not in runner.invoke(app, ["-h"]).output


def test_data_in_an_error_is_never_read_as_markup_or_emoji(sim, tmp_path):
    path = tmp_path / "l100.jsonl"
    path.write_text("\n" * 99 + "{not json [red]x[/red] :100:\n")
    proc = run_cli("generate", str(path), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER)
    assert proc.returncode == 3
    assert f"{path}:100: malformed JSON".encode() in proc.stderr
    assert "💯".encode() not in proc.stderr


def whole(figure: str, text: str) -> bool:
    """`figure` appears in `text` in one piece (not folded onto two lines, not cut, not part of a longer one)."""
    return re.search(rf"(?<![\w./]){re.escape(figure)}(?![\w./])", text) is not None


def figures_of(records: list[dict]) -> set[str]:
    """Figures the tables show: per stage its record count and tokens (prompt/response)."""
    shown = set()
    for stage in {r["stage"] for r in records}:
        mine = [r for r in records if r["stage"] == stage]
        if not mine:
            continue
        prompt = sum(len(r["prompt_token_ids"]) for r in mine)
        response = sum(len(r["response_token_ids"]) for r in mine)
        shown |= {str(len(mine)), f"{prompt}/{response}"}
    return shown


@pytest.mark.parametrize("columns", [80, 160])
def test_tables_never_cut_or_fold_a_figure_and_keep_to_the_width(sim, problems, tmp_path, columns):
    """At `COLUMNS` wide (honoured when piped, as under CliRunner): the run's summary and `stats --by` show every
    figure whole, and no line is wider than the terminal."""
    env = {"COLUMNS": str(columns)}
    topics = ["algebra", "geometry", "number-theory", "combinatorics", "probability"]
    rows = [json.loads(line) for line in problems.read_text().splitlines()]
    problems.write_text("".join(json.dumps({**r, "topic": topics[i % 5]}) + "\n" for i, r in enumerate(rows)))
    run = runner.invoke(
        app,
        ["generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", sim.url, "--tokenizer", TOKENIZER],
        env=env,
    )
    assert run.exit_code == 0, run.output
    figures = figures_of(read_records(tmp_path / "out"))
    summary = run.stderr[run.stderr.index("agentroll generate:") :]
    assert [f for f in figures if not whole(f, summary)] == []
    table = [line for line in summary.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= columns
    stats = runner.invoke(app, ["stats", str(tmp_path / "out"), "--by", "topic"], env=env)
    assert stats.exit_code == 0
    assert "…" not in stats.output and max(len(line) for line in stats.output.splitlines()) <= columns
    records = read_records(tmp_path / "out")
    for topic in topics:
        figures |= figures_of([r for r in records if r["metadata"]["topic"] == topic])
    assert [f for f in figures if not whole(f, stats.output)] == []
    assert [t for t in topics if not whole(f"topic={t}", stats.output)] == []


def test_a_base_url_without_a_scheme_is_a_usage_error(problems, tmp_path):
    proc = run_cli("generate", str(problems), "-o", str(tmp_path / "out"), "--base-url", "localhost:8000")
    assert proc.returncode == 2 and b"expected http://HOST[:PORT]" in proc.stderr


def test_serve_sim_says_a_port_in_use_and_a_missing_answers_file_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("serve-sim", "--port", str(port))
    assert proc.returncode == 2 and b"in use" in proc.stderr and b"Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("serve-sim", "--answers", str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 2 and b"no such file" in proc.stderr and b"Traceback" not in proc.stderr


def test_doctor_names_a_model_that_is_not_served(sim):
    proc = run_cli("doctor", "--base-url", sim.url, "--model", "nope", "--tokenizer", TOKENIZER)
    assert proc.returncode == 1
    assert b"model 'nope' is not served (available: agentroll-sim)" in proc.stdout
    assert b"pass --model" not in proc.stderr


def test_serve_sim_names_the_file_and_line_of_a_bad_answers_row_and_says_a_folder_is_a_folder(tmp_path):
    bad = tmp_path / "answers.jsonl"
    bad.write_text('{"prompt": "1+1?", "label": "2"}\n{"prompt": oops}\n')
    proc = run_cli("serve-sim", "--answers", str(bad), "--port", "0")
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert f"{bad}:2: malformed JSON".encode() in proc.stderr
    bad.write_text('{"prompt": "1+1?", "label": "2"}\n\n["a list"]\n')
    proc = run_cli("serve-sim", "--answers", str(bad), "--port", "0")
    assert proc.returncode == 2 and f"{bad}:3: expected a JSON object".encode() in proc.stderr
    proc = run_cli("serve-sim", "--answers", str(tmp_path), "--port", "0")
    assert proc.returncode == 2 and f"--answers {tmp_path}: is a folder, not a file".encode() in proc.stderr


def commands() -> dict[str, object]:
    from typer.main import get_command

    group = get_command(app)
    return {"": group} | {n: c for n, c in group.commands.items() if not c.hidden}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(commands()))
@pytest.mark.parametrize("columns", [80, 160])
def test_no_help_cuts_a_flag_name_or_a_metavar(name, columns):
    command = commands()[name]
    text = help_of(*([name] if name else []), columns=columns)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= columns

    def whole(word: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None

    shown = []
    for param in command.params:  # type: ignore[attr-defined]
        if getattr(param, "hidden", False):
            continue
        shown += [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []
        if param.metavar:
            shown.append(param.metavar)
    assert shown and [w for w in shown if not whole(w)] == []
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert "{" not in usage and "}" not in usage and "......" not in usage
    assert not re.search(r"<(str|path|int|list\[\w+\])>", text)  # Python's types are not the user's words


def test_every_option_names_its_value_in_the_users_words():
    for name, command in commands().items():
        for param in command.params:  # type: ignore[attr-defined]
            assert param.metavar != "TEXT", (name, param.name)
    assert "AutoTokenizer" not in help_of("generate", columns=160)


def test_merge_usage_reads_dir_once():
    assert re.search(r"merge \[OPTIONS\] DIR\.\.\.\s*$", help_of("merge", columns=160), re.M)


TYPED = {
    int: ["3", "-1", " 7 ", "+5", "1.0", "1.00", "-0.0", "1.5", "abc", "", "1e3", "1_000", "1__0", "_1", "inf"],
    float: ["0.5", "1e3", "-2", " 3 ", "nan", "inf", "-inf", "x", "", "1_0"],
    bool: ["true", "False", "1", "0", "yes", "no", "on", "off", "T", "n", "maybe", ""],
    str: ["x", "", " a b "],
    Path: ["a/b", "-", "~"],
}


@pytest.mark.parametrize("kind", list(TYPED), ids=lambda k: k.__name__)
def test_our_value_conversion_does_what_typers_pydantic_adapters_do(kind):
    """Our commands convert their values without pydantic (agentroll/cli/values.py): the same values come out,
    and what typer refuses we refuse, on what a user may type."""
    from typer._coercion import build_runtime_param, resolve_type_descriptor
    from typer.models import OptionInfo

    from agentroll.cli.values import Plain

    descriptor = resolve_type_descriptor(kind, OptionInfo())
    theirs, ours = build_runtime_param(descriptor), Plain(OptionInfo(), kind, kind=kind)

    def outcome(converter, text):
        try:
            value = converter._coerce_value(text, param=None, ctx=None)
        except typer.BadParameter:
            return "refused"
        return "nan" if value != value else (type(value), value)

    assert {t: outcome(ours, t) for t in TYPED[kind]} == {t: outcome(theirs, t) for t in TYPED[kind]}


def test_generate_parses_its_options_without_pydantic():
    import subprocess
    import sys

    probe = (
        "import sys, agentroll.cli.generate as g, agentroll.cli as c\n"
        "def stop(run, options, *a, **k):\n"
        "    others = [m for m in ('audit', 'folders', 'servers') if 'agentroll.cli.' + m in sys.modules]\n"
        "    print(sorted(options.items()), others, 'pydantic' in sys.modules); raise SystemExit(0)\n"
        "g.run_generate = stop\n"
        "sys.argv = ['agentroll', 'generate', 'in.jsonl', '-o', 'out', '--limit', '1.0', '--temperature', '0.5',"
        " '--stage', 'a.top_k=2', '--stage', 'b.top_k=3']\n"
        "c.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("[] False")  # neither pydantic nor the other commands were imported
    assert "('stage', ['a.top_k=2', 'b.top_k=3'])" in done.stdout and "('temperature', 0.5)" in done.stdout


def test_each_command_is_built_from_the_module_main_imports_for_it():
    from typer.main import get_command

    from agentroll.cli import COMMANDS, MODULES, build

    for module in MODULES:
        built = set(get_command(build((module,))).commands)  # type: ignore[attr-defined]
        assert built == {name for name, owner in COMMANDS.items() if owner == module}, module
    assert set(get_command(app).commands) == set(COMMANDS)  # type: ignore[attr-defined]


def test_a_log_line_on_a_terminal_is_not_refitted_as_a_table():
    """RichHandler draws each log line as a rich grid: it must keep its own layout (the level column whole)."""
    import io
    import logging

    from rich.logging import RichHandler

    from agentroll.cli.console import Terminal

    console = Terminal(file=io.StringIO(), width=40, force_terminal=True, color_system=None, markup=False)
    handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
    record = logging.LogRecord("agentroll", logging.WARNING, __file__, 1, "a long message " * 6, None, None)
    handler.emit(record)
    lines = console.file.getvalue().splitlines()
    assert lines[0].startswith("WARNING ") and all(len(line) <= 40 for line in lines)


@pytest.mark.parametrize("columns", [100, 160])
def test_the_command_list_fills_each_line_and_breaks_only_where_it_is_full(columns):
    """`agentroll -h` lists each command's first paragraph rewrapped to the terminal: a docstring's own line breaks
    (convert's list of trainers, view's modes, audit's exit codes) no longer break a line half-full."""
    text = help_of(columns=columns)
    panel = text[text.index("Commands") :]
    rows = [line.strip("│ ").rstrip() for line in panel.splitlines()[1:] if line.startswith("│")]
    width = max(len(line) for line in panel.splitlines() if line.startswith("│")) - 4
    for first, after in itertools.pairwise(rows):
        if not re.match(r"[a-z-]+ {2,}", after):  # a continued description
            words = after.split()
            assert len(first) + 1 + len(words[0]) > width - 12, (first, after)  # the next word did not fit
    flat = re.sub(r"[\s│]+", " ", panel)
    assert "slime, Megatron, verl, OpenRLHF, prime-rl" in flat and "(following a live run), or written" in flat
