"""Process trees: a consistent, lazily read view of the host's process table.

Which processes form a job, and which are protected, is decided in
:mod:`.jobs`; this module only reads ``/proc`` once per process per decision.
"""

from __future__ import annotations

import os

from .jobs import Protection, ancestors, job_root
from .procfs import (
    PROC,
    ProcStat,
    SignalFacts,
    list_pids,
    read_cmdline,
    read_exe,
    read_exe_is_system,
    read_pid_ns,
    read_signal_facts,
    read_stat,
)


class ProcTable:
    """A lazily filled view of the host's processes for one decision.

    Reads each ``/proc/PID/stat`` at most once; the full table (needed to
    find descendants and group members) is only built when asked for.
    """

    def __init__(self) -> None:
        self._stats: dict[int, ProcStat | None] = {}
        self._argv: dict[int, tuple[str, ...]] = {}
        self._uids: dict[int, int | None] = {}
        self._exes: dict[int, str | None] = {}
        self._system: dict[int, bool] = {}
        self._sigs: dict[int, SignalFacts | None] = {}
        self._ns: dict[int, tuple[int, ...] | None] = {}
        self._indexes: dict[str, dict[int, list[int]]] = {}  # ppid|pgid|sid -> pids, built on first use
        self._complete = False

    def get(self, pid: int) -> ProcStat | None:
        if pid not in self._stats:
            if self._complete:
                return None
            self._stats[pid] = read_stat(pid)
        return self._stats[pid]

    def argv(self, pid: int) -> tuple[str, ...]:
        if pid not in self._argv:
            self._argv[pid] = tuple(read_cmdline(pid, self._image(pid)))
        return self._argv[pid]

    def _image(self, pid: int) -> str | None:
        """Where the process's program and command line show (a live thread's folder when its
        leader thread has exited: :attr:`ProcStat.image_dir`); None: the default."""
        st = self.get(pid)
        return st.image_dir if st is not None else None

    def uid(self, pid: int) -> int | None:
        """The owner of a process (the owner of its /proc folder); None once it is gone."""
        if pid not in self._uids:
            try:
                self._uids[pid] = os.stat(f"{PROC}/{pid}").st_uid
            except OSError:
                self._uids[pid] = None
        return self._uids[pid]

    def exe(self, pid: int) -> str | None:
        if pid not in self._exes:
            self._exes[pid] = read_exe(pid, self._image(pid))
        return self._exes[pid]

    def exe_is_system(self, pid: int) -> bool:
        if pid not in self._system:
            self._system[pid] = read_exe_is_system(pid, self._image(pid))
        return self._system[pid]

    def signal_facts(self, pid: int) -> SignalFacts | None:
        if pid not in self._sigs:
            self._sigs[pid] = read_signal_facts(pid)
            if self._sigs[pid] is None:
                self._forget_if_gone(pid)
        return self._sigs[pid]

    def pid_ns(self, pid: int) -> tuple[int, ...] | None:
        if pid not in self._ns:
            self._ns[pid] = read_pid_ns(pid)
            if self._ns[pid] is None:
                self._forget_if_gone(pid)
        return self._ns[pid]

    def _forget_if_gone(self, pid: int) -> None:
        """A fact that could not be read because the process exited since the table was read: the
        table says so (``get`` is None), so that a caller that re-checks liveness does not count a
        process that no signal can reach any more as an unknown one. Only when /proc has no such
        pid at all: a pid reused since, or a zombie, keeps what the table read."""
        if read_stat(pid) is None:
            self._stats[pid] = None

    def load_all(self) -> None:
        if self._complete:
            return
        for pid in list_pids():
            if pid not in self._stats:
                self._stats[pid] = read_stat(pid)
        self._complete = True

    def all(self) -> list[ProcStat]:
        self.load_all()
        return [st for st in self._stats.values() if st is not None]

    def _by(self, field: str) -> dict[int, list[int]]:
        """Every process by one of its stat fields (``ppid``, ``pgid``, ``sid``), read once."""
        index = self._indexes.get(field)
        if index is None:
            index = {}
            for st in self.all():
                index.setdefault(getattr(st, field), []).append(st.pid)
            self._indexes[field] = index
        return index

    def children(self, pid: int) -> list[int]:
        return self._by("ppid").get(pid, [])

    def descendants(self, pid: int) -> list[int]:
        """Every descendant, whatever it is (units use this for their own trees)."""
        out: list[int] = []
        stack = list(self.children(pid))
        seen = {pid}
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            out.append(p)
            stack.extend(self.children(p))
        return out

    def ancestors(self, pid: int) -> list[int]:
        """Parent, grandparent, ... up to PID 1 (cycle-safe)."""
        return ancestors(self, pid)

    def group_members(self, pgid: int) -> list[int]:
        return self._by("pgid").get(pgid, [])

    def all_pids(self) -> list[int]:
        return [st.pid for st in self.all()]

    def session_members(self, sid: int) -> list[int]:
        return self._by("sid").get(sid, [])

    def root_pid(self, pid: int) -> int:
        """The root of the job that ``pid`` belongs to, as anyone sees it (see :mod:`.jobs`)."""
        return job_root(self, pid, Protection(self, None))
