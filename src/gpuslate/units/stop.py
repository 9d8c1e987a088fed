"""Stop every process of a unit and verify its GPUs are released: the core of ``down``,
of a failed ``up``, and of ``swap``.

SIGTERM to every process of the unit at once (cgroup, session, process
group, descendants, recorded members), grace, SIGKILL; then ``cgroup.kill``
for anything that forked meanwhile; then sweep again for processes of the
unit that appeared during the stop; then poll until the unit's GPUs are free,
with the same test and the same diagnosis as ``clear``.

The GPUs verified are the unit's (as recorded) *and* those its processes held
when they were found, read before they are signaled: a unit whose record lost
its GPU list (a torn record) is verified on what its processes really held.
Verifying no GPU at all is never reported as memory released: the report
says what could not be verified, and why. Neither is a stop after which a
process the unit's fence does not find, but that cannot be ruled out (a
stray, :mod:`.strays`), holds GPU memory or the unit's port: its GPUs are
verified too, and the report's :class:`Verification` names it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from .._document import MAX_PID, Fields, Malformed
from ..clearing.wait import GpuDiagnosis, LeakStop, diagnose, poll_until_free
from ..gpu.types import GpuBackend, GpuReading, memory_from_json, memory_json
from ..host.session import HostContext
from ..host.snapshot import take_snapshot
from ..proc.daemons import DaemonWatch
from ..proc.procfs import ProcStat, read_info
from ..proc.signals import DELIVERED
from ..proc.terminate import Victim, VictimResult, terminate
from ..proc.tree import ProcTable
from .unit import Unit

_SWEEPS = 3


class Verification(str, Enum):
    """What the stop proved about what the unit held (``verification`` in the JSON)."""

    RELEASED = "released"  # every GPU verified free, and nothing found holding the unit's port
    NOT_RELEASED = "not_released"  # a verified GPU still held memory at the deadline
    NO_GPU = "no_gpu"  # nothing to verify: the record names no GPU and the processes found held none
    UNREAD = "unread"  # what the processes held could not be read (and the record names no GPU)
    NOT_RULED_OUT = "not_ruled_out"  # a process not found in the unit, not ruled out, holds GPU memory or its port

    def __str__(self) -> str:
        return self.value


class Leftovers(NamedTuple):
    """What ``before_verify`` found once the unit's processes were gone."""

    can_free: bool  # False: what holds the GPUs will not let go (poll no longer, diagnose now)
    gpus: tuple[int, ...] = ()  # more GPUs to verify: those the processes not ruled out hold
    not_ruled_out: str | None = None  # who they are, when they are still there (for ``unverified``)


