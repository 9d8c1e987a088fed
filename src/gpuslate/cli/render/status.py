"""The ``status`` table, laid out without rich (see :mod:`.plain` for why): the one renderer of a
:class:`~gpuslate.host.snapshot.Snapshot`, this host's or another's (``--host``)."""

from __future__ import annotations

import re
import sys
import time
from typing import IO

from ..._parse import format_gpu_list, format_size
from ..._time import format_duration
from ...gpu.types import ProcessKind
from ...host.snapshot import GpuState, HolderProcess, Holding, Snapshot
from .plain import Cell, Column, Style, clean, cut, paint, short_command, table, use_color, width_of

_SGR = re.compile(r"\x1b\[[0-9;]*m")

_GPU_COLUMNS = (Column("GPU", "right"), Column("Name", max_width=22), Column("Memory used/total", "right"),
                Column("Reserved", "right"), Column("Util", "right"), Column("Temp", "right"),
                Column("Power", "right"), Column("Perf"), Column(""))
_PROC_COLUMNS = (Column("GPU", "right"), Column("PID", "right"), Column("Kind"), Column("GPU memory", "right"),
                 Column("User"), Column("CPU", "right"), Column("Host mem", "right"), Column("Elapsed", "right"),
                 Column("Command", command=True))
#: what nvitop and gpustat users look for (CPU share, host memory, time running), left out on a
#: terminal where the command would keep less than this: the key columns and the command come first
_EXTRAS_MIN_COMMAND = 30
_EXTRAS = (5, 6, 7)  # CPU, Host mem, Elapsed


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


def _process_rows(snap: Snapshot) -> tuple[list[list[Cell]], dict[int, tuple[str, str]]]:
    """One row per process (its GPUs together), grouped under the job's launcher; and, by row index,
    the launchers' rows' user and command, which are laid out apart (:func:`_launcher_line`)."""
    procs: dict[int, HolderProcess] = {}
    for g in snap.gpus:
        for p in g.processes:
            procs.setdefault(p.pid, p)
    jobs: dict[int, dict[int, Holding]] = {}
    for pid, h in snap.holders().items():
        jobs.setdefault(procs[pid].root_pid, {})[pid] = h
    rows: list[list[Cell]] = []
    launchers: dict[int, tuple[str, str]] = {}
    at = snap.taken_at
    for root, members in jobs.items():
        launcher = _launcher(root, [procs[pid] for pid in members], snap)
        if launcher:
            launchers[len(rows)] = launcher
            rows.append([Cell(""), Cell(str(root)), Cell("launcher", ("dim",)), Cell(""), Cell(launcher[0]),
                         *(Cell("") for _ in range(4))])
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
            cpu = p.cpu_pct(at)
            rows.append([Cell(gpu_cell(m.memory_gpus, list(m.handles))), Cell(f"{branch}{p.pid}"),
                         Cell(kind, ("dim",) if m.kind == ProcessKind.HANDLE else ()),
                         Cell(format_size(m.used_memory) if m.used_memory is not None else "-"),
                         Cell(clean(p.user or "-")), Cell(f"{cpu:.0f}%" if cpu is not None else "-"),
                         Cell(format_size(p.host_memory) if p.host_memory is not None else "-"),
                         Cell(format_duration(p.elapsed_s(at))), cmd])
    return rows, launchers


def _process_lines(snap: Snapshot, *, color: bool, width: int | None) -> list[str]:
    """The processes' table: PIDs, users and GPUs whole; CPU, host memory and time running where the
    command keeps :data:`_EXTRAS_MIN_COMMAND` columns with them (always when piped); a launcher's row
    (the one that names the job) gives its command the width of the cells it leaves empty."""
    rows, launchers = _process_rows(snap)
    columns = list(_PROC_COLUMNS)
    if width is not None:
        fixed = [max([len(c.header)] + [len(r[i].text) for r in rows]) for i, c in enumerate(columns[:-1])]
        if width - (sum(fixed) + len(fixed)) < _EXTRAS_MIN_COMMAND:
            keep = [i for i in range(len(columns)) if i not in _EXTRAS]
            columns = [columns[i] for i in keep]
            rows = [[r[i] for i in keep] for r in rows]
    lines = table(columns, rows, color=color, width=width, shrink=len(columns) - 1)
    user_end = len(_SGR.sub("", lines[0]).split("User", 1)[0]) + max(len("User"), *(len(r[4].text) for r in rows))
    for i, (_, command) in launchers.items():
        lines[1 + i] = _launcher_line(lines[1 + i], user_end, command, color=color, width=width)
    return lines


