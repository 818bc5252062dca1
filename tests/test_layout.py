"""The layout shows the data flow: cli -> runner -> generator -> systems -> context -> client / rewards, and
runner -> folder (the only code that touches the output files). No module reaches back up; no import cycle, not
even through an import inside a function."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agentroll"

# a module's imports may not reach these (upward in the flow)
ABOVE = {
    "agentroll.folder": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.context",
        "agentroll.context.stages",
        "agentroll.context.calls",
        "agentroll.client",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.run.cluster",
    ),
    "agentroll.client": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.context",
        "agentroll.context.stages",
        "agentroll.context.calls",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.folder",
    ),
    "agentroll.context": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.folder",
    ),
    "agentroll.context.stages": (
        "agentroll.context",
        "agentroll.context.calls",
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.folder",
    ),
    "agentroll.context.calls": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.folder",
        "agentroll.context",
    ),
    "agentroll.systems": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.engine.pipeline",
        "agentroll.folder",
    ),
    "agentroll.agents": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.systems",
        "agentroll.engine.pipeline",
        "agentroll.folder",
    ),
    "agentroll.rewards": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.context",
        "agentroll.context.stages",
        "agentroll.context.calls",
        "agentroll.folder",
    ),
    "agentroll.engine.generator": ("agentroll.cli", "agentroll.run.runner"),
    "agentroll.engine.admission": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.folder",
    ),
    "agentroll.engine.handshake": (
        "agentroll.cli",
        "agentroll.run.runner",
        "agentroll.engine.generator",
        "agentroll.folder",
    ),
    "agentroll.run.runner": ("agentroll.cli",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, lazy: bool) -> set[str]:
    """The agentroll modules `path` imports: at module level (outside `if TYPE_CHECKING:`), or anywhere."""
    tree = ast.parse(path.read_text())
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
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


def graph(lazy: bool) -> dict[str, set[str]]:
    return {name: {m for m in imports(path, lazy) if m in MODULES} for name, path in MODULES.items()}


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


def test_there_is_no_import_cycle():
    for lazy in (False, True):  # at module level, and counting the imports inside functions too
        cycles = cycles_of(graph(lazy))
        assert not cycles, (lazy, cycles[:5])


def test_no_module_reaches_back_up_the_flow():
    edges = graph(lazy=True)
    wrong = []
    for name, targets in edges.items():
        for layer, forbidden in ABOVE.items():
            if name == layer or name.startswith(layer + "."):
                wrong += [(name, t) for t in targets if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert not wrong, wrong


def test_the_readme_development_section_names_every_module_and_package_of_the_top_level():
    readme = (PACKAGE.parent / "README.md").read_text()
    section = readme[readme.index("## Development") :]
    named = set(re.findall(r"`([a-z_]+)/?`", section))
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    top |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert sorted(top - named) == []  # a module the layout table does not place


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
