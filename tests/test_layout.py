"""The layout shows the data flow: a few packages, each named for a part of it, in one order from the command line
down (`FLOW`); no part imports one above it, no import cycle anywhere (not through an import inside a function, not
through one under TYPE_CHECKING), and the top level holds at most ten modules: the rest lives in the packages."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agentroll"

# The parts of agentroll/ (its packages and top-level modules), from the command line down: each may import only
# parts below it. `agentroll` itself (the public names, each imported when asked for) and `__main__` stand above.
FLOW = (
    "cli",  # the `agentroll` command
    "sim",  # the simulated vLLM server (a command of its own)
    "audit",  # the logprob audit
    "torch",  # a folder as a PyTorch dataset
    "convert",  # trainer formats
    "tools",  # commands over a folder or a server: validate, report, view, doctor, rescore, distill
    "run",  # one `generate` run: runner, Ray driver, partitions, progress
    "engine",  # Generator, admission, pipeline, handshake, the options
    "systems",  # the agent systems
    "agents",  # bring your own agent: the recording proxy
    "context",  # what a system sees: token-exact calls, stages, turns, provenance
    "teacher",  # the teacher's client and scorer
    "toolcalls",  # the model's tool calls
    "rewards",  # scoring
    "sandbox",  # running untrusted code
    "client",  # the vLLM client and its wire format
    "folder",  # the output folder (the only code that touches its files)
    "settings",  # value objects every part shares
    "record",  # the sample, the group, the counters
    "inputs",  # prompt rows
    "render",  # chat templates, prompts
    "process",  # small process helpers
    "errors",  # exit codes
)
ENTRY = ("agentroll", "agentroll.__main__")
TOP_LIMIT = 10  # modules at the top of agentroll/, __init__ and __main__ included

# inside a part, what a module may not import (it is what imports it)
INSIDE = {
    "agentroll.context.stages": ("agentroll.context", "agentroll.context.calls"),
    "agentroll.context.calls": ("agentroll.context",),
    "agentroll.engine.admission": ("agentroll.engine.generator",),
    "agentroll.engine.handshake": ("agentroll.engine.generator",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, lazy: bool, typing: bool = False, source: str | None = None) -> set[str]:
    """The agentroll modules `path` imports (or `source`, as if it were there): at module level outside
    `if TYPE_CHECKING:`; `lazy`: inside functions too; `typing`: under TYPE_CHECKING too."""
    tree = ast.parse(path.read_text() if source is None else source)
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not typing:
                continue
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import | ast.ImportFrom) and (inner or lazy):
                if isinstance(child, ast.Import):
                    found.update(a.name for a in child.names if a.name.startswith("agentroll"))
                else:
                    base = child.module or ""
                    if child.level:
                        base = ".".join(
                            package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else [])
                        )
                    if base.startswith("agentroll"):
                        if child.module:  # `from . import x` imports the submodule x, not the package
                            found.add(base)
                        found.update(
                            f"{base}.{a.name}"
                            for a in child.names
                            if (PACKAGE.parent / f"{base}.{a.name}".replace(".", "/")).exists()
                            or (PACKAGE.parent / (f"{base}.{a.name}".replace(".", "/") + ".py")).exists()
                        )
            visit(child, inner)

    visit(tree, True)
    return found - {name}


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts}


@functools.cache
def graph(lazy: bool, typing: bool = False) -> dict[str, set[str]]:
    return {name: {m for m in imports(path, lazy, typing) if m in MODULES} for name, path in MODULES.items()}


def cycles_of(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])
    return cycles


def test_there_is_no_import_cycle_not_even_through_a_type_only_import():
    for lazy, typing in ((False, False), (True, False), (True, True)):  # module level; in functions; TYPE_CHECKING
        cycles = cycles_of(graph(lazy, typing))
        assert not cycles, (lazy, typing, cycles[:5])


def test_the_cycle_check_sees_a_circle_through_type_checking():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles_of(edges) == [["a", "b", "c", "a"]]
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..record.stats import RunStats\n"
    where = PACKAGE / "systems" / "probe.py"
    assert imports(where, lazy=True, source=code) == set()
    assert imports(where, lazy=True, typing=True, source=code) == {"agentroll.record.stats"}


def part_of(module: str) -> str:
    return module.split(".")[1]


def test_the_top_level_holds_at_most_ten_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LIMIT, top  # put a new module in the package of its part of the flow


def test_every_part_of_the_top_level_has_its_place_in_the_flow():
    parts = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    parts |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert sorted(parts - set(FLOW)) == []  # a new package: place it in FLOW, below what imports it
    assert sorted(set(FLOW) - parts) == []


def test_no_part_reaches_back_up_the_flow():
    rank = {part: i for i, part in enumerate(FLOW)}
    wrong = []
    for name, targets in graph(lazy=True, typing=True).items():
        if name in ENTRY:
            continue
        for target in targets:
            if target in ENTRY:
                if target != "agentroll" or not name.startswith("agentroll.cli"):  # cli: `__version__`
                    wrong.append((name, target))
            elif rank[part_of(target)] < rank[part_of(name)]:
                wrong.append((name, target))
    assert not wrong, wrong


def test_inside_a_part_no_module_imports_what_imports_it():
    edges = graph(lazy=True, typing=True)
    wrong = [(name, t) for name, forbidden in INSIDE.items() for t in edges[name] if t in forbidden]
    assert not wrong, wrong


def test_the_readme_development_section_names_every_package_and_module_of_the_top_level():
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme[readme.index("## Development") :]
    named = set(re.findall(r"`([a-z_]+)/?`", section))
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    top |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert sorted(top - named) == []  # a part the layout table does not place


# -- the output folder has one owner (agentroll/folder) -------------------------------------------------------------

FOLDER = "agentroll.folder"
READERS = ["reader", "follow", "shards", "routes", "layout", "manifest", "files", "keys", "raw"]
WRITING = {f"{FOLDER}.{name}" for name in ("writer", "recovery")}


def loaded_by(module: str) -> set[str]:
    """What importing `module` loads at module level: its imports, every package on its path (Python runs their
    __init__ first), and theirs in turn. The top package `agentroll` is left out: it gathers everything."""
    edges = graph(lazy=False)
    found: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(2, len(parts))]
        todo += [m for m in (*edges.get(name, ()), *parents) if m != "agentroll"]
    return found


def test_no_reader_of_the_folder_loads_its_writer():
    for name in [FOLDER, *(f"{FOLDER}.{r}" for r in READERS)]:
        assert name in MODULES, name
        assert not loaded_by(name) & WRITING, (name, sorted(loaded_by(name) & WRITING))


def test_the_writer_is_still_there_when_asked_for():
    import agentroll.folder as folder
    from agentroll.folder.writer import ShardWriter

    assert folder.ShardWriter is ShardWriter


def layout_names() -> tuple[str, ...]:
    from agentroll.folder import layout

    return (
        layout.MANIFEST,
        layout.STATE_DIR,
        layout.SHARD_PREFIX,
        layout.ROUTES,
        layout.PARTIAL,
        layout.FILTERED,
        ".keys",
        "plan.json",
    )


def spelled_names(tree: ast.AST, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """Strings (docstrings and prose aside: help, messages hold spaces) that spell a name of the folder's layout:
    a module that builds such a path opens the folder's files itself."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    found, inside = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if any(n in text for n in names) and not any(c.isspace() for c in text):
                found.append((node.lineno, text))
    skip = docs | inside
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) and id(node) not in skip else None
        if isinstance(text, str) and any(n in text for n in names) and not any(c.isspace() for c in text):
            found.append((node.lineno, text))
    return found


def test_no_module_outside_the_folder_package_spells_its_file_names():
    names = layout_names()
    wrong = [
        (name, line, text)
        for name, path in MODULES.items()
        if not name.startswith(FOLDER + ".") and name != FOLDER
        for line, text in spelled_names(ast.parse(path.read_text()), names)
    ]
    assert not wrong, wrong


def test_the_spelling_check_catches_a_path_built_by_hand():
    names = layout_names()
    code = 'open(folder / "manifest.json")\nsorted(folder.glob("rollouts-*.jsonl"))\nopen(f"{d}/.agentroll/lock")\n'
    assert [line for line, _ in spelled_names(ast.parse(code), names)] == [3, 1, 2]
    prose = 'raise OutputError(f"{out} holds no manifest.json")\nhelp = "shards as rollouts-NNNNN.jsonl.zst"\n'
    assert spelled_names(ast.parse(prose), names) == []


LIMIT = 420  # README's Development section: modules stay at about 400 lines at most


def test_no_module_is_longer_than_420_lines():
    lengths = {str(p.relative_to(PACKAGE.parent)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {path: n for path, n in lengths.items() if n > LIMIT}
    assert over == {}, over  # split along a line that makes sense, and say why in the docstrings