def _launcher_line(start: str, user_end: int, command: str, *, color: bool, width: int | None) -> str:
    """A launcher's row: its PID, role and user in their columns, then its command in all the width
    after the User column (it holds no GPU: its CPU, memory and time columns would be empty)."""
    pad = " " * max(0, user_end - len(_SGR.sub("", start)))
    room = None if width is None else max(8, width - user_end - 1)
    return f"{start}{pad} {paint(short_command(command, room), ('dim',), color)}"


def status_lines(snap: Snapshot, *, color: bool, width: int | None) -> list[str]:
    """The table: a head line, the GPUs (only the model name may be cut, never a number),
    the processes under their launchers (only the command may be cut), host-level holders, warnings.
    Nothing is read from this host: another host's snapshot (``--host``) is shown as it is."""
    head = (f"{paint(clean(snap.host), ('bold',), color)}  backend {paint(clean(snap.backend), ('cyan',), color)}  "
            f"driver {clean(snap.driver_version) or '-'}  {paint(time_label(snap.taken_at), ('dim',), color)}")
    lines = [head, *table(_GPU_COLUMNS, _gpu_rows(snap), color=color, width=width, shrink=1), ""]
    if any(g.processes for g in snap.gpus):
        lines += _process_lines(snap, color=color, width=width)
    else:
        # not green when a warning follows (memory held by no process, processes not inspected)
        lines.append(paint("No processes hold the selected GPUs.", () if snap.warnings else ("green",), color))
    for h in (h for g in snap.gpus for h in g.baseline()):
        lines.append(paint(f"GPU {h.gpu}: {format_size(h.bytes)} held by {clean(h.program)} (PID {h.pid}), spared: "
                           "a GPU daemon's baseline, not counted as used by wait, clear and up", ("dim",), color))
    if snap.host_processes:
        others = ", ".join(f"{p.pid} ({clean(p.name)})" for p in snap.host_processes)
        lines.append(paint(f"Holding only control devices (nvidiactl/uvm): {others}", ("dim",), color))
    lines += [paint(f"warning: {clean(w)}", ("yellow",), color) for w in snap.warnings]
    return lines


