"""Discovery: every GPU, and every process that holds it, joined with host facts.

A snapshot merges two sources: the driver's own process list (processes with
GPU contexts and memory) and a scan of ``/proc/*/fd`` (processes that merely
hold a device file open: monitors, the persistence daemon, MPS control).
Each holder is marked with the GPU daemon it runs (a system program named as
one), and each MPS client with its server, where they can be told
(:mod:`.daemons`).

Memory the driver counts as used that no process holds (a leaked or driver-held context) is a
warning of the snapshot (:func:`leak_warning`): ``status`` shows it, its JSON carries it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .._document import MAX_ID, MAX_PID, Fields, Malformed, checked, reading
from .._parse import format_size
from .._time import iso_time
from ..errors import UsageError
from ..gpu.types import (
    PROCESS_KINDS,
    GpuBackend,
    GpuProcess,
    GpuReading,
    MemoryInfo,
    ProcessKind,
    held_by_no_process,
    memory_info_from_json,
)
from ..outcome import Outcome, StatusEnum
from ..proc.daemons import MPS_SERVER, Prover, exe_daemon, read_client_pipe, read_server_pipe
from ..proc.fdscan import FdScan, scan_device_holders
from ..proc.procfs import ProcessInfo, read_info, ticks_to_epoch
from ..proc.tree import ProcTable
from .daemons import DaemonHold, MpsEnd, baseline, mps_candidates, mps_possible, mps_servers
from .session import default_max_used

SCHEMA = "gpuslate.status.v1"
#: why a daemon of a status document from a gpuslate before daemons were proven is not: it was never asked
OLD_DOCUMENT = "not proven by the gpuslate that wrote this document (it did not prove daemons)"


class HolderProcess(NamedTuple):
    """A process holding a GPU: what the driver says plus what the host says."""

    pid: int
    kind: str  # compute | graphics | mps | handle
    used_memory: int | None
    start_ticks: int | None  # with pid, the process identity; None if not visible
    user: str | None
    uid: int | None
    name: str | None  # kernel process name; the title when one was set
    command: str | None
    ppid: int | None
    pgid: int | None
    sid: int | None
    root_pid: int
    state: str | None
    container: str | None
    visible: bool  # False: the driver names a pid this host's /proc does not show
    cgroup: str | None = None
    daemon: str | None = None  # the GPU daemon it runs (a system program named as one), e.g. nvidia-cuda-mps-server
    mps_server: int | None = None  # an MPS client's server, where it can be told (see .daemons)
    #: why a process that runs a GPU daemon is not proven the daemon (None: proven, or no daemon): its
    #: memory is then held, never the host's baseline (gpuslate.proc.daemons)
    daemon_unproven: str | None = None
    cpu_time_s: float | None = None  # CPU time used so far (user + system), as ps's TIME; None: not known
    host_memory: int | None = None  # resident host memory in bytes, as ps's RSS; None: not known

    @property
    def started(self) -> float | None:
        return ticks_to_epoch(self.start_ticks) if self.start_ticks is not None else None

    def elapsed_s(self, at: float) -> float | None:
        """How long it had run at ``at`` (epoch seconds: the snapshot's time)."""
        return max(0.0, at - self.started) if self.started is not None else None

    def cpu_pct(self, at: float) -> float | None:
        """Its CPU time over its life, in percent of one core, as ``ps`` computes %CPU (one
        snapshot: no second sample, so that ``status`` waits for nothing)."""
        life = self.elapsed_s(at)
        return None if self.cpu_time_s is None or not life else 100.0 * self.cpu_time_s / life

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "start_ticks": self.start_ticks, "kind": self.kind,
            "used_memory": self.used_memory, "user": self.user, "uid": self.uid,
            "name": self.name, "command": self.command,
            "started": iso_time(self.started) if self.started is not None else None,
            "ppid": self.ppid, "pgid": self.pgid, "sid": self.sid, "root_pid": self.root_pid,
            "state": self.state, "container": self.container, "cgroup": self.cgroup, "visible": self.visible,
            "daemon": self.daemon, "daemon_unproven": self.daemon_unproven, "mps_server": self.mps_server,
            "cpu_time_s": round(self.cpu_time_s, 2) if self.cpu_time_s is not None else None,
            "host_memory": self.host_memory,
        }

    @classmethod
    def from_json(cls, d: object) -> HolderProcess:
        f = Fields(d)
        kind = f.text("kind")
        if kind not in PROCESS_KINDS:
            raise Malformed(f"kind: expected one of {', '.join(PROCESS_KINDS)}, got {kind!r}"[:120])
        daemon = f.opt_text("daemon", default=None)
        return cls(f.pid("pid"), kind, f.opt_size("used_memory"), f.opt_integer("start_ticks", 0), f.opt_text("user"),
                   f.opt_integer("uid", 0, MAX_ID), f.opt_text("name"), f.opt_text("command"),
                   f.opt_integer("ppid", 0, MAX_PID), f.opt_integer("pgid", 0, MAX_PID),
                   f.opt_integer("sid", 0, MAX_PID), f.pid("root_pid"), f.opt_text("state"), f.opt_text("container"),
                   f.flag("visible"), f.opt_text("cgroup", default=None), daemon, f.opt_pid("mps_server", default=None),
                   f.opt_text("daemon_unproven", default=OLD_DOCUMENT if daemon else None),
                   # absent from the documents of a gpuslate before them
                   f.opt_number("cpu_time_s", 0, 1e12, default=None), f.opt_size("host_memory", default=None))


