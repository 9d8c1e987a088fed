"""The package's import graph has no cycle, function-level imports included.

A cycle hidden behind an import inside a function still means two modules
that cannot be understood (or loaded) one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpuslate"

# Cycles known on this branch, each to be broken by the named work; an entry whose
# cycle is gone fails the test so that this list only ever shrinks.
KNOWN: dict[frozenset[str], str] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):  # every import, at any depth
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_cycles_and_resolves_relative_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "gpuslate.errors" in graph["gpuslate.cli.exits"]  # from .. import errors
    assert "gpuslate.host.state" in graph["gpuslate.host.audit"]  # from .state import ...
    assert "gpuslate.proc.procfs" in graph["gpuslate.host.lock"]  # inside a function


def test_the_package_import_graph_has_no_cycle():
    found = [frozenset(c) for c in cycles(import_graph())]
    unexpected = [sorted(c) for c in found if c not in KNOWN]
    assert not unexpected, f"import cycles: {unexpected}"
    fixed = [sorted(c) for c in KNOWN if c not in found]
    assert not fixed, f"no longer cycles, remove them from KNOWN: {fixed}"
