"""What one scrape reports, as a pure function of the facts it gathered.

A scrape gathers facts once (:class:`Facts`: the ``status`` snapshot, whether
each holder's process-group leader still lives, the job roots' command lines,
the unit each process belongs to) and :func:`account` turns them into rows,
one per GPU and one per (GPU, process holding memory there). Nothing here
reads the host, so every rule is tested on made-up facts (tests/exporter).

The two signals an alert fires on:

*Leaked* memory of a GPU is what its driver counts as used that no listed
process holds: ``used - sum(process memory)``, never below 0 (an orphaned
context, an MPS server, a process in another PID namespace the driver does not
list, or a teardown in progress): :func:`~gpuslate.gpu.types.held_by_no_process`,
the one computation of it, whose fact ``status``, ``clear`` and ``wait`` report
too. On drivers before R510 (NVML's v1 memory API) 'used' includes the driver's
reserved memory (645 MiB on an idle H200), so an alert's threshold must be above it.

*Free* is what ``wait --free`` calls free with the host's default
``--max-used`` (:func:`~gpuslate.clearing.wait.state_is_free`): no process but a
spared GPU daemon has a context on the GPU, and the memory used less the
daemons' baseline (an idle MPS server's 66 MiB) is at most the default. That
baseline is reported apart, per GPU; an MPS client's series names its server.

*Orphaned* memory is held by processes whose launcher has exited: a visible
holder with a context on the GPU, in a process group whose leader is no longer
alive (it exited, or is a zombie), the holder not being that leader itself.
These are the workers the job rule attributes to no live launcher
(docs/clear.md, "The job rule"). A leader whose state is unknown (absent from
:attr:`Facts.leaders_alive`) never makes a holder orphaned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .._text import clean, cut
from ..clearing.wait import state_is_free
from ..gpu.types import ProcessKind, held_by_no_process
from ..host.snapshot import HolderProcess, Snapshot
from ..units.state import UnitState

#: the longest command (or job command, user, unit name) put in a label, in characters
LABEL_LIMIT = 200


class UnitRow(NamedTuple):
    """A managed unit as ``ps`` classifies it now."""

    name: str
    state: UnitState
    uptime_s: float | None
    launched_at: float | None  # epoch seconds of the last launch (None: corrupt record)
    time_to_ready_s: float | None
    memory: int | None  # bytes its processes hold on its GPUs (None: unknown)
    processes: int


class FrontRow(NamedTuple):
    """A unit's front as ``ps`` reads it now, and what its clients saw at its last swap."""

    address: str
    unit: str | None
    state: str  # serving | holding | stranded | refusing | no_route | down | stopped
    held_now: int | None  # requests it holds now (None: it does not answer)
    last_held: int | None  # at its last swap: requests held, the longest hold, requests cut
    last_longest_hold_s: float | None
    last_cut: int | None


class Facts(NamedTuple):
    """Everything one scrape gathered from the host."""

    snapshot: Snapshot
    leaders_alive: Mapping[int, bool]  # pgid -> its leader lives (absent: unknown)
    job_commands: Mapping[int, str]  # job root pid -> its command line (absent: unknown)
    unit_of: Mapping[int, str]  # pid -> the managed unit it belongs to
    units: Sequence[UnitRow] = ()
    max_used: int | None = None  # the host's default --max-used; None: free is not reported
    fronts: Sequence[FrontRow] = ()


class ProcessRow(NamedTuple):
    """One process's memory on one GPU, with its labels already made safe.

    Its series is keyed by what stays when the server restarts, ``(gpu, unit, user, slot)``:
    ``slot`` numbers the memory holders of one unit (or, outside units, of one user) on one GPU,
    in the order of their job and pid, so the restarted server's worker on GPU 3 takes the slot
    its predecessor had. pid, command and job go to the info series of that key (Prometheus's
    ``*_info`` pattern): a restart changes one info series, not the memory series."""

    gpu: int
    slot: int
    pid: int
    kind: str  # compute | graphics | mps
    user: str
    command: str
    job_pid: int
    job_command: str
    unit: str
    orphaned: bool
    bytes: int
    mps_server: str = ""  # an MPS client's server pid, else empty


class GpuRow(NamedTuple):
    gpu: int
    memory_holders: int  # processes with a context here (memory reported or not)
    handle_holders: int  # processes that only hold the device file open
    attributed: int  # bytes the listed processes hold
    leaked: int | None  # bytes used that no listed process holds; None: memory unknown
    orphaned: int  # bytes held by processes whose launcher exited
    orphaned_processes: int
    daemon_memory: int = 0  # bytes spared GPU daemons hold: the host's baseline
    free: bool | None = None  # as wait --free sees it with the default --max-used; None: not known


class Account(NamedTuple):
    gpus: list[GpuRow]
    processes: list[ProcessRow]


def label(text: str | None) -> str:
    """A label value from a process (title, user, unit): one printable line, at most
    :data:`LABEL_LIMIT` characters; control characters are escaped (``\\x1b``)."""
    return cut(clean(text), LABEL_LIMIT)


def is_orphaned(p: HolderProcess, leaders_alive: Mapping[int, bool]) -> bool:
    """A memory holder whose process group's leader is known to have exited (see the module doc)."""
    if p.kind == ProcessKind.HANDLE or not p.visible or p.pgid is None or p.pgid == p.pid:
        return False
    return leaders_alive.get(p.pgid) is False


def account(f: Facts) -> Account:
    """The rows of one scrape (see the module doc for leaked and orphaned memory)."""
    gpus: list[GpuRow] = []
    rows: list[ProcessRow] = []
    for g in f.snapshot.gpus:
        holders = [p for p in g.processes if p.kind != ProcessKind.HANDLE]
        attributed = sum(p.used_memory or 0 for p in holders)
        orphans = [p for p in holders if is_orphaned(p, f.leaders_alive)]
        gpus.append(GpuRow(
            gpu=g.index, memory_holders=len(holders), handle_holders=len(g.processes) - len(holders),
            attributed=attributed, leaked=held_by_no_process(g.reading),
            orphaned=sum(p.used_memory or 0 for p in orphans), orphaned_processes=len(orphans),
            daemon_memory=sum(h.bytes for h in g.baseline()),
            free=state_is_free(g, f.max_used) if f.max_used is not None else None,
        ))
        orphan_pids = {p.pid for p in orphans}
        slots: dict[tuple[str, str], int] = {}
        for p in sorted(holders, key=lambda h: (h.root_pid, h.pid)):
            if p.used_memory is None:
                continue  # the driver did not say: counted in memory_holders, no series of bytes
            owner = (label(f.unit_of.get(p.pid)), label(p.user))
            slots[owner] = slot = slots.get(owner, -1) + 1
            rows.append(ProcessRow(
                gpu=g.index, slot=slot, pid=p.pid, kind=p.kind, user=label(p.user), command=label(p.command),
                job_pid=p.root_pid, job_command=label(f.job_commands.get(p.root_pid)),
                unit=label(f.unit_of.get(p.pid)), orphaned=p.pid in orphan_pids, bytes=p.used_memory,
                mps_server=str(p.mps_server) if p.mps_server is not None else "",
            ))
    return Account(gpus, rows)