class GpuState(NamedTuple):
    reading: GpuReading
    processes: list[HolderProcess]

    @property
    def index(self) -> int:  # type: ignore[override]  # shadows tuple.index, which nothing here calls
        return self.reading.index

    @property
    def memory(self) -> MemoryInfo | None:
        return self.reading.memory

    @property
    def error(self) -> str | None:
        return self.reading.error

    def baseline(self, exclude: Iterable[int] = ()) -> list[DaemonHold]:
        """What spared GPU daemons hold here (the daemons in ``exclude``, a clear's targets, are
        not spared): the host's baseline, see :mod:`.daemons`."""
        out = set(exclude)
        held = [p for p in self.processes if p.kind != ProcessKind.HANDLE]
        daemons = {p.pid: p.daemon for p in held if p.daemon and p.daemon_unproven is None and p.pid not in out}
        return baseline(self.index, [(p.pid, p.used_memory) for p in held], daemons)

    def to_json(self) -> dict[str, Any]:
        r = self.reading
        return {
            "index": r.index, "uuid": r.uuid, "name": r.name,
            "memory": r.memory._asdict() if r.memory is not None else None,
            "utilization_pct": r.utilization_pct, "temperature_c": r.temperature_c,
            "power_w": r.power_w, "power_limit_w": r.power_limit_w, "pstate": r.pstate,
            "error": r.error,
            "processes": [p.to_json() for p in self.processes],
        }

    @classmethod
    def from_json(cls, d: object) -> GpuState:
        """The GPU of a status document; the driver's process list is the holders that are not handles."""
        f = Fields(d)
        procs = f.items("processes", HolderProcess.from_json)
        reading = GpuReading(
            index=f.gpu("index"), uuid=f.opt_text("uuid"), name=f.opt_text("name"),
            memory=f.opt_record("memory", memory_info_from_json),
            utilization_pct=f.opt_integer("utilization_pct", 0, 100),
            temperature_c=f.opt_integer("temperature_c", -300, 1000), power_w=f.opt_number("power_w", 0, 1e6),
            power_limit_w=f.opt_number("power_limit_w", 0, 1e6), pstate=f.opt_text("pstate"),
            processes=[GpuProcess(p.pid, ProcessKind(p.kind), p.used_memory) for p in procs
                       if p.kind != ProcessKind.HANDLE], error=f.opt_text("error"))
        return cls(reading, procs)


