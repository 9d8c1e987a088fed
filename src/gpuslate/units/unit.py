"""One unit, loaded once: its record (or why the record cannot be read), its spec, its fence.

Every unit command (``up``, ``down``, ``ps``, ``logs``, ``swap``) loads the
units it works on once as :class:`Unit` objects and asks them, rather than
reading the record again and re-deriving its processes in each step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import UsageError
from ..gpu.types import GpuReading
from ..proc.procfs import CLK_TCK, ProcessId, ProcStat
from ..proc.tree import ProcTable
from . import store
from .contain import gpuslate_cgroups
from .fence import Fence, MarkerFence, UnitMark, fence_of
from .readiness import Probe
from .spec import UnitSpec
from .state import Phase, UnitFacts, UnitState, needs_readiness_answer, unit_state


class Stray(NamedTuple):
    """A process holding memory on a unit's GPUs, started while the unit lived, that its fence does
    not find (it left the session and rewrote its environment): most likely the unit's own."""

    pid: int
    start_ticks: int
    name: str
    gpus: list[int]
    used_memory: int

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stray:
        return cls(d["pid"], d["start_ticks"], d["name"], list(d["gpus"]), d["used_memory"])


@dataclass(frozen=True)
class Unit:
    name: str
    path: Path
    record: store.UnitRecord | None  # None: the record file is unreadable (see ``problem``)
    problem: store.Unreadable | None
    spec: UnitSpec | None  # the spec it last ran with
    fence: Fence

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
                                        "instance": rec.instance})
            else:
                return cls(name, units.record_path(name), rec, None, spec, fence_of(rec, mark))
        return cls(name, rec.path, None, rec, None, _marker_fence(name, rec.path, rec.salvage, mark))

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
        """Holders of memory on the unit's GPUs started between its launch and its stop that are
        neither found in it nor in another unit (``claimed``), and are the caller's own: another
        user's process is never taken for a unit's stray (a crashed unit's GPUs and even its pid
        may be anyone's now)."""
        rec = self.record
        if rec is None:
            return []
        skip = {*members, *claimed, os.getpid(), *table.ancestors(os.getpid())}
        stopped = None if rec.stopped_at is None else epoch_to_ticks(rec.stopped_at)
        found: dict[int, Stray] = {}
        for r in readings:
            if r.index not in rec.gpus:
                continue
            for p in r.processes or []:
                st = table.get(p.pid)
                if p.pid in skip or not p.used_memory or st is None or st.has_exited:
                    continue
                if table.uid(p.pid) != os.getuid():
                    continue
                if st.start_ticks < rec.start_ticks:
                    continue
                if stopped is not None and st.start_ticks >= int(stopped):
                    # started after the unit was gone: someone else's. Start times are whole clock
                    # ticks, rounded down: one in the tick of the stop is taken to come after it
                    continue
                prev = found.get(p.pid)
                found[p.pid] = Stray(p.pid, st.start_ticks, st.name, [*(prev.gpus if prev else []), r.index],
                                     (prev.used_memory if prev else 0) + p.used_memory)
        return sorted(found.values())

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


def epoch_to_ticks(epoch: float) -> float:
    """An epoch time in the clock of process start times (ticks since boot). /proc/stat's btime
    is whole seconds, too coarse to tell a job started just after a stop: use the boot clock."""
    return (epoch - time.time() + time.clock_gettime(time.CLOCK_BOOTTIME)) * CLK_TCK


def _marker_fence(name: str, path: Path, salvage: dict[str, Any], state: str) -> MarkerFence:
    cg = salvage.get("cgroup")
    # a torn record names processes to signal only through a cgroup gpuslate made for this name
    ours = isinstance(cg, str) and cg.rstrip("/").rsplit("/", 1)[-1].startswith(f"gpuslate-{name}-")
    trusted = (cg,) if ours and isinstance(cg, str) else ()  # (ours implies a str: said again for mypy)
    candidates = tuple(c for c in gpuslate_cgroups(name) if c not in trusted)
    pid, ticks = salvage.get("pid"), salvage.get("start_ticks")
    main = ProcessId(pid, ticks) if isinstance(pid, int) and isinstance(ticks, int) else None
    try:
        written = epoch_to_ticks(os.stat(path, follow_symlinks=False).st_mtime)
    except OSError:
        written = None
    instance = salvage.get("instance") or None
    return MarkerFence(UnitMark(name, instance, state), trusted, candidates, salvage.get("port"),
                       ticks if isinstance(ticks, int) else None, main, written)


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
