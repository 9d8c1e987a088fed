"""Unit state on disk: ``state_dir()/units/NAME.json``, one file per unit, written atomically.

The record is what lets any later gpuslate process (``ps``, ``down``, ``swap``)
find a unit's processes after the ``up`` that started it has exited: the main
process's identity (pid + start time), its process group and session, its
cgroup, and the processes seen in it once it was ready.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import PermissionDenied
from ..proc.procfs import ProcessId
from ..host.state import read_state_file, state_dir, write_state_file

SCHEMA = "gpuslate.unit.v1"

#: phases recorded by up/down; ``ps`` derives exited/orphaned from them and the live processes
STARTING, READY, FAILED, STOPPED = "starting", "ready", "failed", "stopped"


@dataclass
class UnitRecord:
    name: str
    spec: dict[str, Any]
    phase: str
    pid: int
    start_ticks: int
    pgid: int
    sid: int
    containment: str  # cgroup | scope | session
    cgroup: str | None  # cgroup v2 path (relative to the mount) when contained in one
    log: str
    gpus: list[int]
    port: int | None
    env: dict[str, str]  # what gpuslate added to the caller's environment
    launched_at: float  # epoch seconds
    ready_at: float | None = None
    time_to_ready_s: float | None = None
    stopped_at: float | None = None
    exit_code: int | None = None
    failure: str | None = None
    members: list[list[int]] = field(default_factory=list)  # [pid, start_ticks] seen while ready
    launched_by: dict[str, Any] = field(default_factory=dict)

    @property
    def ident(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)

    @property
    def member_ids(self) -> list[ProcessId]:
        return [ProcessId(p, t) for p, t in self.members]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> UnitRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def units_dir() -> Path:
    path = state_dir() / "units"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise PermissionDenied(f"cannot create {path}: {exc.strerror or exc}",
                               hint="set GPUSLATE_STATE_DIR to a writable directory") from None
    return path


def record_path(name: str) -> Path:
    return units_dir() / f"{name}.json"


def log_path(name: str) -> Path:
    logs = units_dir() / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    return logs / f"{name}.log"


def save(rec: UnitRecord) -> None:
    path = record_path(rec.name)
    try:
        # atomic (readers see the old record or the new one, never half), never through a symlink
        write_state_file(path, json.dumps(rec.to_json(), indent=2).encode())
    except OSError as exc:
        raise PermissionDenied(f"cannot write unit state {path}: {exc.strerror or exc}") from None


def load(name: str) -> UnitRecord | None:
    try:
        data = read_state_file(record_path(name))  # PermissionDenied for a symlink: never followed
        if data is None:
            return None
        doc = json.loads(data)
    except PermissionDenied:
        raise
    except (OSError, ValueError):
        return None  # unreadable or torn by a crash: treated as unknown, never guessed at
    return UnitRecord.from_json(doc) if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None


def load_all() -> list[UnitRecord]:
    out: list[UnitRecord] = []
    for p in sorted(units_dir().glob("*.json")):
        rec = load(p.stem)
        if rec is not None:
            out.append(rec)
    return out
