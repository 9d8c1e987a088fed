"""``ps``: every unit with its state as the host shows it now, not as it was recorded.

The state is :func:`~.state.unit_state` of facts gathered here once for all
units: their live processes, the GPU memory on their GPUs, the processes
started while a unit ran that hold its GPUs without being found in it, and,
for a unit whose ``up`` vanished while it was starting, one readiness probe.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from ..gpu.types import GpuReading
from ..proc.procfs import ticks_to_epoch
from ..proc.tree import ProcTable
from .._parse import format_size
from .._time import iso_time
from ..host.session import HostContext
from .state import UnitState, unit_state
from .store import UnitRecord
from .unit import Stray, Unit, load_units

PS_SCHEMA = "gpuslate.ps.v1"
STATES = tuple(s.value for s in UnitState)


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


class PsResult(NamedTuple):
    units: list[UnitStatus]
    warnings: list[str]

    def get(self, name: str) -> UnitStatus | None:
        return next((u for u in self.units if u.unit.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PS_SCHEMA, "units": [u.to_json() for u in self.units], "warnings": self.warnings}


def list_units(host: HostContext) -> PsResult:
    """Every recorded unit (corrupt records included), classified against the live host.

    Takes no lock: what it reports is a look, as ``status`` is."""
    units = load_units()
    table = ProcTable()
    warnings: list[str] = []
    members = {u.name: u.members(table) for u in units}
    readings: list[GpuReading] = []
    wanted = sorted({g for u in units for g in u.gpus})
    known = False
    if wanted:
        try:
            readings = host.backend.read(wanted, full=False)
            known = True
        except Exception as exc:  # ps still lists the units when the GPUs cannot be read
            warnings.append(f"GPU memory unknown: {exc}")
    owner = {st.pid: name for name, procs in members.items() for st in procs}
    out: list[UnitStatus] = []
    for u in units:
        procs = members[u.name]
        pids = {st.pid for st in procs}
        strays = u.strays(readings, table, pids, (p for p, n in owner.items() if n != u.name))
        state = unit_state(u.facts(table, procs, strays))
        held = pids | {s.pid for s in strays}
        mem = sum(p.used_memory or 0 for r in readings if r.index in u.gpus for p in r.processes or []
                  if p.pid in held) if known else None
        rec = u.record
        main = next((st for st in procs if rec and st.pid == rec.pid and st.start_ticks == rec.start_ticks), None)
        uptime = time.time() - ticks_to_epoch(main.start_ticks) if main else None
        if u.problem is not None:
            warnings.append(f"{u.describe_problem()}; 'gpuslate down {u.name}' stops what is found of it "
                            f"({len(procs)} process{'es' if len(procs) != 1 else ''}) and sets the record aside")
        for s in strays:
            warnings.append(f"unit {u.name}: pid {s.pid} ({s.name}) holds {format_size(s.used_memory)} on GPU "
                            f"{','.join(map(str, s.gpus))}; it started while the unit ran but is not found in it: "
                            f"'gpuslate down {u.name} --clear' ends it")
        out.append(UnitStatus(u, state, sorted(pids), mem, uptime, strays))
    return PsResult(out, warnings)