@dataclass(frozen=True, kw_only=True, slots=True)
class StopReport:
    """How a unit's processes were stopped and its GPUs verified; by keywords only (``results`` and
    ``swept`` are both victims' results)."""

    results: list[VictimResult]  # first round
    swept: list[VictimResult]  # later rounds: processes of the unit that appeared during the stop
    cgroup_killed: bool
    released: bool | None  # the GPUs verified free; None: no GPU to verify (see ``unverified``)
    readings: list[GpuReading]
    diagnosis: list[GpuDiagnosis]
    timings: dict[str, float]  # stop_s (signals -> all gone), verify_s (-> memory released), total_s
    # the unit's GPUs and those its processes held before the signals
    verified_gpus: list[int] = field(default_factory=list)
    # pid -> GPUs it held when it was found (read before its signal)
    held: dict[int, list[int]] = field(default_factory=dict)
    unverified: str | None = None  # why nothing was verified, what could not be read, who was not ruled out
    held_unknown: bool = False  # what the processes held before the signals could not be read
    not_ruled_out: bool = False  # a process not found in the unit, not ruled out, holds GPU memory or its port

    @property
    def verification(self) -> Verification:
        if self.not_ruled_out:
            return Verification.NOT_RULED_OUT
        if self.released is not None:
            return Verification.RELEASED if self.released else Verification.NOT_RELEASED
        return Verification.UNREAD if self.held_unknown else Verification.NO_GPU

    @property
    def ok(self) -> bool:
        """Everything stopped and the memory verified released; or, with no GPU to verify,
        every process found read as holding none (an unread holding is never taken for none);
        never while a process that cannot be ruled out holds GPU memory or the unit's port."""
        if any(r.alive or r.permission_denied for r in self.results + self.swept):
            return False
        return self.verification in (Verification.RELEASED, Verification.NO_GPU)

    @property
    def permission_denied(self) -> bool:
        return any(r.permission_denied for r in self.results + self.swept)

    def to_json(self) -> dict[str, Any]:
        return {
            "processes": [r.to_json() for r in self.results], "swept": [r.to_json() for r in self.swept],
            "cgroup_killed": self.cgroup_killed, "memory_released": self.released,
            "verification": self.verification.value,
            "verified_gpus": self.verified_gpus, "held_before": {str(p): g for p, g in sorted(self.held.items())},
            "unverified": self.unverified,
            "memory": [memory_json(r) for r in self.readings],
            "diagnosis": [d.to_json() for d in self.diagnosis],
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }

    @classmethod
    def from_json(cls, d: object) -> StopReport:
        """The report inside a ``down`` (or a failed ``up``'s ``teardown``) document; every field checked."""
        f = Fields(d)
        verification = f.choice("verification", Verification)
        released = f.raw("memory_released")
        if released is not None and not isinstance(released, bool):
            raise Malformed(f"memory_released: expected true, false or null, got {str(released)[:30]!r}")
        return cls(results=f.items("processes", VictimResult.from_json),
                   swept=f.items("swept", VictimResult.from_json), cgroup_killed=f.flag("cgroup_killed"),
                   released=released, readings=f.items("memory", memory_from_json),
                   diagnosis=f.items("diagnosis", GpuDiagnosis.from_json), timings=f.timings("timings"),
                   verified_gpus=f.gpus("verified_gpus"), held=f.record("held_before", _held),
                   unverified=f.opt_text("unverified"), held_unknown=verification == Verification.UNREAD,
                   not_ruled_out=verification == Verification.NOT_RULED_OUT)


def _held(d: object) -> dict[int, list[int]]:
    """``held_before``: pid (a JSON key) -> the GPUs it held."""
    f = Fields(d)
    out: dict[int, list[int]] = {}
    for key in f.d:
        pid = int(key) if key.isascii() and key.isdigit() and len(key) <= 10 else 0
        if not 1 <= pid <= MAX_PID:
            raise Malformed(f"{key[:20]!r}: expected a process id")
        out[pid] = f.gpus(key)
    return out


def _victim(st: ProcStat, unit: Unit, held: list[int] | None) -> Victim:
    info = read_info(st.pid)
    return Victim(ident=st.ident, info={
        "pid": st.pid, "start_ticks": st.start_ticks, "name": st.name, "unit": unit.name,
        "command": info.command if info else None, "user": info.user if info else None,
        "pgid": st.pgid, "sid": st.sid, "gpus": sorted(set(unit.gpus) | set(held or [])),
    })


def held_gpus(backend: GpuBackend, pids: set[int]) -> tuple[dict[int, list[int]], str | None]:
    """pid -> the GPUs on which it holds memory or a context, for ``pids``; with why it is
    unknown (a reading that failed is never taken for "holds nothing")."""
    try:
        readings = backend.read(None, full=False)
    except Exception as exc:  # noqa: BLE001 - any backend failure: what they hold is unknown, and said so
        return {}, f"could not read what the unit's processes held: {exc}"
    out: dict[int, list[int]] = {}
    errors = [f"GPU {r.index}: {r.error}" for r in readings if r.processes is None]
    for r in readings:
        for p in r.processes or []:
            if p.pid in pids:
                out.setdefault(p.pid, []).append(r.index)
    return out, f"could not read what the unit's processes held: {'; '.join(errors)}" if errors else None


