"""Readable tables for people (rich). JSON output never comes through here."""

from __future__ import annotations

from typing import IO, Any

from .._parse import format_gpu_list, format_size
from ..proc.procfs import read_info
from ..host.snapshot import GpuState, HolderProcess, Snapshot


def console(file: IO[str] | None = None) -> Any:
    """A rich console; piped output keeps every column whole instead of squeezing to 80."""
    import sys

    from rich.console import Console

    out = file or sys.stdout
    return Console(file=out, highlight=False, width=None if out.isatty() else 200)


def _na(v: object, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def _memory_cell(g: GpuState) -> str:
    m = g.memory
    if m is None:
        return "[red]unknown[/]"
    pct = 100 * m.used / m.total if m.total else 0
    color = "green" if m.used == 0 else ("yellow" if pct < 90 else "red")
    return f"[{color}]{format_size(m.used)}[/]/{format_size(m.total)}"


def one_line(text: str | None, limit: int = 100) -> str:
    """Commands can hold newlines (python -c) and run long: a table row shows
    one line, cut with an ellipsis (``--json`` has the whole command)."""
    from rich.markup import escape

    line = " ".join((text or "").split())
    return escape(line if len(line) <= limit else line[: limit - 1] + "…")


def _launcher_label(root_pid: int, members: list[HolderProcess], local: bool) -> str:
    if any(p.pid == root_pid for p in members):
        return ""
    if not local:  # another host's launcher: this host's /proc knows nothing of it
        return "(holds no GPU itself)"
    info = read_info(root_pid)
    return f"{info.user}  {one_line(info.command)}" if info else "(exited)"


def _stronger(a: str, b: str) -> str:
    return a if a != "handle" else b


def status_renderable(snap: Snapshot, *, local: bool = True) -> Any:
    """The status view; ``local=False`` for another host's snapshot (nothing is read from this /proc)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.from_markup(
        f"[bold]{snap.host}[/]  backend [cyan]{snap.backend}[/]  driver {snap.driver_version or '-'}  "
        f"[dim]{time_label(snap.taken_at)}[/]"
    )
    # fits 80 columns: only the model name may be cut, never a number
    gpus = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for col, just in (("GPU", "right"), ("Name", "left"), ("Memory used/total", "right"),
                      ("Reserved", "right"), ("Util", "right"), ("Temp", "right"),
                      ("Power", "right"), ("Perf", "left"), ("", "left")):
        gpus.add_column(col, justify=just, no_wrap=col != "", overflow="ellipsis",  # type: ignore[arg-type]
                        max_width=22 if col == "Name" else None)
    for g in snap.gpus:
        r = g.reading
        gpus.add_row(
            str(r.index), (r.name or "-").removeprefix("NVIDIA "), _memory_cell(g),
            format_size(r.memory.reserved) if r.memory else "-",
            _na(r.utilization_pct, "{}%"), _na(r.temperature_c, "{}°C"),
            f"{_na(r.power_w, '{:.0f}')}/{_na(r.power_limit_w, '{:.0f}')}W",
            r.pstate or "-",
            f"[red]error: {r.error}[/]" if r.error else "",
        )

    procs = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for col, just in (("GPU", "right"), ("PID", "right"), ("Kind", "left"), ("GPU memory", "right"),
                      ("User", "left"), ("Command", "left")):
        procs.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    # one row per process (its GPUs together), grouped under the job's launcher
    rows: dict[int, dict[int, tuple[HolderProcess, list[int]]]] = {}
    for g in snap.gpus:
        for p in g.processes:
            job = rows.setdefault(p.root_pid, {})
            if p.pid in job:
                first, gl = job[p.pid]
                used = None if first.used_memory is None and p.used_memory is None else \
                    (first.used_memory or 0) + (p.used_memory or 0)
                job[p.pid] = (first._replace(used_memory=used, kind=_stronger(first.kind, p.kind)), gl + [g.index])
            else:
                job[p.pid] = (p, [g.index])
    for root, members in rows.items():
        label = _launcher_label(root, [m for m, _ in members.values()], local)
        if label:
            procs.add_row("", str(root), "[dim]launcher[/]", "", "", f"[dim]{label}[/]")
        for p, gl in sorted(members.values(), key=lambda m: (m[0].pid != root, min(m[1]), m[0].pid)):
            branch = "" if p.pid == root else "└ "
            kind = f"[dim]{p.kind}[/]" if p.kind == "handle" else p.kind
            cmd = one_line(p.command) if p.visible else "[dim](exited, or not visible from this host's /proc)[/]"
            if p.container:
                cmd = f"[magenta]container {p.container}[/] {cmd}"
            procs.add_row(format_gpu_list(gl), f"{branch}{p.pid}", kind,
                          format_size(p.used_memory) if p.used_memory is not None else "-", p.user or "-", cmd)
    any_proc = bool(rows)
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
    console().print(status_renderable(snap))