class Holding(NamedTuple):
    """One process's holds across GPUs: where it has a context (and how much memory), and
    where it holds only a device handle (CUDA opens every device node)."""

    pid: int
    kind: str  # compute | graphics | mps where it has a context anywhere, else handle
    memory: dict[int, int | None]  # gpu -> bytes of its context there (None: not reported)
    handles: tuple[int, ...]  # GPUs where it holds only a device handle
    used_memory: int | None  # the reported bytes, summed; None when no GPU reported any

    @property
    def memory_gpus(self) -> list[int]:
        return sorted(self.memory)

    @property
    def gpus(self) -> list[int]:
        return sorted({*self.memory, *self.handles})

    @property
    def first_gpu(self) -> int:
        return min(self.memory or self.handles)


def holdings(entries: Iterable[tuple[int, int, str, int | None]]) -> dict[int, Holding]:
    """(pid, gpu, kind, used memory) entries, one per process and GPU, by process, in order."""
    memory: dict[int, dict[int, int | None]] = {}
    handles: dict[int, set[int]] = {}
    kinds: dict[int, str] = {}
    for pid, gpu, kind, used in entries:
        kinds.setdefault(pid, ProcessKind.HANDLE)
        handles.setdefault(pid, set())
        if kind == ProcessKind.HANDLE:
            handles[pid].add(gpu)
        else:
            kinds[pid] = kind
            per = memory.setdefault(pid, {})
            per[gpu] = used if per.get(gpu) is None else (per[gpu] or 0) + (used or 0)
    out: dict[int, Holding] = {}
    for pid, kind in kinds.items():
        mem = memory.get(pid, {})
        known = [b for b in mem.values() if b is not None]
        out[pid] = Holding(pid, kind, mem, tuple(sorted(handles[pid] - set(mem))),
                           sum(known) if known else None)
    return out


class Launcher(NamedTuple):
    """The root of a job whose processes hold GPUs while it holds none itself (``python launch.py``
    over its workers), as this host's /proc showed it; user and command None: it had exited."""

    pid: int
    user: str | None
    command: str | None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> Launcher:
        f = Fields(d)
        return cls(f.pid("pid"), f.opt_text("user"), f.opt_text("command"))


class SnapshotStatus(StatusEnum):
    """A reading has no failure of its own (a GPU that cannot be read fails the command instead)."""

    SHOWN = "shown", Outcome.DONE


class Snapshot(NamedTuple):
    host: str
    backend: str
    driver_version: str | None
    taken_at: float
    gpus: list[GpuState]
    host_processes: list[HolderProcess]  # hold only control devices (nvidiactl, uvm)
    warnings: list[str]
    #: the jobs' launchers that hold no GPU themselves; None: not known (a document from before them)
    launchers: tuple[Launcher, ...] | None = None

    @property
    def status(self) -> SnapshotStatus:
        return SnapshotStatus.SHOWN  # not in the document: a reading is what it is

    def to_json(self) -> dict[str, Any]:
        doc = {
            "schema": SCHEMA, "host": self.host, "backend": self.backend,
            "driver_version": self.driver_version, "taken_at": iso_time(self.taken_at),
            "gpus": [g.to_json() for g in self.gpus],
            "host_processes": [p.to_json() for p in self.host_processes],
            "warnings": self.warnings,
        }
        if self.launchers is not None:
            doc["launchers"] = [launcher.to_json() for launcher in self.launchers]
        return doc

    def launcher(self, pid: int) -> Launcher | None:
        return next((launcher for launcher in self.launchers or () if launcher.pid == pid), None)

    @classmethod
    def from_json(cls, doc: object) -> Snapshot:
        """A ``gpuslate.status.v1`` document (this host's or another's) as the Snapshot it was."""
        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            launchers = f.items("launchers", Launcher.from_json, default=None)
            return cls(f.text("host"), f.text("backend"), f.opt_text("driver_version"), f.time("taken_at"),
                       f.items("gpus", GpuState.from_json), f.items("host_processes", HolderProcess.from_json),
                       f.texts("warnings"), tuple(launchers) if launchers is not None else None)

    def holders(self) -> dict[int, Holding]:
        """Every process holding one of the snapshot's GPUs, its holds together."""
        return holdings((p.pid, g.index, p.kind, p.used_memory) for g in self.gpus for p in g.processes)




