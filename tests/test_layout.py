"""The package's layout: no import cycle among toolreg's modules, `import toolreg` loads no
integration (the subpackages around the engine), and the module map (docs/contract.md A.12)
names every module, in an order the imports follow."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import toolreg

PACKAGE = Path(toolreg.__file__).parent
CONTRACT = PACKAGE.parent / "docs" / "contract.md"
SUBPACKAGES = ["adapters", "distributed", "mcp", "providers", "report"]  # the integrations


def modules() -> dict[str, Path]:
    """Every module of toolreg by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The toolreg modules `name` imports anywhere: at its top, inside a function, or under
    `TYPE_CHECKING` (a type-only import that closes a cycle still couples the two modules).
    Importing `a.b.c` imports the packages `a.b` and `a` first, unless they hold `name` (then
    they are being imported already: a package's `__init__` may load its own submodules)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets += [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:  # `from m import name`: the module m
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
        parent = target.rpartition(".")[0]
        while parent and not f"{name}.".startswith(f"{parent}."):
            found.add(parent)
            parent = parent.rpartition(".")[0]
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that is on one, as the path that closes it."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the path, "done" once explored
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                found.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def test_the_import_graph_sees_every_kind_of_import() -> None:
    graph = import_graph()
    assert "toolreg._cancel" in graph["toolreg._body"]  # at the top
    assert "toolreg.report._page" in graph["toolreg.report._cli"]  # inside a function
    assert "toolreg._catalog" in graph["toolreg._call"]  # under TYPE_CHECKING
    assert "toolreg" in graph["toolreg.mcp._cli"]  # `from .. import ToolRegistry`
    assert {"toolreg.mcp", "toolreg.mcp._cli"} <= graph["toolreg.__main__"]  # and its package


def test_no_import_cycle_among_toolregs_modules() -> None:
    # Dependencies point one way: a module that needs something of a module importing it
    # takes it as an argument, or the thing moves to the module it belongs to.
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_importing_toolreg_loads_no_integration() -> None:
    # Each integration (a subpackage, or toolreg.otel) loads only when its user imports it.
    assert sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py")) == SUBPACKAGES
    code = (
        "import sys, toolreg, toolreg.aio, toolreg.log, toolreg.process\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "[['toolreg', name] for name in sys.argv[1:]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *SUBPACKAGES, "otel"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def module_map() -> list[str]:
    """The modules docs/contract.md A.12 lists, in its order: the names in backticks that open
    each item, before its first `: ` (`mcp/_bridge` is toolreg.mcp._bridge, `mcp/` the
    package, `toolreg` the package itself)."""
    text = CONTRACT.read_text(encoding="utf-8")
    section = text.split("### A.12 The module map", 1)[1].split("\n#", 1)[0]
    items = re.findall(r"^- (.*(?:\n  .*)*)", section, flags=re.M)
    listed = []
    for item in items:
        for name in re.findall(r"`([^`]+)`", item.split(": ", 1)[0]):
            dotted = name.rstrip("/").replace("/", ".")
            listed.append(dotted if dotted == "toolreg" else f"toolreg.{dotted}")
    return listed


def test_the_module_map_names_every_module_once() -> None:
    listed = module_map()
    assert sorted(listed) == sorted(modules())


def test_the_module_map_lists_each_module_above_what_it_imports() -> None:
    order = {name: index for index, name in enumerate(module_map())}
    upward = sorted(
        f"{name} imports {imported}, listed above it"
        for name, imported_names in import_graph().items()
        for imported in imported_names
        if order.get(imported, len(order)) <= order.get(name, -1)
    )
    assert upward == []
