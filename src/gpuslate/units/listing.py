"""``ps``: every unit with its state as the host shows it now, not as it was recorded.

States: ``starting`` / ``ready`` (the main process lives), ``exited`` (it
ended by itself and nothing of the unit is left), ``failed`` (``up`` gave up
on it), ``stopped`` (``down`` stopped it), ``orphaned`` (the main process is
dead but processes of the unit live on, typically workers still holding GPU
memory; ``down`` cleans them up).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence

from ..gpu import GpuBackend
from ..proc.procfs import ProcStat, ticks_to_epoch
from ..proc.tree import ProcTable
from .._time import iso_time
from . import store
from .contain import unit_processes
from .lifecycle import backend_for

PS_SCHEMA = "gpuslate.ps.v1"
STATES = ("starting", "ready", "exited", "failed", "stopped", "orphaned")


def classify(rec: store.UnitRecord, table: ProcTable, procs: Sequence[ProcStat] | None = None) -> str:
    procs = unit_processes(rec, table) if procs is None else procs
    main_alive = any(st.pid == rec.pid and st.start_ticks == rec.start_ticks for st in procs)
    if rec.phase in (store.FAILED, store.STOPPED):
        # what gpuslate could not stop (permission) is still running: say so
        return "orphaned" if procs else rec.phase
    if main_alive:
        return "starting" if rec.phase == store.STARTING else "ready"
    return "orphaned" if procs else "exited"


class UnitStatus(NamedTuple):
    record: store.UnitRecord
    state: str
    processes: list[int]
    gpu_memory: int | None  # bytes the unit's processes hold on its GPUs; None if unknown
    uptime_s: float | None

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "name": r.name, "state": self.state, "pid": r.pid, "start_ticks": r.start_ticks,
            "pgid": r.pgid, "sid": r.sid, "containment": r.containment, "cgroup": r.cgroup,
            "port": r.port, "gpus": r.gpus, "gpu_memory": self.gpu_memory, "processes": self.processes,
            "uptime_s": round(self.uptime_s, 3) if self.uptime_s is not None else None,
            "launched_at": iso_time(r.launched_at), "ready_at": iso_time(r.ready_at) if r.ready_at else None,
            "stopped_at": iso_time(r.stopped_at) if r.stopped_at else None,
            "time_to_ready_s": r.time_to_ready_s, "exit_code": r.exit_code, "failure": r.failure,
            "command": r.spec.get("command"), "log": r.log,
        }


class PsResult(NamedTuple):
    units: list[UnitStatus]
    warnings: list[str]

    def get(self, name: str) -> UnitStatus | None:
        return next((u for u in self.units if u.record.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"schema": PS_SCHEMA, "units": [u.to_json() for u in self.units], "warnings": self.warnings}


def list_units(*, sim: str | None = None, backend: GpuBackend | None = None) -> PsResult:
    """Every recorded unit, classified against the live host."""
    records = store.load_all()
    table = ProcTable()
    warnings: list[str] = []
    memory: dict[int, dict[int, int]] = {}  # gpu -> pid -> bytes
    wanted = sorted({g for r in records for g in r.gpus})
    if wanted:
        try:
            with backend_for(sim, backend) as be:
                for reading in be.read(wanted, full=False):
                    memory[reading.index] = {p.pid: p.used_memory or 0 for p in reading.processes or []}
        except Exception as exc:  # ps still lists the units when the GPUs cannot be read
            warnings.append(f"GPU memory unknown: {exc}")
    out: list[UnitStatus] = []
    for rec in records:
        procs = unit_processes(rec, table)
        state = classify(rec, table, procs)
        pids = {st.pid for st in procs}
        mem = sum(b for g in rec.gpus for pid, b in memory.get(g, {}).items() if pid in pids) if memory else None
        main = next((st for st in procs if st.pid == rec.pid and st.start_ticks == rec.start_ticks), None)
        uptime = time.time() - ticks_to_epoch(main.start_ticks) if main else None
        out.append(UnitStatus(rec, state, sorted(pids), mem, uptime))
    return PsResult(out, warnings)
