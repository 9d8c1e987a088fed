"""Readable tables for people (rich). JSON output never comes through here."""

from __future__ import annotations

from typing import Any

from .._parse import format_size
from ..proc.procfs import read_info
from ..snapshot import GpuState, HolderProcess, Snapshot


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def _na(v: object, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def _memory_cell(g: GpuState) -> str:
    m = g.memory
    if m is None:
        return "[red]unknown[/]"
    pct = 100 * m.used / m.total if m.total else 0
    color = "green" if m.used == 0 else ("yellow" if pct < 90 else "red")
    return f"[{color}]{format_size(m.used)}[/] / {format_size(m.total)}"


def _launcher_label(root_pid: int, members: list[HolderProcess]) -> str:
    for p in members:
        if p.pid == root_pid:
            return ""
    info = read_info(root_pid)
    cmd = info.command if info else "?"
    user = info.user if info else "?"
    return f"{root_pid} {user} {cmd}"


def status_renderable(snap: Snapshot) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.from_markup(
        f"[bold]{snap.host}[/]  backend [cyan]{snap.backend}[/]  driver {snap.driver_version or '-'}  "
        f"[dim]{time_label(snap.taken_at)}[/]"
    )
    gpus = Table(box=None, pad_edge=False, header_style="bold")
    for col, just in (("GPU", "right"), ("Name", "left"), ("Memory used / total", "right"),
                      ("Reserved", "right"), ("Util", "right"), ("Temp", "right"),
                      ("Power / limit", "right"), ("Perf", "left"), ("Procs", "right"), ("", "left")):
        gpus.add_column(col, justify=just)  # type: ignore[arg-type]
    for g in snap.gpus:
        r = g.reading
        holders = [p for p in g.processes if p.kind != "handle"]
        gpus.add_row(
            str(r.index), r.name or "-", _memory_cell(g),
            format_size(r.memory.reserved) if r.memory else "-",
            _na(r.utilization_pct, "{}%"), _na(r.temperature_c, "{}°C"),
            f"{_na(r.power_w, '{:.0f}')} / {_na(r.power_limit_w, '{:.0f}')} W",
            r.pstate or "-", str(len(holders)),
            f"[red]error: {r.error}[/]" if r.error else "",
        )

    procs = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for col, just in (("GPU", "right"), ("PID", "right"), ("Kind", "left"), ("GPU memory", "right"),
                      ("User", "left"), ("Command", "left")):
        procs.add_column(col, justify=just, overflow="fold" if col == "Command" else "ellipsis")  # type: ignore[arg-type]
    any_proc = False
    for g in snap.gpus:
        groups: dict[int, list[HolderProcess]] = {}
        for p in g.processes:
            groups.setdefault(p.root_pid, []).append(p)
        for root, members in groups.items():
            label = _launcher_label(root, members)
            if label:
                procs.add_row(str(g.index), "", "[dim]launcher[/]", "", "", f"[dim]{label}[/]")
            for p in sorted(members, key=lambda p: (p.pid != root, p.pid)):
                any_proc = True
                branch = "" if p.pid == root and not label else "└ "
                kind = f"[dim]{p.kind}[/]" if p.kind == "handle" else p.kind
                cmd = p.command if p.visible else "[dim](not visible from this host's /proc)[/]"
                if p.container:
                    cmd = f"[magenta]container {p.container}[/] {cmd}"
                procs.add_row(str(g.index), f"{branch}{p.pid}", kind, format_size(p.used_memory)
                              if p.used_memory is not None else "-", p.user or "-", cmd)
    parts: list[Any] = [head, gpus, Text("")]
    parts.append(procs if any_proc else Text("No processes hold the selected GPUs.", style="green"))
    if snap.host_processes:
        others = ", ".join(f"{p.pid} ({p.name})" for p in snap.host_processes)
        parts.append(Text(f"Holding only control devices (nvidiactl/uvm): {others}", style="dim"))
    for w in snap.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    return Group(*parts)


def time_label(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def print_status(snap: Snapshot) -> None:
    _console().print(status_renderable(snap))
