"""One unit, loaded once: its record (or why the record cannot be read), its spec, its fence.

Every unit command (``up``, ``down``, ``ps``, ``logs``, ``swap``) loads the
units it works on once as :class:`Unit` objects and asks them, rather than
reading the record again and re-deriving its processes in each step.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..gpu.types import GpuReading
from ..proc.procfs import ProcessId, ProcStat, boot_id, epoch_to_ticks
from ..proc.tree import ProcTable
from . import store
from .contain import gpuslate_cgroups
from .fence import Fence, Marker, MarkerFence, UnitMark, classify, fence_of, read_environ
from .preflight import port_listener
from .readiness import Probe
from .spec import UnitSpec
from .state import Phase, UnitFacts, UnitState, needs_readiness_answer, unit_state
from .strays import Candidate, Stray, decide, reason
from .strays import Rule as StrayRule


@dataclass(frozen=True)
class Unit:
    name: str
    path: Path
    record: store.UnitRecord | None  # None: the record file is unreadable (see ``problem``)
    problem: store.Unreadable | None
    spec: UnitSpec | None  # the spec it last ran with
    fence: Fence
    mark: UnitMark | None = None  # how its processes are marked (None: read back from a document)

    @classmethod
    def load(cls, units: store.UnitStore, name: str) -> Unit | None:
        """Unit ``name`` as recorded in ``units``; None when it has no record. A corrupt record gives
        a Unit all the same (``corrupt``), fenced by what can still be found of it."""
        rec = units.read(name)
        if rec is None:
            return None
        mark = units.mark()
        if isinstance(rec, store.UnitRecord):
            try:
                spec = UnitSpec.from_json(rec.spec).validate()
            except (UsageError, TypeError, ValueError) as exc:
                rec = store.Unreadable(units.record_path(name), f"its spec is invalid: {exc}",
                                       {"pid": rec.pid, "start_ticks": rec.start_ticks, "port": rec.port,
                                        "cgroup": rec.cgroup, "launched_at": rec.launched_at, "gpus": rec.gpus,
                                        "instance": rec.instance, "boot": rec.boot})
            else:
                fence = fence_of(rec, mark, units.seen(name, rec.instance))
                return cls(name, units.record_path(name), rec, None, spec, fence,
                           UnitMark(name, rec.instance or None, mark))
        instance = rec.salvage.get("instance") or ""
        return cls(name, rec.path, None, rec, None,
                   _marker_fence(name, rec.path, rec.salvage, mark, units.seen(name, instance)))

    @property
    def instance(self) -> str:
        """The unit instance's id ("" when it is not known: a record from before them, a torn one)."""
        if self.record is not None:
            return self.record.instance
        return str(self.problem.salvage.get("instance") or "") if self.problem else ""

    def record_seen(self, units: store.UnitStore, members: Iterable[ProcStat]) -> None:
        """Record ``members`` (found in the unit now, by a tie that proves it) as the instance's, so that
        a later rename or ``setsid`` cannot hide them (:meth:`~.store.UnitStore.record_seen`)."""
        units.record_seen(self.name, self.instance, [st.ident for st in members if not st.has_exited])

    @property
    def corrupt(self) -> bool:
        return self.record is None

    @property
    def gpus(self) -> list[int]:
        """The unit's GPUs; for a corrupt record, those it still shows (else none: not verified)."""
        if self.record is not None:
            return self.record.gpus
        return list(self.problem.salvage.get("gpus", [])) if self.problem else []

    def members(self, table: ProcTable | None = None) -> list[ProcStat]:
        return self.fence.members(table or ProcTable())

    def running(self, table: ProcTable | None = None) -> bool:
        return bool(self.members(table))

    def up_alive(self, table: ProcTable) -> bool:
        """Whether the gpuslate process that launched the unit still runs (same start time)."""
        by = self.record.launched_by if self.record else {}
        pid, ticks = by.get("pid"), by.get("start_ticks")
        if not isinstance(pid, int) or pid <= 0:
            return False
        st = table.get(pid)
        return st is not None and st.start_ticks == ticks and not st.has_exited

    def strays(self, readings: Sequence[GpuReading], table: ProcTable, members: Iterable[int],
               claimed: Iterable[int] = ()) -> list[Stray]:
        """The processes :mod:`.strays` cannot rule out, among those ``readings`` show holding GPU
        memory (on any GPU) and the one listening on the unit's port; ``members``: the unit's live
        processes, ``claimed``: other units'. The port is looked at only while the main process is
        gone (a live one holds it), environments only of processes the other facts leave in."""
        rec = self.record
        if rec is None or (rec.boot and rec.boot != boot_id()):  # its life was in another boot: nothing of now
            return []
        mine = set(members)
        skip = {*mine, *claimed, os.getpid(), *table.ancestors(os.getpid())}
        stopped = None if rec.stopped_at is None else epoch_to_ticks(rec.stopped_at)
        rule = StrayRule(os.getuid(), rec.start_ticks, stopped, frozenset(rec.gpus), rec.port)
        memory: dict[int, dict[int, int]] = {}
        for r in readings:
            for p in r.processes or []:
                if p.used_memory:
                    memory.setdefault(p.pid, {})[r.index] = memory.get(p.pid, {}).get(r.index, 0) + p.used_memory
        listener = port_listener(rec.port) if rec.port is not None and rec.pid not in mine else None
        out: list[Candidate] = []
        for pid in sorted({*memory, *([listener] if listener else [])}):
            st = table.get(pid)
            if st is None:
                continue
            c = Candidate(pid, st.start_ticks, st.name, st.has_exited, table.uid(pid), pid in skip, Marker.UNREAD,
                          memory.get(pid, {}), pid == listener)
            # the environments are read only where they can still decide (one not intact is the widest)
            if self.mark is not None and reason(rule, c._replace(marker=Marker.NOT_INTACT)) is not None:
                c = c._replace(marker=classify(read_environ(pid), self.mark))
                lead = table.get(st.sid) if st.sid > 0 else None
                if c.marker == Marker.NOT_INTACT and lead is not None and not lead.has_exited \
                        and table.uid(lead.pid) == os.getuid():
                    c = c._replace(leader=classify(read_environ(lead.pid), self.mark))
            out.append(c)
        return decide(rule, out)

    def facts(self, table: ProcTable, members: Sequence[ProcStat], strays: Sequence[Stray] = (),
              ask: bool = True) -> UnitFacts:
        """What :func:`~.state.unit_state` decides on; asks the server only when that matters."""
        rec = self.record
        if rec is None:
            return UnitFacts(None, False, bool(members), False, None, tuple(s.pid for s in strays))
        main_alive = any(st.pid == rec.pid and st.start_ticks == rec.start_ticks for st in members)
        up_alive = self.up_alive(table)
        answer = None
        if ask and self.spec is not None and needs_readiness_answer(Phase(rec.phase), main_alive, up_alive):
            answer = Probe(self.spec, Path(rec.log)).check(timeout=0.5)
        return UnitFacts(Phase(rec.phase), main_alive, bool(members), up_alive, answer,
                         tuple(s.pid for s in strays))

    def state(self, table: ProcTable | None = None) -> UnitState:
        table = table or ProcTable()
        return unit_state(self.facts(table, self.members(table)))

    def describe_problem(self) -> str:
        assert self.problem is not None
        return f"unit {self.name} has a corrupt record {self.problem.path}: {self.problem.reason}"


