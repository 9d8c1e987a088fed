"""The shape of the units package: no import cycle, and a swap loads each unit once."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuslate
from gpuslate import Host
from gpuslate.proc.procfs import ProcessId
from gpuslate.units import UnitSpec, store
from gpuslate.units.fence import CgroupFence, Fence, ScopeFence, SessionFence, UnitMark, fence_of
from unitkit import free_port, serve_cmd

PKG = Path(gpuslate.__file__).parent


def module_imports(path: Path, package: str) -> set[str]:
    """Modules of gpuslate.units imported by ``path``, a module of ``package``: anywhere, since an
    import inside a function that dodges a cycle is still a cycle."""
    tree = ast.parse(path.read_text())
    here = package.split(".")
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            mod = ".".join(base + (node.module.split(".") if node.module else []))
            if node.module is None or node.level:
                names = [f"{mod}.{a.name}" for a in node.names]
                out.update(n for n in names if (PKG.parent / (n.replace(".", "/") + ".py")).exists())
            out.add(mod)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("gpuslate.units")}


def import_graph(folder: Path) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        name = "gpuslate.units" + ("" if path.stem == "__init__" else f".{path.stem}")
        graph[name] = module_imports(path, "gpuslate.units") - {name, "gpuslate.units"}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    seen: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        if seen.get(node) == 1:
            return stack[stack.index(node):] + [node]
        if seen.get(node) == 2:
            return None
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt, stack + [node])
            if cycle:
                return cycle
        seen[node] = 2
        return None

    for node in sorted(graph):
        cycle = visit(node, [])
        if cycle:
            return cycle
    return None


def test_units_package_has_no_import_cycle():
    graph = import_graph(PKG / "units")
    assert "gpuslate.units.store" in graph["gpuslate.units.listing"]  # the graph is read, not empty
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
    # and the check finds one where there is one
    assert find_cycle({**graph, "gpuslate.units.store": {"gpuslate.units.listing"}})


def test_each_containment_has_its_fence_type():
    base = {"schema": store.SCHEMA, "name": "u", "spec": {"name": "u", "command": ["x"]}, "phase": "ready",
            "pid": 10, "start_ticks": 5, "pgid": 10, "sid": 10, "cgroup": None, "log": "/tmp/u.log",
            "gpus": [0], "port": None, "env": {}, "launched_at": 1.0}
    kinds = {"session": SessionFence, "cgroup": CgroupFence, "scope": ScopeFence}
    for kind, cls in kinds.items():
        cg = None if kind == "session" else "/gpuslate-u-0123abcd"
        fence: Fence = fence_of(store.UnitRecord.from_json({**base, "containment": kind, "cgroup": cg}), "/state")
        assert type(fence) is cls and fence.kind == kind and fence.cgroup == cg
        assert fence.kill() is False  # nothing to kill: no such cgroup, and a session cannot
    # only a fence without a cgroup pays for reading every process's environment
    assert fence_of(store.UnitRecord.from_json({**base, "containment": "session"}), "/state").scan_marker  # type: ignore[union-attr]
    mark = UnitMark("u", "0" * 32, "/state")
    assert not CgroupFence("/x", SessionFence(mark, ProcessId(10, 5), 10, 10, scan_marker=False)).session.scan_marker


def test_swap_reads_each_unit_record_once(units_host, monkeypatch):
    port = free_port()
    old = UnitSpec("old", command=serve_cmd(port, startup=0.1), gpus=[0], port=port)
    host = Host.open()
    assert host.up(old).ok
    new = UnitSpec("new", command=serve_cmd(port, startup=0.1), gpus=[0], port=port)
    reads: list[str] = []
    real = store.UnitStore.read

    def counting(self: store.UnitStore, name: str):
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(store.UnitStore, "read", counting)
    result = host.swap("old", new)
    assert result.ok, result.to_json()
    # swap reads both units once, under the lock, and hands them to its phases, which read neither
    # again (the pre-flight's listing of every unit, for who holds a GPU, finds no record of NEW yet)
    assert reads == ["old", "new"], reads
    assert host.down("new").ok