def stop_unit(host: HostContext, unit: Unit, *, grace: float, timeout: float, run_id: str, action: str = "down",
              max_used: int | None = None, before_verify: Callable[[float], Leftovers] | None = None,
              ) -> StopReport:
    """Stop all of ``unit``'s processes on ``host`` and wait (up to ``timeout`` in all) for its GPUs
    to be free; every signal in ``host``'s audit log, progress lines to its event sink.

    ``before_verify(deadline)`` runs once the unit's processes are gone, before the GPUs are
    polled (``down`` looks for strays there, and names them): the GPUs its
    :class:`Leftovers` names are verified too; ``can_free`` False means they cannot come free,
    so the diagnosis is taken at once instead of polling until the deadline."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    backend = host.backend
    limit = host.max_used(max_used)
    log = host.audit_log  # opened before anything is signaled: an unsafe state folder refuses first
    on_event = host.note
    done: set[tuple[int, int]] = set()
    held: dict[int, list[int]] = {}
    unread: list[str] = []

    def round_(grace_s: float) -> list[VictimResult]:
        procs = [st for st in unit.members(ProcTable()) if (st.pid, st.start_ticks) not in done]
        if not procs:
            return []
        found, problem = held_gpus(backend, {st.pid for st in procs})  # before they are signaled
        held.update(found)
        if problem:
            unread.append(problem)
        res = terminate([_victim(st, unit, found.get(st.pid)) for st in procs],
                        grace=min(grace_s, max(0.0, deadline - time.monotonic())),
                        kill_wait=max(0.0, deadline - time.monotonic()), action=action, run_id=run_id,
                        audit=log, on_event=on_event, clock_start=t0, more=bool(done))
        done.update((r.victim.ident.pid, r.victim.ident.start_ticks) for r in res)
        return res

    results = round_(grace)
    killed = False
    if unit.fence.cgroup and unit.members(ProcTable()):
        # whatever forked between our SIGTERM and now: the kernel ends it all at once
        entry = log.before_signal(run_id=run_id, action=action, signal="SIGKILL",
                                  target={"cgroup": unit.fence.cgroup, "unit": unit.name}, reason="cgroup.kill")
        killed = unit.fence.kill()
        log.outcome(entry, DELIVERED if killed else "error", None if killed else "cgroup.kill not available")
    swept: list[VictimResult] = []
    for _ in range(_SWEEPS):
        more = round_(min(grace, 2.0))  # latecomers get a short grace: the unit is going away
        if not more:
            break
        swept += more
    t_exit = time.monotonic()
    left = before_verify(deadline) if before_verify is not None else Leftovers(True)
    gpus = sorted(set(unit.gpus).union(*held.values(), left.gpus))
    released: bool | None = None
    readings: list[GpuReading] = []
    diagnosis: list[GpuDiagnosis] = []
    unverified = "; ".join([*unread, *([left.not_ruled_out] if left.not_ruled_out else [])]) or None
    if gpus:
        if left.can_free:  # a GPU daemon of the unit's own is no spared baseline: it must be gone
            mine = DaemonWatch(exclude={r.victim.ident.pid for r in results + swept})
            with host.ticker(f"stopping {unit.name}: waiting for its GPU memory to be released",
                             max(0.0, deadline - time.monotonic())) as tick:
                released, readings = poll_until_free(backend, gpus, limit, deadline, give_up=LeakStop(limit),
                                                     tick=tick, daemons=mine)
        else:
            released, readings = False, backend.read(gpus, full=False)
        if not released:
            everyone = {r.victim.ident.pid: r for r in results + swept}
            diagnosis = diagnose(take_snapshot(backend, gpus), limit, victims=everyone)
    elif unverified is None:
        found = len(results) + len(swept)
        unverified = ("no GPU is known for the unit: its record names none"
                      + (f" and the {found} process{'es' if found != 1 else ''} found held none" if found else
                         " and no process of it was found"))
    t_free = time.monotonic()
    unit.fence.release()
    timings = {"stop_s": t_exit - t0, "verify_s": t_free - t_exit, "total_s": time.monotonic() - t0}
    return StopReport(results=results, swept=swept, cgroup_killed=killed, released=released, readings=readings,
                      diagnosis=diagnosis, timings=timings, verified_gpus=gpus, held=held, unverified=unverified,
                      held_unknown=bool(unread), not_ruled_out=left.not_ruled_out is not None)
