"""Another host's JSON documents back into the values the local renderers take.

A remote run's result is its ``--json`` document; to show it exactly as a
local run would, it becomes a :class:`Snapshot`, :class:`ClearResult` or
:class:`GpuDiagnosis` again. Only what the documents carry is filled in:
records are built field by field *by name* (``_fields``), enum-typed fields
are converted from their values, and anything a document lacks is the field's
default or None -- so fields added to the records later do not break this.
"""

from __future__ import annotations

import typing
from enum import Enum
from functools import lru_cache
from typing import Any, TypeVar

from .._time import parse_iso_time
from ..gpu.types import GpuProcess, GpuReading, MemoryInfo
from ..host.snapshot import GpuState, HolderProcess, Snapshot
from ..proc.procfs import ProcessId
from ..proc.terminate import SignalRecord, Victim, VictimResult
from ..slate.clear import ClearResult, Respawn
from ..slate.plan import Plan, Selection, Spared, Target
from ..slate.wait import GpuDiagnosis, Problem

R = TypeVar("R")


@lru_cache(maxsize=None)
def _enum_fields(cls: type) -> dict[str, type[Enum]]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation this Python cannot evaluate: no conversions
        return {}
    return {k: t for k, t in hints.items() if isinstance(t, type) and issubclass(t, Enum)}


def record(cls: type[R], values: dict[str, Any]) -> R:
    """A NamedTuple ``cls`` from ``values`` by field name (see the module docstring)."""
    defaults = getattr(cls, "_field_defaults", {})
    enums = _enum_fields(cls)
    out: dict[str, Any] = {}
    for f in cls._fields:  # type: ignore[attr-defined]
        v = values.get(f, defaults.get(f))
        if f in enums and v is not None:
            try:
                v = enums[f](v)
            except ValueError:
                pass  # a value this gpuslate does not know: shown as it came
        out[f] = v
    return cls(**out)


def holder(d: dict[str, Any]) -> HolderProcess:
    return record(HolderProcess, {**d, "root_pid": d.get("root_pid", d["pid"]),
                                  "visible": bool(d.get("visible", True))})


def gpu_state(d: dict[str, Any]) -> GpuState:
    m = d.get("memory")
    procs = [holder(p) for p in d.get("processes") or []]
    memory = MemoryInfo(m["total"], m["used"], m.get("reserved", 0), m.get("free", 0)) if m else None
    reading = record(GpuReading, {**d, "memory": memory, "minor": None,
                                  "processes": [GpuProcess(p.pid, p.kind, p.used_memory)
                                                for p in procs if p.kind != "handle"]})
    return GpuState(reading, procs)


def snapshot(d: dict[str, Any]) -> Snapshot:
    """A ``gpuslate.status.v1`` document (or the nvidia-smi fallback's) as a Snapshot."""
    return record(Snapshot, {
        **d, "host": d.get("host") or "?", "backend": d.get("backend") or "?",
        "taken_at": parse_iso_time(d.get("taken_at")), "gpus": [gpu_state(g) for g in d.get("gpus") or []],
        "host_processes": [holder(p) for p in d.get("host_processes") or []],
        "warnings": [str(w) for w in d.get("warnings") or []]})


def diagnosis(d: dict[str, Any]) -> GpuDiagnosis:
    return record(GpuDiagnosis, {**d, "max_used": d.get("max_used") or 0,
                                 "problems": [record(Problem, p) for p in d.get("problems") or []]})


def _reading(m: dict[str, Any]) -> GpuReading:
    """A ``before``/``after`` entry: only what reports show (used, pids, error)."""
    used = m.get("used")
    return record(GpuReading, {"index": m["gpu"], "error": m.get("error"),
                               "memory": MemoryInfo(0, used, 0, 0) if used is not None else None,
                               "processes": [GpuProcess(pid, "compute", None) for pid in m.get("processes") or []]})


def clear_result(d: dict[str, Any]) -> ClearResult:
    """A ``gpuslate.clear.v1`` document as a ClearResult (the plan's full snapshot is left empty)."""
    targets, results = [], []
    for t in d.get("targets") or []:
        ident = ProcessId(t["pid"], t.get("start_ticks") or 0)
        targets.append(record(Target, {**t, "ident": ident, "command": t.get("command") or "",
                                       "name": t.get("name") or "", "gpus": t.get("gpus") or [],
                                       "waits_for": tuple(t.get("waits_for") or ())}))
        r = VictimResult(Victim(ident, {}))
        r.signals = [SignalRecord(s["signal"], s.get("at_s") or 0.0, s.get("outcome") or "")
                     for s in t.get("signals") or []]
        r.exited_at, r.ended_by = t.get("exited_at_s"), t.get("ended_by")
        r.permission_denied = bool(t.get("permission_denied"))
        r.refused = t.get("refused")
        results.append(r)
    started = parse_iso_time(d.get("started_at"))
    before = Snapshot(d.get("host") or "?", d.get("backend") or "?", None, started, [], [], [])
    # what was selected is not in the document, only what it meant for verification
    selection = Selection(match="" if d.get("verify") == "released" else None)
    plan = record(Plan, {"gpus": d.get("gpus") or [], "targets": targets, "selection": selection,
                         "spared": [record(Spared, s) for s in d.get("spared") or []], "before": before,
                         "known": frozenset()})
    return record(ClearResult, {
        **d, "host": d.get("host") or "?", "backend": d.get("backend") or "?", "plan": plan, "results": results,
        "before": [_reading(m) for m in d.get("before") or []], "after": [_reading(m) for m in d.get("after") or []],
        "diagnosis": [diagnosis(g) for g in d.get("diagnosis") or []],
        "respawned": [record(Respawn, r) for r in d.get("respawned") or []],
        "timings": dict(d.get("timings") or {}), "max_used": d.get("max_used") or 0, "started_at": started})