def resolve_gpus(backend: GpuBackend, gpus: Sequence[int] | None) -> list[int]:
    """Validate a GPU selection against the host; ``None`` means all GPUs."""
    count = backend.device_count()
    if gpus is None:
        return list(range(count))
    bad = [g for g in gpus if g < 0 or g >= count]
    if bad:
        raise UsageError(
            f"GPU {bad[0]} does not exist: this host has {count} GPU{'s' if count != 1 else ''}"
            + (f" (0-{count - 1})" if count else "")
        )
    return sorted(set(gpus))


def take_snapshot(backend: GpuBackend, gpus: Sequence[int] | None = None, *, full: bool = True) -> Snapshot:
    """Read the selected GPUs and every process that holds them."""
    taken_at = time.time()
    indices = resolve_gpus(backend, gpus)
    # The /proc scan runs while the driver answers: NVML calls release the GIL
    # and some of them (utilization, power) block for milliseconds.
    scans: list[FdScan] = []
    scanner = threading.Thread(target=lambda: scans.append(
        scan_device_holders(backend.device_prefixes(), exclude_pids=frozenset({os.getpid()}))))
    scanner.start()
    try:
        readings = backend.read(indices, full=full)
    finally:
        scanner.join()
    if not scans:  # the scan thread failed; scan again here so its error surfaces
        scans.append(scan_device_holders(backend.device_prefixes(), exclude_pids=frozenset({os.getpid()})))
    scan = scans[0]
    table = ProcTable()
    infos: dict[int, tuple[ProcessInfo, str | None, str | None] | None] = {}
    prover: Prover | None = None

    def holder(pid: int, kind: str, used: int | None) -> HolderProcess:
        nonlocal prover
        if pid not in infos:
            info = read_info(pid)
            daemon = exe_daemon(pid) if info else None
            if daemon is not None:  # proven only where a daemon runs: the check reads its environment and maps
                prover = prover or Prover()
                infos[pid] = (info, daemon, prover.unproven(pid, daemon)) if info else None
            else:
                infos[pid] = (info, None, None) if info else None
        known = infos[pid]
        if known is None:
            return HolderProcess(pid, kind, used, None, None, None, None, None, None, None, None,
                                 pid, None, None, False)
        info, daemon, unproven = known
        return HolderProcess(
            pid, kind, used, info.start_ticks, info.user, info.uid, info.name, info.command,
            info.ppid, info.pgid, info.sid, table.root_pid(pid), info.state, info.container, True,
            info.cgroup, daemon, None, unproven, cpu_time_s=info.cpu_time_s, host_memory=info.host_memory,
        )

    # which GPUs each fd holder holds; holders of control devices only are host-level
    handle_gpus: dict[int, set[int]] = {}
    control_only: list[int] = []
    for pid, paths in scan.holders.items():
        idx = {g for g in (backend.gpu_for_path(p) for p in paths) if g is not None}
        if idx:
            handle_gpus[pid] = idx
        else:
            control_only.append(pid)

    states: list[GpuState] = []
    for r in readings:
        procs = [holder(p.pid, p.kind, p.used_memory) for p in (r.processes or [])]
        listed = {p.pid for p in procs}
        procs += [holder(pid, ProcessKind.HANDLE, None) for pid, g in sorted(handle_gpus.items())
                  if r.index in g and pid not in listed]
        states.append(GpuState(r, procs))
    states = _with_mps_servers(states)

    warnings: list[str] = [w for r in readings if (w := leak_warning(r, default_max_used(backend), backend.name))]
    if scan.unreadable:
        warnings.append(
            f"{len(scan.unreadable)} processes could not be inspected (permission denied): "
            "device-handle holders among them are not shown; run as root for the full picture"
        )
    return Snapshot(
        host=os.uname().nodename, backend=backend.name, driver_version=backend.driver_version(),
        taken_at=taken_at, gpus=states,
        host_processes=[holder(pid, ProcessKind.HANDLE, None) for pid in sorted(control_only)],
        warnings=warnings, launchers=_launchers(states),
    )


