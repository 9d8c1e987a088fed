"""``ps``: every unit with its state as the host shows it now, not as it was recorded.

The state is :func:`~.state.unit_state` of facts gathered here once for all
units: their live processes, the GPU memory on their GPUs, the processes
started while a unit ran that hold its GPUs or port without being found in it
(its blocking strays; one on another GPU is a warning), and, for a unit whose
``up`` vanished while it was starting, one readiness probe.

Each ``ps`` records the identities it found in each unit (the unit's instance's
``seen`` file, :meth:`~.store.UnitStore.record_seen`): what a tie proves now
stays proven after a rename or a ``setsid``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from .._document import Fields, Malformed, checked, reading
from .._time import iso_time
from ..errors import PermissionDenied
from ..gpu.types import GpuReading
from ..host.session import HostContext
from ..options import Containment, PsOptions
from ..outcome import Outcome, StatusEnum
from ..proc.procfs import ticks_to_epoch
from ..proc.tree import ProcTable
from .fence import FenceKind
from .front import Front
from .state import Phase, UnitState, unit_state
from .store import CONTAINMENTS, UnitRecord, UnitStore, Unreadable
from .strays import Stray
from .unit import Unit, load_units

PS_SCHEMA = "gpuslate.ps.v1"
STATES = tuple(s.value for s in UnitState)
#: the states a unit has when nothing of it runs; one stopped long ago is hidden (see PsOptions)
_DONE = (UnitState.STOPPED, UnitState.FAILED)


def hidden_by(options: PsOptions, state: UnitState, stopped_at: float | None, now: float) -> bool:
    """Whether ``ps`` without ``-a`` leaves this unit out (pure; see :class:`PsOptions`)."""
    return (not options.all and state in _DONE and stopped_at is not None
            and now - stopped_at > options.recent_s)


@dataclass
class ReadBackFence:
    """The fence of a unit read back from a ``ps`` document (another host's, maybe): it names the
    cgroup the document named and finds no process here, so it can never be used to signal one."""

    recorded_cgroup: str | None
    kind: FenceKind = "document"

    @property
    def cgroup(self) -> str | None:
        return self.recorded_cgroup

    def members(self, table: ProcTable) -> list[Any]:
        return []

    def kill(self) -> bool:
        return False

    def release(self, wait: float = 0.0) -> None:
        pass


class UnitStatus(NamedTuple):
    unit: Unit
    state: UnitState
    processes: list[int]
    gpu_memory: int | None  # bytes the unit's processes (and strays) hold on its GPUs; None if unknown
    uptime_s: float | None
    strays: list[Stray] = []

    @property
    def record(self) -> UnitRecord | None:  # None: corrupt
        return self.unit.record

    @property
    def pid(self) -> int | None:
        r = self.unit.record
        return r.pid if r else (self.unit.problem.salvage.get("pid") if self.unit.problem else None)

    def to_json(self) -> dict[str, Any]:
        r = self.unit.record
        p = self.unit.problem
        doc: dict[str, Any] = {
            "name": self.unit.name, "state": self.state.value, "pid": self.pid,
            "gpu_memory": self.gpu_memory, "processes": self.processes,
            "uptime_s": round(self.uptime_s, 3) if self.uptime_s is not None else None,
            "strays": [s.to_json() for s in self.strays],
            "record_file": str(self.unit.path), "corrupt_reason": p.reason if p else None,
        }
        if r is None:
            salvage = p.salvage if p else {}
            doc.update({"start_ticks": salvage.get("start_ticks"), "pgid": None, "sid": None,
                        "instance": salvage.get("instance") or None,
                        "containment": None, "cgroup": self.unit.fence.cgroup, "port": salvage.get("port"),
                        "gpus": self.unit.gpus, "launched_at": None, "ready_at": None, "stopped_at": None,
                        "time_to_ready_s": None, "exit_code": None, "failure": None, "command": None, "log": None})
            return doc
        doc.update({
            "start_ticks": r.start_ticks, "pgid": r.pgid, "sid": r.sid, "instance": r.instance or None,
            "containment": r.containment,
            "cgroup": r.cgroup, "port": r.port, "gpus": r.gpus,
            "launched_at": iso_time(r.launched_at), "ready_at": iso_time(r.ready_at) if r.ready_at else None,
            "stopped_at": iso_time(r.stopped_at) if r.stopped_at else None,
            "time_to_ready_s": r.time_to_ready_s, "exit_code": r.exit_code, "failure": r.failure,
            "command": r.spec.get("command"), "log": r.log,
        })
        return doc

    @classmethod
    def from_json(cls, d: object) -> UnitStatus:
        """A unit of a ``ps`` document, detached from any host (see :class:`ReadBackFence`); every
        field checked."""
        f = Fields(d)
        path = Path(f.text("record_file"))
        name, cgroup, corrupt = f.text("name"), f.opt_text("cgroup"), f.opt_text("corrupt_reason")
        if corrupt is not None:
            salvage: dict[str, Any] = {k: v for k, v in (
                ("pid", f.opt_pid("pid")), ("start_ticks", f.opt_integer("start_ticks", 0)),
                ("port", f.opt_integer("port", 1, 65535)), ("instance", f.opt_text("instance"))) if v is not None}
            salvage["gpus"] = f.gpus("gpus")
            unit = Unit(name, path, None, Unreadable(path, corrupt, salvage), None, ReadBackFence(cgroup))
        else:
            containment = f.text("containment")
            if containment not in CONTAINMENTS:
                raise Malformed(f"containment: expected one of {', '.join(CONTAINMENTS)}")
            rec = UnitRecord(
                name=name, spec={"command": f.texts("command")}, phase=Phase.STARTING, pid=f.pid("pid"),
                start_ticks=f.integer("start_ticks", 0), pgid=f.pid("pgid"), sid=f.pid("sid"),
                containment=Containment(containment), cgroup=cgroup, log=f.text("log"), gpus=f.gpus("gpus"),
                port=f.opt_integer("port", 1, 65535), env={},
                launched_at=f.time("launched_at"), ready_at=f.opt_time("ready_at"),
                time_to_ready_s=f.opt_seconds("time_to_ready_s"), stopped_at=f.opt_time("stopped_at"),
                exit_code=f.opt_integer("exit_code", -255, 255), failure=f.opt_text("failure"),
                instance=f.opt_text("instance") or "")
            unit = Unit(name, path, rec, None, None, ReadBackFence(cgroup))
        return cls(unit, f.choice("state", UnitState), f.pids("processes"), f.opt_size("gpu_memory"),
                   f.opt_seconds("uptime_s"), f.items("strays", Stray.from_json))


class PsStatus(StatusEnum):
    """A ``ps`` lists what it finds: a unit it cannot read is listed as corrupt, with a warning."""

    LISTED = "listed", Outcome.DONE


class PsResult(NamedTuple):
    units: list[UnitStatus]
    warnings: list[str]
    hidden: int = 0  # units left out: stopped longer ago than PsOptions.recent_s (ps -a lists them)
    # the fronts (units/front.py): {name, address, state, unit, next, upstream, reason, pid, last_swap, line}
    fronts: list[dict[str, Any]] = []

    def get(self, name: str) -> UnitStatus | None:
        return next((u for u in self.units if u.unit.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PS_SCHEMA, "units": [u.to_json() for u in self.units], "warnings": self.warnings,
                "hidden": self.hidden, "fronts": self.fronts}

    @property
    def status(self) -> PsStatus:
        return PsStatus.LISTED

    @classmethod
    def from_json(cls, doc: object) -> PsResult:
        f = Fields(checked(doc, PS_SCHEMA))
        with reading(PS_SCHEMA):  # hidden, fronts: absent in documents from before ps -a, before fronts
            fronts = f.raw("fronts", [])
            if not isinstance(fronts, list) or not all(isinstance(x, dict) for x in fronts):
                raise TypeError("fronts: expected a list of objects")
            return cls(f.items("units", UnitStatus.from_json), f.texts("warnings"),
                       f.integer("hidden", 0, default=0, what="a count"), fronts)


def list_units(host: HostContext, options: PsOptions = PsOptions()) -> PsResult:
    """Every recorded unit (corrupt records included), classified against the live host; without
    ``options.all``, those stopped long ago left out (counted in ``hidden``).

    Takes no lock: what it reports is a look, as ``status`` is."""
    store = UnitStore.of(host)
    units = load_units(store)
    table = ProcTable()
    warnings: list[str] = []
    members = {u.name: u.members(table) for u in units}
    for u in units:  # what a tie proves now stays proven (a later setsid or rename cannot hide it)
        try:
            u.record_seen(store, members[u.name])
        except PermissionDenied as exc:  # a look still lists: the next scan records them
            warnings.append(f"unit {u.name}: its processes could not be recorded: {exc}")
    readings: list[GpuReading] = []
    known = False
    if units:  # every GPU: a unit's stray may hold one the unit was not given (see .strays)
        try:
            readings = host.backend.read(None, full=False)
            known = True
        except Exception as exc:  # noqa: BLE001 - ps still lists the units when the GPUs cannot be read
            warnings.append(f"GPU memory unknown: {exc}")
    owner = {st.pid: name for name, procs in members.items() for st in procs}
    out: list[UnitStatus] = []
    hidden = 0
    now = time.time()
    for u in units:
        procs = members[u.name]
        pids = {st.pid for st in procs}
        strays = u.strays(readings, table, pids, (p for p, n in owner.items() if n != u.name))
        state = unit_state(u.facts(table, procs, [s for s in strays if s.blocking]))
        mem = sum(p.used_memory or 0 for r in readings if r.index in u.gpus for p in r.processes or []
                  if p.pid in pids) + sum(s.used_memory for s in strays) if known else None
        rec = u.record
        main = next((st for st in procs if rec and st.pid == rec.pid and st.start_ticks == rec.start_ticks), None)
        uptime = time.time() - ticks_to_epoch(main.start_ticks) if main else None
        if u.problem is not None:
            warnings.append(f"{u.describe_problem()}; 'gpuslate down {u.name}' stops what is found of it "
                            f"({len(procs)} process{'es' if len(procs) != 1 else ''}) and sets the record aside")
        for s in strays:
            warnings.append(f"unit {u.name}: {s.describe()}; it started while the unit ran, is not found in it "
                            f"and not proven its own, so gpuslate never signals it: '{s.remedy()}' ends it")
        if hidden_by(options, state, rec.stopped_at if rec else None, now):
            hidden += 1
            continue
        out.append(UnitStatus(unit=u, state=state, processes=sorted(pids), gpu_memory=mem, uptime_s=uptime,
                              strays=strays))
    fronts = []
    for f in Front.all(host):
        doc = f.to_json()
        if doc["state"] == "stopped" and not options.all:
            continue
        fronts.append({**doc, "line": f.describe()})
    return PsResult(units=out, warnings=warnings, hidden=hidden, fronts=fronts)
