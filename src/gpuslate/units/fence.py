"""A unit's fence: which live processes belong to it, how to end them all at once, and how to
clean up after them. One type per kind of containment, chosen once when the unit is loaded.

* :class:`SessionFence`: the unit's session and process group, the main
  process's descendants, the processes recorded at readiness (each identity
  checked) and, when nothing stronger fences the unit, processes started
  since it that carry its ``GPUSLATE_UNIT`` environment marker;
* :class:`CgroupFence`: every process of its cgroup (descendants cannot
  leave it), plus the session fence; ends with ``cgroup.kill``;
* :class:`ScopeFence`: the same for a transient systemd scope;
* :class:`MarkerFence`: for a unit whose record cannot be read: the cgroups
  gpuslate made for that name, the processes carrying its marker and the
  sessions such a process leads, the main process and its session when the
  torn record still shows its pid and start time, and the invoking user's
  process listening on the port the torn record still shows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Protocol

from ..proc.procfs import ProcessId, ProcStat
from ..proc.tree import ProcTable
from .contain import cgroup_kill, cgroup_pids, discard_cgroup
from .preflight import port_listener
from .store import UnitRecord

FenceKind = Literal["cgroup", "scope", "session", "marker"]


class Fence(Protocol):
    kind: FenceKind
    cgroup: str | None  # the cgroup (relative to the cgroup2 mount) when there is one

    def members(self, table: ProcTable) -> list[ProcStat]:
        """Every live process of the unit (never zombies, never this process or its ancestors)."""
        ...

    def kill(self) -> bool:
        """SIGKILL everything inside at once where the kernel can; False when it cannot."""
        ...

    def release(self, wait: float = 0.0) -> None:
        """Remove what the fence left behind once it is empty; blocks at most ``wait`` seconds."""
        ...


def has_marker(pid: int, name: str) -> bool:
    """Whether ``pid``'s environment has ``GPUSLATE_UNIT=name`` (inherited by every descendant;
    gone when a process rewrote its environment block, as setproctitle does)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:  # gone, or another user's process: not readable, and not ours to stop
        return False
    return f"\0GPUSLATE_UNIT={name}\0".encode() in b"\0" + env


def _finish(found: dict[int, ProcStat], table: ProcTable) -> list[ProcStat]:
    # never ourselves, nor whatever runs us (gpuslate started from inside the unit)
    for pid in [os.getpid(), *table.ancestors(os.getpid())]:
        found.pop(pid, None)
    return sorted(found.values(), key=lambda s: s.pid)


def _add(found: dict[int, ProcStat], st: ProcStat | None) -> None:
    if st is not None and not st.has_exited:
        found[st.pid] = st


@dataclass(frozen=True)
class SessionFence:
    name: str
    main: ProcessId
    pgid: int
    sid: int
    recorded: tuple[ProcessId, ...] = ()
    scan_marker: bool = True  # only when no cgroup holds the unit: the scan reads every environ
    kind: FenceKind = "session"
    cgroup: str | None = None

    def collect(self, table: ProcTable, found: dict[int, ProcStat]) -> None:
        main = table.get(self.main.pid)
        main_is_ours = main is not None and main.start_ticks == self.main.start_ticks
        # The kernel keeps a session or group id from being reused while any member
        # lives; a live process with the leader's pid but another start time means
        # all members are gone and the number now names someone else's session.
        if main is None or main_is_ours:
            for st in table.all():
                if st.sid == self.sid or st.pgid == self.pgid:
                    _add(found, st)
        if main_is_ours:
            _add(found, main)
            for pid in table.descendants(self.main.pid):
                _add(found, table.get(pid))
        for ident in self.recorded:
            st = table.get(ident.pid)
            if st is not None and st.start_ticks == ident.start_ticks:
                _add(found, st)
        if self.scan_marker:
            # a descendant that double-forked into a session of its own is found by the
            # environment it inherited, among processes started since the unit
            for st in table.all():
                if st.pid not in found and st.start_ticks >= self.main.start_ticks and has_marker(st.pid, self.name):
                    _add(found, st)

    def members(self, table: ProcTable) -> list[ProcStat]:
        found: dict[int, ProcStat] = {}
        self.collect(table, found)
        return _finish(found, table)

    def kill(self) -> bool:
        return False

    def release(self, wait: float = 0.0) -> None:
        return None