def time_label(epoch: float) -> str:
    """Local time to the second, of the time as documents carry it (to the millisecond)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(round(epoch, 3)))


_BAR = " ▏▎▍▌▋▊▉█"


def memory_bar(used: int, total: int, cells: int) -> str:
    """``used`` of ``total`` as a bar of ``cells`` characters, in eighths of a cell (as nvitop and
    gpustat draw theirs); anything used shows at least an eighth."""
    if total <= 0 or cells <= 0:
        return " " * max(cells, 0)
    eighths = min(cells * 8, round(cells * 8 * used / total))
    if used and not eighths:
        eighths = 1
    full, part = divmod(eighths, 8)
    return ("█" * full + (_BAR[part] if part else "")).ljust(cells)


def _used_of(used: int, total: int) -> str:
    """``30.0/96.0 GiB``: one unit where both have it."""
    u, t = format_size(used), format_size(total)
    unit = t.rsplit(" ", 1)[-1]
    return f"{u.removesuffix(' ' + unit)}/{t}" if u.endswith(" " + unit) and " " in t else f"{u}/{t}"


def _holder_text(p: HolderProcess) -> str:
    return f"{p.pid} {clean(p.user or '-')}" + (f" {format_size(p.used_memory)}" if p.used_memory is not None else "")


def compact_lines(snap: Snapshot, *, color: bool, width: int | None) -> list[str]:
    """``status --compact``: one line per GPU, as gpustat shows them: index, name, a memory bar, used
    of total, utilization, temperature, then who holds it (PID, user and memory, largest first). On
    a terminal, the holders come first: the name is cut, then the bar narrowed, so that at least
    the largest holder stays whole; the others as many as fit, then how many more (``+2``). The same
    snapshot as the table (and the same ``--json`` document)."""
    head = (f"{paint(clean(snap.host), ('bold',), color)}  backend {paint(clean(snap.backend), ('cyan',), color)}  "
            f"driver {clean(snap.driver_version) or '-'}  {paint(time_label(snap.taken_at), ('dim',), color)}")
    names = [clean(g.reading.name or "-").removeprefix("NVIDIA ") for g in snap.gpus]
    mems = [_used_of(g.memory.used, g.memory.total) if g.memory else "unknown" for g in snap.gpus]
    holders = [sorted((p for p in g.processes if p.kind != "handle"), key=lambda p: (-(p.used_memory or 0), p.pid))
               for g in snap.gpus]
    idx_w = max((len(str(g.index)) for g in snap.gpus), default=1)
    mem_w = max((len(m) for m in mems), default=0)
    name_w, bar_w = min(22, max((len(n) for n in names), default=0)), 20
    if width is not None:
        first = max((len(_holder_text(h[0])) + (len(f" +{len(h) - 1}") if len(h) > 1 else 0)
                     for h in holders if h), default=0)
        room = width - (idx_w + mem_w + 14) - (first + 1 if first else 0)  # name and bar share what is left
        name_w = max(3, min(name_w, room - 10))
        bar_w = max(5, min(20, room - name_w))
    lines = [head]
    for g, name, mem, held in zip(snap.gpus, names, mems, holders):
        r, m = g.reading, g.memory
        pct = 100 * m.used / m.total if m and m.total else 0
        style: tuple[Style, ...] = ("red",) if m is None else ("green",) if m.used == 0 else \
            ("yellow",) if pct < 90 else ("red",)
        bar = paint(memory_bar(m.used, m.total, bar_w) if m else "?" * bar_w, style, color)
        start = (f"{r.index:>{idx_w}} {cut(name, name_w):<{name_w}} ▕{bar}▏ {mem:>{mem_w}} "
                 f"{_na(r.utilization_pct, '{}%'):>3} {_na(r.temperature_c, '{}°C'):>4}")
        if r.error:
            lines.append(f"{start} {paint(f'error: {clean(r.error)}', ('red',), color)}")
            continue
        left = None if width is None else width - len(_SGR.sub("", start)) - 1
        shown = ""
        for i, p in enumerate(held):  # whole holders only, then how many more (+N)
            part = _holder_text(p)
            rest = len(held) - i - 1
            wanted = len(shown) + 2 + len(part) + (len(f" +{rest}") if rest else 0)
            if left is not None and shown and wanted > left:
                shown += f" +{len(held) - i}"
                break
            shown = f"{shown}, {part}" if shown else part
        lines.append(f"{start} {shown}".rstrip())
    lines += [paint(f"warning: {clean(w)}", ("yellow",), color) for w in snap.warnings]
    return lines


def print_compact(snap: Snapshot, out: IO[str] | None = None, *, redraw: bool = False) -> None:
    """Print the one-line-per-GPU view (``status --compact``); ``redraw`` as :func:`print_status`."""
    out = out or sys.stdout
    text = "\n".join(compact_lines(snap, color=use_color(out), width=width_of(out))) + "\n"
    out.write(("\x1b[H\x1b[2J" + text) if redraw and out.isatty() else text)
    out.flush()


def print_status(snap: Snapshot, out: IO[str] | None = None, *, redraw: bool = False) -> None:
    """Print the table; ``redraw`` (``--watch`` on a terminal) first clears the screen."""
    out = out or sys.stdout
    text = "\n".join(status_lines(snap, color=use_color(out), width=width_of(out))) + "\n"
    out.write(("\x1b[H\x1b[2J" + text) if redraw and out.isatty() else text)
    out.flush()
