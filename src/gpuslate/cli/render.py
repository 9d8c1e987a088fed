"""Readable tables for people (rich). JSON output never comes through here.

Everything shown that comes from a process (its title, command line, user,
container, the audit log's copy of them) goes through :func:`safe` first: a
process can name itself ``\\e[2J\\e[31m...`` and must not drive the terminal
of whoever looks at it. ``gpuslate logs`` alone prints a server's own output
raw, as ``docker logs`` does.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from .._parse import format_gpu_list, format_size
from ..host.snapshot import GpuState, HolderProcess, Snapshot
from ..proc.procfs import read_info

#: C0 controls, DEL, C1 controls -> ``\xNN``; bidirectional overrides -> ``\uNNNN`` (they reorder what follows)
_ESCAPES: dict[int, str] = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_ESCAPES.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})

#: width of piped output: wide enough that no column is ever cut
PIPE_WIDTH = 1000


def safe(text: object) -> str:
    """``text`` with every control character shown as an escape, never sent to the terminal.

    One ``str.translate``: cheap enough for every cell of every table.
    """
    return str(text).translate(_ESCAPES)


def cell(text: object) -> str:
    """A table cell from process data: escaped for the terminal and for rich markup."""
    from rich.markup import escape

    return escape(safe(text))


def console(file: IO[str] | None = None) -> Any:
    """A rich console. On a terminal, its width; piped, :data:`PIPE_WIDTH` so that no
    column is cut (use :func:`emit` to print without the padding that width brings)."""
    from rich.console import Console

    out = file or sys.stdout
    return Console(file=out, highlight=False, width=None if out.isatty() else PIPE_WIDTH)


def emit(*renderables: Any, file: IO[str] | None = None) -> None:
    """Print renderables, each from a new line; piped output carries no colours and no
    trailing spaces."""
    out = file or sys.stdout
    c = console(out)
    if out.isatty():
        for r in renderables:  # one print each: print(a, b) would join them on one line
            c.print(r)
        return
    with c.capture() as cap:
        for r in renderables:
            c.print(r)
    out.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))
    out.flush()


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

    line = safe(" ".join((text or "").split()))
    return escape(line if len(line) <= limit else line[: limit - 1] + "…")


def fitted_cell(markup: str) -> Any:
    """A cell that is cut (``…``), never wrapped, when its column must shrink."""
    from rich.text import Text

    text = Text.from_markup(markup, overflow="ellipsis")
    text.no_wrap = True
    return text


def _launcher(root_pid: int, members: list[HolderProcess]) -> tuple[str, str] | None:
    """(user, command) of a job's launcher that holds no GPU itself; None when it does."""
    if any(p.pid == root_pid for p in members):
        return None
    info = read_info(root_pid)
    return (cell(info.user or "-"), one_line(info.command)) if info else ("-", "(exited)")


def gpu_cell(memory_gpus: list[int], handle_gpus: list[int]) -> str:
    """Where a process holds memory, and apart from it where it only holds a device
    handle (CUDA opens every device node): ``0 (+1-7 handle)``."""
    handles = sorted(set(handle_gpus) - set(memory_gpus))
    if not memory_gpus:
        return format_gpu_list(handles) or "-"
    text = format_gpu_list(memory_gpus)
    return f"{text} (+{format_gpu_list(handles)} handle)" if handles else text


def status_renderable(snap: Snapshot) -> Any:
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

    procs = process_table((("GPU", "right"), ("PID", "right"), ("Kind", "left"), ("GPU memory", "right"),
                           ("User", "left"), ("Command", "left")))
    # one row per process (its GPUs together), grouped under the job's launcher
    rows: dict[int, dict[int, _Row]] = {}
    for g in snap.gpus:
        for p in g.processes:
            row = rows.setdefault(p.root_pid, {}).setdefault(p.pid, _Row(p))
            row.add(g.index, p)
    for root, members in rows.items():
        launcher = _launcher(root, [m.proc for m in members.values()])
        if launcher:
            procs.add_row("", str(root), "[dim]launcher[/]", "", launcher[0], fitted_cell(f"[dim]{launcher[1]}[/]"))
        for m in sorted(members.values(), key=lambda m: (m.proc.pid != root, m.first_gpu, m.proc.pid)):
            p = m.proc
            branch = "" if p.pid == root else "└ "
            kind = f"[dim]{m.kind}[/]" if m.kind == "handle" else m.kind
            cmd = one_line(p.command) if p.visible else "[dim](exited, or not visible from this host's /proc)[/]"
            if p.container:
                cmd = f"[magenta]container {cell(p.container)}[/] {cmd}"
            procs.add_row(gpu_cell(m.memory_gpus, m.handle_gpus), f"{branch}{p.pid}", kind,
                          format_size(m.used) if m.used is not None else "-", cell(p.user or "-"), fitted_cell(cmd))
    any_proc = bool(rows)
    parts: list[Any] = [head, gpus, Text("")]
    parts.append(procs if any_proc else Text("No processes hold the selected GPUs.", style="green"))
    if snap.host_processes:
        others = ", ".join(f"{p.pid} ({safe(p.name)})" for p in snap.host_processes)
        parts.append(Text(f"Holding only control devices (nvidiactl/uvm): {others}", style="dim"))
    for w in snap.warnings:
        parts.append(Text(f"warning: {w}", style="yellow"))
    return Group(*parts)


class _Row:
    """One process of the status table: its GPUs (memory apart from handles) and memory summed."""

    def __init__(self, proc: HolderProcess) -> None:
        self.proc = proc
        self.memory_gpus: list[int] = []
        self.handle_gpus: list[int] = []
        self.used: int | None = None
        self.kind = "handle"  # until a GPU where it holds a context says otherwise

    def add(self, gpu: int, p: HolderProcess) -> None:
        if p.kind == "handle":
            self.handle_gpus.append(gpu)
        else:
            self.memory_gpus.append(gpu)
            self.kind = p.kind
        if p.used_memory is not None:
            self.used = (self.used or 0) + p.used_memory

    @property
    def first_gpu(self) -> int:
        return min(self.memory_gpus or self.handle_gpus)


def process_table(columns: tuple[tuple[str, str], ...]) -> Any:
    """A table of processes that fits the terminal by cutting the Command column
    (the last) first: numbers, users and GPUs stay whole at 80 columns."""
    from rich.table import Table

    t = Table(box=None, pad_edge=False, collapse_padding=True, header_style="bold")
    for name, just in columns:
        # only Command may shrink (its cells are cut with an ellipsis, see fitted_cell)
        t.add_column(name, justify=just, no_wrap=name != "Command",  # type: ignore[arg-type]
                     min_width=8 if name == "Command" else None)
    return t


def time_label(epoch: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def print_status(snap: Snapshot) -> None:
    emit(status_renderable(snap))