@dataclass(frozen=True)
class CgroupFence:
    path: str | None  # None for a scope whose cgroup was not seen at launch
    session: SessionFence
    kind: FenceKind = "cgroup"

    @property
    def cgroup(self) -> str | None:
        return self.path

    def members(self, table: ProcTable) -> list[ProcStat]:
        found: dict[int, ProcStat] = {}
        for pid in cgroup_pids(self.path):
            _add(found, table.get(pid))
        self.session.collect(table, found)
        return _finish(found, table)

    def kill(self) -> bool:
        return bool(self.path and cgroup_pids(self.path)) and cgroup_kill(self.path)

    def release(self, wait: float = 0.0) -> None:
        discard_cgroup(self.path, wait)


@dataclass(frozen=True)
class ScopeFence(CgroupFence):
    """A transient systemd scope: a cgroup systemd made (and collects once it is empty)."""

    kind: FenceKind = "scope"


@dataclass(frozen=True)
class MarkerFence:
    """What can still be found of a unit whose record is unreadable."""

    name: str
    cgroups: tuple[str, ...] = ()
    port: int | None = None
    since_ticks: int | None = None  # the torn record's main start time, when it still reads
    main: ProcessId | None = None  # the torn record's main process, when pid and start time read
    written_ticks: float | None = None  # when the record was last written (boot clock ticks)
    kind: FenceKind = "marker"

    @property
    def cgroup(self) -> str | None:
        return self.cgroups[0] if self.cgroups else None

    def members(self, table: ProcTable) -> list[ProcStat]:
        found: dict[int, ProcStat] = {}
        for cg in self.cgroups:
            for pid in cgroup_pids(cg):
                _add(found, table.get(pid))
        main = table.get(self.main.pid) if self.main else None
        if main is not None and self.main is not None and main.start_ticks == self.main.start_ticks:
            # a unit's main process leads its own session and group (launch.py): with its
            # identity verified, so are they
            for st in table.all():
                if st.sid == main.pid or st.pgid == main.pid:
                    _add(found, st)
            _add(found, main)
            for pid in table.descendants(main.pid):
                _add(found, table.get(pid))
        since = self.since_ticks or 0
        marked = [st for st in table.all()
                  if st.pid not in found and st.start_ticks >= since and has_marker(st.pid, self.name)]
        for st in marked:
            _add(found, st)
        listener = self._listener(table, since)
        if listener is not None:
            _add(found, listener)
        # a marked session leader (or the server on the port leading one) is the unit's main process
        # or a part of it that left with setsid: its session is the unit's too, workers that
        # renamed themselves (and lost the marker) included
        leaders = {st.pid for st in [*marked, *([listener] if listener else [])] if st.sid == st.pid}
        for st in table.all():
            if st.sid in leaders:
                _add(found, st)
        return _finish(found, table)

    def _listener(self, table: ProcTable, since: int) -> ProcStat | None:
        if self.port is not None and self.written_ticks is not None:
            # The server on the unit's port, if it is the invoking user's and started before the
            # record was last written: the port was free when the unit launched (pre-flight) and
            # the record is rewritten at ready and at stop, so a listener started later is not it.
            pid = port_listener(self.port)
            st = table.get(pid) if pid else None
            if (st is not None and since <= st.start_ticks <= self.written_ticks
                    and not st.has_exited and _owned_by_me(st.pid)):
                return st
        return None

    def kill(self) -> bool:
        return any([cgroup_kill(cg) for cg in self.cgroups if cgroup_pids(cg)])

    def release(self, wait: float = 0.0) -> None:
        for cg in self.cgroups:
            discard_cgroup(cg, wait)


def _owned_by_me(pid: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def fence_of(rec: UnitRecord) -> Fence:
    """The fence of a unit as its record describes it."""
    session = SessionFence(rec.name, rec.ident, rec.pgid, rec.sid, tuple(rec.member_ids),
                           scan_marker=rec.cgroup is None)
    if rec.containment == "cgroup":
        return CgroupFence(rec.cgroup, session)
    if rec.containment == "scope":
        return ScopeFence(rec.cgroup, session)
    return session
