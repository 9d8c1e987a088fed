"""Before a unit starts: its GPUs must be free and its port unused; if not, say who holds them."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

from .._parse import format_size, gpus_phrase
from ..clearing.wait import state_is_free
from ..errors import NotDoneError
from ..gpu.types import GpuBackend, ProcessKind
from ..host.snapshot import Snapshot, take_snapshot
from ..proc.fdscan import read_fd_targets
from ..proc.procfs import read_info


def check_gpus(backend: GpuBackend, gpus: list[int], max_used: int, *, for_unit: str,
               owners: Callable[[], dict[int, str]]) -> Snapshot:
    """Raise NotDoneError naming every holder (and its unit: ``owners()`` maps pid -> unit,
    asked only when a GPU is busy) unless all ``gpus`` are free."""
    snap = take_snapshot(backend, gpus)
    busy = [g for g in snap.gpus if not state_is_free(g, max_used)]
    if not busy:
        return snap
    owner_of = owners()
    parts: list[str] = []
    units: set[str] = set()
    for g in busy:
        if g.reading.error:
            parts.append(f"GPU {g.index}: query failed ({g.reading.error})")
            continue
        holders = []
        spared = {h.pid for h in g.baseline()}
        for p in g.processes:
            if p.kind == ProcessKind.HANDLE or p.pid in spared:  # a GPU daemon's baseline is the host's
                continue
            unit = owner_of.get(p.pid)
            if unit:
                units.add(unit)
            who = f"{p.user or 'user unknown'}: {p.command or p.name or 'command unknown'}" if p.visible else \
                "exited, or not visible from this host's /proc"
            held = format_size(p.used_memory) if p.used_memory is not None else "memory not reported"
            holders.append(f"pid {p.pid}" + (f" of unit {unit}" if unit else "") + f" ({who}, {held})")
        used = g.reading.memory.used if g.reading.memory else None
        shown = ", ".join(holders) or "held by no visible process"
        parts.append(f"GPU {g.index} ({format_size(used)} used): {shown}")

    hint = (f"stop it first: gpuslate down {sorted(units)[0]}" if len(units) == 1 else
            "stop them first ('gpuslate down NAME', 'gpuslate clear'), or pass --clear to clear them")
    raise NotDoneError(f"{gpus_phrase([g.index for g in busy])} not free for unit {for_unit}: " + "; ".join(parts),
                       hint=hint)


def port_in_use(host: str, port: int) -> bool:
    """True when a server could not bind the port (on ``host`` or on all addresses)."""
    for addr in dict.fromkeys((host, "0.0.0.0")):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no owner
            try:
                s.bind((addr, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
    return False


def port_owner(port: int) -> str | None:
    """'pid N (user: command)' of the process listening on ``port``, if this host shows it."""
    pid = port_listener(port)
    if pid is None:
        return None
    info = read_info(pid)
    return f"pid {pid} " + (f"({info.user}: {info.command})" if info else "(exited, or not visible from here)")


def port_listener(port: int) -> int | None:
    """The pid of a process listening on TCP ``port`` (any address), if ``/proc`` shows one."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        if inodes & (read_fd_targets(pid) or frozenset()):  # a live thread's, where the leader exited
            return pid
    return None


def check_port(host: str, port: int, *, for_unit: str, left_by: Callable[[int], str | None] | None = None) -> None:
    """Raise NotDoneError naming the listener unless ``port`` is free. ``left_by(pid)`` says which
    unit's last run left that listener behind (a stray of it, see :mod:`.strays`), if one did:
    then the hint is the command that ends it."""
    if port_in_use(host, port):
        pid = port_listener(port)
        owner = port_owner(port) if pid is not None else None
        unit = left_by(pid) if pid is not None and left_by is not None else None
        left = (f", left by unit {unit} (started while it ran, not found in it, not ruled out)" if unit else "")
        raise NotDoneError(f"port {port} is already in use" + (f" by {owner}" if owner else "") + left
                           + f": unit {for_unit} cannot listen on it",
                           hint=f"nothing proves it unit {unit}'s, so gpuslate never signals it: 'kill {pid}' ends it "
                           f"('gpuslate clear --pid {pid}' if it holds GPU memory)" if unit else
                           "stop what listens there, or choose another --port")
