"""The installed package's shape: no import cycles inside codepool, and nothing in it
that only the tests use (test scaffolding lives in tests/; benches users run ship)."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def shipped_modules() -> dict[str, Path]:
    """Every module ``pip install .`` installs, by dotted name, from pyproject's packages
    and package-dir (the same list setuptools builds the wheel from)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {}
    for package in config["packages"]:
        folder = ROOT / config["package-dir"][package]
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _imports(tree: ast.Module, typing: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports at module level or inside functions (a lazy import is still a
    dependency); those under ``if TYPE_CHECKING`` only when ``typing`` is set (a type-only
    import is still a dependency of the reader, but not one that runs)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path], typing: bool = False) -> dict[str, set[str]]:
    """Module -> the codepool modules it imports (type-only imports too with ``typing``).
    ``from P import m`` counts as importing ``P.m`` when that is a module; a module's own
    parent packages are left out (Python imports them before it anyway)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text()), typing):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
        ancestors = {name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)}
        graph[name] = {t for t in targets if t in modules and t != name and t not in ancestors}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    """Type-only imports count: a cycle a reader must follow is a cycle, even when
    ``TYPE_CHECKING`` keeps it from running."""
    assert cycles(import_graph(shipped_modules(), typing=True)) == []


def test_type_only_imports_are_seen() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\nimport c\n"
    )

    def names(typing: bool) -> list[str]:
        return sorted(node.names[0].name for node in _imports(tree, typing))

    assert names(typing=True) == ["TYPE_CHECKING", "b", "c"]
    assert names(typing=False) == ["TYPE_CHECKING", "c"]


def test_cycle_finder_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def _strings(tree: ast.Module) -> Iterator[str]:
    """The string values code uses (a ``-m`` target, a boot string), not docstrings or
    comments: a module named only in prose is not reached."""
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            yield node.value


def test_strings_leave_out_comments_and_docstrings() -> None:
    tree = ast.parse('"""codepool.a"""\n# codepool.b\nrun("-m", "codepool.c")\n')
    assert list(_strings(tree)) == ["-m", "codepool.c"]


def test_nothing_ships_that_only_tests_use() -> None:
    """Every installed module is reached from what users run: the ``codepool`` command,
    a package, a module run as a script or by name (``-m``, a boot string), or one of
    those's imports. What only tests import belongs in tests/."""
    modules = shipped_modules()
    graph = import_graph(modules)
    sources = {name: path.read_text() for name, path in modules.items()}
    strings = "\n".join(s for source in sources.values() for s in _strings(ast.parse(source)))
    named = set(re.findall(r"codepool(?:\.\w+)+", strings))
    reached = [
        name
        for name, path in modules.items()
        if path.stem == "__init__" or name in named or 'if __name__ == "__main__"' in sources[name]
    ]
    reached.append("codepool.ops.cli")
    seen: set[str] = set()
    while reached:
        name = reached.pop()
        if name not in seen:
            seen.add(name)
            reached.extend(graph[name])
    assert sorted(set(modules) - seen) == []
    assert not [
        name
        for name, source in sources.items()
        if re.search(r"^\s*(from|import) tests\b", source, re.M)
    ]