def _with_mps_servers(states: list[GpuState]) -> list[GpuState]:
    """The states with each MPS client's server named, where it can be told (see :mod:`.daemons`)."""
    found = mps_links(states, every=False)[0]
    if not found:
        return states
    return [GpuState(g.reading, [p._replace(mps_server=found[p.pid]) if p.pid in found and p.kind != "handle"
                                 else p for p in g.processes]) for g in states]


def mps_links(states: Sequence[GpuState], *, every: bool = True) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
    """(client pid -> its server, where it can be told; client pid -> every server it could be a client
    of, see :func:`.daemons.mps_possible`). A client is a process the driver lists as an MPS client
    (kind ``mps``), a server one running the MPS server's system program. Environments are read only
    where they can decide: with ``every`` (the plan: which servers each client protects), those of
    every client and server; without it (naming only), of the clients with several candidates."""
    client_gpus: dict[int, set[int]] = {}
    server_gpus: dict[int, set[int]] = {}
    seen: dict[int, HolderProcess] = {}
    for g in states:
        for p in g.processes:
            if p.kind == ProcessKind.HANDLE:
                continue
            seen.setdefault(p.pid, p)
            if p.daemon == MPS_SERVER and p.visible:
                server_gpus.setdefault(p.pid, set()).add(g.index)
            elif p.kind == ProcessKind.MPS:  # one this /proc does not show (a container's) is a client all the same
                client_gpus.setdefault(p.pid, set()).add(g.index)
    if not client_gpus or not server_gpus:
        return {}, {}
    clients = {pid: MpsEnd(seen[pid].uid, frozenset(g)) for pid, g in client_gpus.items()}
    servers = {pid: MpsEnd(seen[pid].uid, frozenset(g)) for pid, g in server_gpus.items()}
    candidates = mps_candidates(clients, servers)
    pipes: dict[int, str | None] = {}
    for client in clients if every else [c for c, options in candidates.items() if len(options) > 1]:
        pipes[client] = read_client_pipe(client) if seen[client].visible else None  # not ours to read: unknown
        for s in servers if every else candidates[client]:
            if s not in pipes:
                pipes[s] = read_server_pipe(s, seen[s].ppid)
    return mps_servers(candidates, pipes), mps_possible(clients, servers, pipes) if every else {}


def _launchers(states: list[GpuState]) -> tuple[Launcher, ...]:
    """The roots of the holders' jobs that hold none of these GPUs themselves, read now."""
    holding = {p.pid for g in states for p in g.processes}
    out = []
    for root in sorted({p.root_pid for g in states for p in g.processes} - holding):
        info = read_info(root)
        out.append(Launcher(root, info.user, info.command) if info else Launcher(root, None, None))
    return tuple(out)


def leak_reason(nbytes: int) -> str:
    """Why memory held by no process keeps a GPU busy (``status``'s warning, the diagnosis of
    ``clear`` and ``wait``)."""
    return (f"{format_size(nbytes)} held by no process: a leaked or driver-held context (an MPS "
            "server, a CUDA IPC handle, a process in another container or PID namespace), or a teardown "
            "still running")


def leak_remedy(gpu: int, backend: str) -> str:
    """What to do about memory held by no process on ``gpu``: nothing gpuslate may signal holds it."""
    if backend == "sim":
        return "on a simulated host it stays until the next 'gpuslate sim init'"
    return ("if MPS runs, stop it ('echo quit | nvidia-cuda-mps-control'); in a container, look from the host "
            "itself ('gpuslate status' there); else an administrator can reset the GPU once nothing uses it "
            f"('nvidia-smi --gpu-reset -i {gpu}'): gpuslate never resets a GPU")


def leak_warning(r: GpuReading, max_used: int, backend: str) -> str | None:
    """``GPU N: X used, held by no process ...; remedy: ...`` when more than ``max_used`` (the
    host's idle --max-used) of the GPU's memory is held by no process the driver lists."""
    left = held_by_no_process(r)
    if left is None or left <= max_used:
        return None
    return f"GPU {r.index}: {leak_reason(left)}; remedy: {leak_remedy(r.index, backend)}"