def _marker_fence(name: str, path: Path, salvage: dict[str, Any], state: str,
                  seen: Iterable[ProcessId] = ()) -> MarkerFence:
    cg = salvage.get("cgroup")
    # a torn record names processes to signal only through a cgroup gpuslate made for this name
    ours = isinstance(cg, str) and cg.rstrip("/").rsplit("/", 1)[-1].startswith(f"gpuslate-{name}-")
    trusted = (cg,) if ours and isinstance(cg, str) else ()  # (ours implies a str: said again for mypy)
    candidates = tuple(c for c in gpuslate_cgroups(name) if c not in trusted)
    pid, ticks = salvage.get("pid"), salvage.get("start_ticks")
    main = ProcessId(pid, ticks) if isinstance(pid, int) and isinstance(ticks, int) else None
    if salvage.get("boot") and salvage["boot"] != boot_id():  # another boot's numbers name strangers now
        main, ticks, seen = None, None, ()
    try:
        written = epoch_to_ticks(os.stat(path, follow_symlinks=False).st_mtime)
    except OSError:
        written = None
    instance = salvage.get("instance") or None
    return MarkerFence(UnitMark(name, instance, state), trusted, candidates, salvage.get("port"),
                       ticks if isinstance(ticks, int) else None, main, written, tuple(sorted(seen)))


def load_units(units: store.UnitStore) -> list[Unit]:
    """Every unit with a record file in ``units``, corrupt ones included."""
    out = []
    for name in units.names():
        u = Unit.load(units, name)
        if u is not None:
            out.append(u)
    return out


def unit_of_pids(units: Sequence[Unit], table: ProcTable) -> dict[int, str]:
    """pid -> name of the unit it belongs to, for every live process of every unit."""
    out: dict[int, str] = {}
    for u in units:
        for st in u.members(table):
            out.setdefault(st.pid, u.name)
    return out
