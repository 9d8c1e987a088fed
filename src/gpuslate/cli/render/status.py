"""The ``status`` table, laid out without rich (see :mod:`.plain` for why): the one renderer of a
:class:`~gpuslate.host.snapshot.Snapshot`, this host's or another's (``--host``)."""

from __future__ import annotations

import sys
import time
from typing import IO

from ..._parse import format_gpu_list, format_size
from ...gpu.types import ProcessKind
from ...host.snapshot import GpuState, HolderProcess, Holding, Snapshot
from .plain import Cell, Column, Style, clean, paint, table, use_color, width_of

_GPU_COLUMNS = (Column("GPU", "right"), Column("Name", max_width=22), Column("Memory used/total", "right"),
                Column("Reserved", "right"), Column("Util", "right"), Column("Temp", "right"),
                Column("Power", "right"), Column("Perf"), Column(""))
_PROC_COLUMNS = (Column("GPU", "right"), Column("PID", "right"), Column("Kind"), Column("GPU memory", "right"),
                 Column("User"), Column("Command", command=True))


def _na(v: object, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


def _memory_cell(g: GpuState) -> Cell:
    m = g.memory
    if m is None:
        return Cell("unknown", ("red",))
    pct = 100 * m.used / m.total if m.total else 0
    color: Style = "green" if m.used == 0 else ("yellow" if pct < 90 else "red")
    return Cell(f"{format_size(m.used)}/{format_size(m.total)}", (color,))


def _launcher(root_pid: int, members: list[HolderProcess], snap: Snapshot) -> tuple[str, str] | None:
    """(user, command) of a job's launcher that holds no GPU itself, as the snapshot read it on its
    host; None when it holds one."""
    if any(p.pid == root_pid for p in members):
        return None
    found = snap.launcher(root_pid)
    if found is None and snap.launchers is None:  # a document from a gpuslate before launchers
        return ("-", "(holds no GPU itself)")
    if found is None or found.command is None:
        return ("-", "(exited)")
    return (clean(found.user or "-"), clean(found.command))


def gpu_cell(memory_gpus: list[int], handle_gpus: list[int]) -> str:
    """Where a process holds memory, and apart from it where it only holds a device
    handle (CUDA opens every device node): ``0 (+1-7 handle)``."""
    handles = sorted(set(handle_gpus) - set(memory_gpus))
    if not memory_gpus:
        return format_gpu_list(handles) or "-"
    text = format_gpu_list(memory_gpus)
    return f"{text} (+{format_gpu_list(handles)} handle)" if handles else text


def _gpu_rows(snap: Snapshot) -> list[list[Cell]]:
    rows = []
    for g in snap.gpus:
        r = g.reading
        rows.append([
            Cell(str(r.index)), Cell(clean(r.name or "-").removeprefix("NVIDIA ")), _memory_cell(g),
            Cell(format_size(r.memory.reserved) if r.memory else "-"),
            Cell(_na(r.utilization_pct, "{}%")), Cell(_na(r.temperature_c, "{}°C")),
            Cell(f"{_na(r.power_w, '{:.0f}')}/{_na(r.power_limit_w, '{:.0f}')}W"),
            Cell(r.pstate or "-"), Cell(f"error: {clean(r.error)}" if r.error else "", ("red",)),
        ])
    return rows


def _process_rows(snap: Snapshot) -> list[list[Cell]]:
    """One row per process (its GPUs together), grouped under the job's launcher."""
    procs: dict[int, HolderProcess] = {}
    for g in snap.gpus:
        for p in g.processes:
            procs.setdefault(p.pid, p)
    jobs: dict[int, dict[int, Holding]] = {}
    for pid, h in snap.holders().items():
        jobs.setdefault(procs[pid].root_pid, {})[pid] = h
    rows: list[list[Cell]] = []
    for root, members in jobs.items():
        launcher = _launcher(root, [procs[pid] for pid in members], snap)
        if launcher:
            rows.append([Cell(""), Cell(str(root)), Cell("launcher", ("dim",)), Cell(""), Cell(launcher[0]),
                         Cell(launcher[1], ("dim",))])
        for m in sorted(members.values(), key=lambda m: (m.pid != root, m.first_gpu, m.pid)):
            p = procs[m.pid]
            branch = "" if p.pid == root else "└ "
            if not p.visible:
                cmd = Cell("(exited, or not visible from this host's /proc)", ("dim",))
            else:
                text = clean(p.command)
                cmd = Cell(f"container {clean(p.container)} {text}" if p.container else text)
            kind = f"mps (server {p.mps_server})" if m.kind == ProcessKind.MPS and p.mps_server is not None else m.kind
            if p.daemon is not None and m.kind != ProcessKind.HANDLE:
                kind += " (daemon)"
            rows.append([Cell(gpu_cell(m.memory_gpus, list(m.handles))), Cell(f"{branch}{p.pid}"),
                         Cell(kind, ("dim",) if m.kind == ProcessKind.HANDLE else ()),
                         Cell(format_size(m.used_memory) if m.used_memory is not None else "-"),
                         Cell(clean(p.user or "-")), cmd])
    return rows


def status_lines(snap: Snapshot, *, color: bool, width: int | None) -> list[str]:
    """The table: a head line, the GPUs (only the model name may be cut, never a number),
    the processes under their launchers (only the command may be cut), host-level holders, warnings.
    Nothing is read from this host: another host's snapshot (``--host``) is shown as it is."""
    head = (f"{paint(clean(snap.host), ('bold',), color)}  backend {paint(clean(snap.backend), ('cyan',), color)}  "
            f"driver {clean(snap.driver_version) or '-'}  {paint(time_label(snap.taken_at), ('dim',), color)}")
    lines = [head, *table(_GPU_COLUMNS, _gpu_rows(snap), color=color, width=width, shrink=1), ""]
    procs = _process_rows(snap)
    if procs:
        lines += table(_PROC_COLUMNS, procs, color=color, width=width, shrink=5)
    else:
        # not green when a warning follows (memory held by no process, processes not inspected)
        lines.append(paint("No processes hold the selected GPUs.", () if snap.warnings else ("green",), color))
    for h in (h for g in snap.gpus for h in g.baseline()):
        lines.append(paint(f"GPU {h.gpu}: {format_size(h.bytes)} held by {clean(h.program)} (PID {h.pid}), spared: "
                           "a GPU daemon's baseline, not counted as used by wait, clear and up", ("dim",), color))
    for u in snap.parked or ():
        held = f", {format_size(u['host_bytes'])} in host memory" if u.get("host_bytes") else ""
        where = ",".join(str(g) for g in u["gpus"]) or "-"
        lines.append(paint(f"Parked: unit {clean(u['unit'])} (pid {u['pid']}, by {clean(u['method'])}) on GPU {where}: "
                           f"its GPU memory released{held}; 'gpuslate resume {clean(u['unit'])}'", ("cyan",), color))
    if snap.host_processes:
        others = ", ".join(f"{p.pid} ({clean(p.name)})" for p in snap.host_processes)
        lines.append(paint(f"Holding only control devices (nvidiactl/uvm): {others}", ("dim",), color))
    lines += [paint(f"warning: {clean(w)}", ("yellow",), color) for w in snap.warnings]
    return lines


def time_label(epoch: float) -> str:
    """Local time to the second, of the time as documents carry it (to the millisecond)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(round(epoch, 3)))


def print_status(snap: Snapshot, out: IO[str] | None = None, *, redraw: bool = False) -> None:
    """Print the table; ``redraw`` (``--watch`` on a terminal) first clears the screen."""
    out = out or sys.stdout
    text = "\n".join(status_lines(snap, color=use_color(out), width=width_of(out))) + "\n"
    out.write(("\x1b[H\x1b[2J" + text) if redraw and out.isatty() else text)
    out.flush()
