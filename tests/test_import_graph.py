"""The import graph: no cycle between modules or between packages, the library never imports
the CLI, no module takes another's private names, and every function-local import says why.

A cycle hidden behind an import inside a function (or under ``TYPE_CHECKING``)
still means two modules that cannot be understood (or loaded) one without the
other; between packages (``gpuslate.proc`` -> ``gpuslate.host`` -> ... ->
``gpuslate.proc``) it means two layers that are one. A ``_private`` name
imported from another module is an interface nobody declared. A function-local
import is either there for a reason, named on its line (``# lazy: startup``:
keeps a command's start-up light, e.g. ``status`` never loads units/, aiohttp
or rich tables; ``# lazy: optional``: a package that may be absent, an extra
or a fallback), or it belongs at the top of its module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpuslate"
LAZY_REASONS = ("startup", "optional")

# Cycles known on this branch, each to be broken by the named work; an entry whose
# cycle is gone fails the test so that this list only ever shrinks.
KNOWN: dict[frozenset[str], str] = {}


def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = sources()
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


def package_of(module: str, packages: set[str]) -> str:
    """The first-level package a module belongs to (``gpuslate.gpu.simhost.host`` -> ``gpuslate.gpu``);
    a top-level module (``gpuslate.errors``) and the root package stand for themselves."""
    parts = module.split(".")
    first = ".".join(parts[:2])
    return first if first in packages else module


def package_graph(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {package_of(m, packages): set() for m in graph}
    for m, targets in graph.items():
        for t in targets:
            if package_of(t, packages) != package_of(m, packages):
                out[package_of(m, packages)].add(package_of(t, packages))
    return out


def first_level_packages() -> set[str]:
    return {f"gpuslate.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def cli_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(library module, cli module) for every import of the CLI from outside it (``__main__`` may)."""
    def in_cli(m: str) -> bool:
        return m == "gpuslate.cli" or m.startswith("gpuslate.cli.")
    return sorted((m, t) for m, ts in graph.items() for t in ts
                  if in_cli(t) and not in_cli(m) and m != "gpuslate.__main__")


def private_imports(source: str, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """``_name`` (not a module, not a dunder) imported by ``module`` from another gpuslate module."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")
            origin = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        if origin != "gpuslate" and not origin.startswith("gpuslate."):
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__") and f"{origin}.{name}" not in modules:
                found.append(f"{origin}.{name} (line {node.lineno})")
    return found


def unmarked_local_imports(source: str) -> list[int]:
    """Lines of imports inside a function whose first line has no ``# lazy: REASON`` marker."""
    lines = source.splitlines()
    found: list[int] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                line = lines[child.lineno - 1]
                if not any(f"# lazy: {why}" in line for why in LAZY_REASONS):
                    found.append(child.lineno)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def test_the_checker_finds_cycles_and_resolves_relative_imports():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    assert "gpuslate.errors" in graph["gpuslate.cli.exits"]  # from .. import errors
    assert "gpuslate.host.statedir" in graph["gpuslate.host.audit"]  # from .state import ...
    assert "gpuslate.proc.procfs" in graph["gpuslate.host.lock"]  # inside a function


def test_the_package_import_graph_has_no_cycle():
    found = [frozenset(c) for c in cycles(import_graph())]
    unexpected = [sorted(c) for c in found if c not in KNOWN]
    assert not unexpected, f"import cycles: {unexpected}"
    fixed = [sorted(c) for c in KNOWN if c not in found]
    assert not fixed, f"no longer cycles, remove them from KNOWN: {fixed}"


def test_the_package_checker_finds_a_loop_that_no_module_cycle_shows():
    # proc.terminate -> host.audit, host.snapshot -> gpu.types, gpu.sim.host -> proc.fdscan: three packages
    # in a loop, although no module imports back any module that imports it
    graph = {"gpuslate.proc.terminate": {"gpuslate.host.audit"}, "gpuslate.host.audit": set(),
             "gpuslate.host.snapshot": {"gpuslate.gpu.types"}, "gpuslate.gpu.types": set(),
             "gpuslate.gpu.simhost.host": {"gpuslate.proc.fdscan"}, "gpuslate.proc.fdscan": set(),
             "gpuslate.errors": set()}
    packages = {"gpuslate.proc", "gpuslate.host", "gpuslate.gpu"}
    assert cycles(graph) == []
    assert package_of("gpuslate.gpu.simhost.host", packages) == "gpuslate.gpu"
    assert package_of("gpuslate.errors", packages) == "gpuslate.errors"
    assert cycles(package_graph(graph, packages)) == [["gpuslate.gpu", "gpuslate.host", "gpuslate.proc"]]
    del graph["gpuslate.proc.terminate"]
    assert cycles(package_graph(graph, packages)) == []


def test_the_packages_import_each_other_in_no_loop():
    packages = first_level_packages()
    assert {"gpuslate.proc", "gpuslate.host", "gpuslate.gpu", "gpuslate.simserver", "gpuslate.cli"} <= packages
    graph = package_graph(import_graph(), packages)
    assert "gpuslate.proc" in graph["gpuslate.host"]  # the graph is really there
    assert cycles(graph) == [], "packages in a loop"


def test_the_library_never_imports_the_cli():
    graph = {"gpuslate.clearing.clear": {"gpuslate.cli.render.styled"},
             "gpuslate.cli.commands.clear": {"gpuslate.clearing.clear"},
             "gpuslate.__main__": {"gpuslate.cli.main"}}
    assert cli_imports(graph) == [("gpuslate.clearing.clear", "gpuslate.cli.render.styled")]
    assert cli_imports(import_graph()) == []


def test_no_module_imports_another_modules_private_names():
    modules = set(sources())
    bad = ("from ..cli.commands.ps import _duration\nfrom .. import _parse, __version__\n"
           "from .state import _helper, public\n")
    assert private_imports(bad, "gpuslate.remote.ssh", False, modules) == [
        "gpuslate.cli.commands.ps._duration (line 1)", "gpuslate.remote.state._helper (line 3)"]
    assert private_imports("from os import _exit\n", "gpuslate.x", False, modules) == []
    found = {name: private_imports(path.read_text(), name, path.name == "__init__.py", modules)
             for name, path in sources().items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_every_function_local_import_says_why_it_is_local():
    source = ("import os\n"
              "def f():\n"
              "    import json\n"
              "    from .x import (  # lazy: startup\n"
              "        a, b)\n"
              "    import aiohttp  # lazy: optional\n"
              "    def g():\n"
              "        import re  # lazy: because\n"
              "class C:\n"
              "    import sys\n")
    assert unmarked_local_imports(source) == [3, 8]
    found = {str(path.relative_to(PACKAGE.parent)): unmarked_local_imports(path.read_text())
             for path in sources().values()}
    assert {k: v for k, v in found.items() if v} == {}, (
        "imports inside functions without '# lazy: startup' or '# lazy: optional': move them to the top "
        "of the module, or say on the line why they must stay local")
