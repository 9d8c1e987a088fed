"""``up`` and ``down``: start a unit and return once it serves; stop it and verify its GPUs.

Both run under the host lock, like ``clear``: ``up`` holds it from the
pre-flight until the unit is ready (or has failed and been cleaned up), so a
second ``up`` on the same GPUs waits and then finds them taken, rather than
racing the first one's workers for memory.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._document import Fields, Malformed, checked, reading
from .._parse import gpus_phrase
from .._time import iso_time
from ..clearing.clear import ClearResult, clear
from ..errors import NotDoneError, UsageError
from ..host.audit import new_run_id
from ..host.session import HostContext
from ..host.snapshot import resolve_gpus
from ..options import ClearOptions, Containment, DownOptions, Selection, UpOptions
from ..outcome import Outcome, StatusEnum
from ..proc.procfs import boot_id, read_stat, user_name
from ..proc.terminate import Poller
from ..proc.tree import ProcTable
from . import logfile, reference, store
from .contain import collect_stale_cgroups
from .fence import fence_of
from .frontreport import FrontReport
from .interrupts import deferred_interrupts
from .launch import Launched, exit_status, launch
from .preflight import check_gpus, check_port
from .readiness import Probe, smoke
from .spec import UnitSpec
from .state import Phase, UnitState, unit_state
from .stop import Leftovers, StopReport, Verification, stop_unit
from .strays import Stray
from .unit import Unit, load_units, parked_allowance, unit_of_pids

UP_SCHEMA = "gpuslate.up.v1"
DOWN_SCHEMA = "gpuslate.down.v1"
LOG_TAIL = 20
Note = Callable[[str], None]


class UpStatus(StatusEnum):
    """How an ``up`` ended (the JSON ``status``)."""

    READY = "ready", Outcome.DONE
    EXITED = "exited", Outcome.FAILED  # the server exited before it was ready
    TIMEOUT = "timeout", Outcome.NOT_DONE  # not ready within the start timeout
    SMOKE_FAILED = "smoke_failed", Outcome.FAILED


class DownStatus(StatusEnum):
    """How a ``down`` ended (not in its JSON document, which has ``ok``: derived from it)."""

    STOPPED = "stopped", Outcome.DONE  # every process ended and the GPU memory released (or nothing to verify)
    TIMEOUT = "timeout", Outcome.NOT_DONE  # not stopped, or its memory not released, in time
    PERMISSION_DENIED = "permission_denied", Outcome.DENIED  # some process could not be signaled
    NOT_RULED_OUT = "not_ruled_out", Outcome.NOT_DONE  # stopped, but processes not in it hold GPU memory or its port


@dataclass(frozen=True, kw_only=True, slots=True)
class UpResult:
    status: UpStatus
    record: store.UnitRecord
    readiness: dict[str, Any]  # kind, target, detail
    smoke: dict[str, Any] | None
    timings: dict[str, float]  # lock_s, preflight_s, launch_s, time_to_ready_s, smoke_s, total_s
    log_tail: list[str]  # the last lines of the log when it failed
    teardown: StopReport | None  # how the failed unit was cleaned up
    cleared: ClearResult | None  # --clear, if it ran
    fence_note: str | None
    front: FrontReport | None = None  # the unit's front, when it has one (units/front.py)

    @property
    def ok(self) -> bool:
        return self.status == UpStatus.READY

    @property
    def time_to_ready(self) -> float | None:
        return self.timings.get("time_to_ready_s")

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "schema": UP_SCHEMA, "ok": self.ok, "status": self.status.value, "name": r.name,
            "pid": r.pid, "start_ticks": r.start_ticks, "pgid": r.pgid, "sid": r.sid, "instance": r.instance,
            "containment": r.containment, "cgroup": r.cgroup, "containment_note": self.fence_note,
            "command": r.spec["command"], "env": r.env, "gpus": r.gpus, "port": r.port, "log": r.log,
            "launched_at": iso_time(r.launched_at), "ready_at": iso_time(r.ready_at) if r.ready_at else None,
            "time_to_ready_s": r.time_to_ready_s, "exit_code": r.exit_code, "failure": r.failure,
            "readiness": self.readiness, "smoke": self.smoke,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "log_tail": self.log_tail, "teardown": self.teardown.to_json() if self.teardown else None,
            "cleared": self.cleared.to_json() if self.cleared is not None else None,
            "front": self.front.to_json() if self.front is not None else None,
        }

    @classmethod
    def from_json(cls, doc: object) -> UpResult:
        """A ``gpuslate.up.v1`` document as the UpResult it was (its record as far as the document
        shows it: the spec's command only, no members, the phase its status implies)."""
        f = Fields(checked(doc, UP_SCHEMA))
        with reading(UP_SCHEMA):
            status = f.choice("status", UpStatus)
            containment = f.text("containment")
            if containment not in store.CONTAINMENTS:
                raise Malformed(f"containment: expected one of {', '.join(store.CONTAINMENTS)}")
            rec = store.UnitRecord(
                name=f.text("name"), spec={"command": f.texts("command")},
                phase=Phase.READY if status == UpStatus.READY else Phase.FAILED, pid=f.pid("pid"),
                start_ticks=f.integer("start_ticks", 0), pgid=f.pid("pgid"), sid=f.pid("sid"),
                containment=Containment(containment), cgroup=f.opt_text("cgroup"), log=f.text("log"),
                gpus=f.gpus("gpus"), port=f.opt_integer("port", 1, 65535),
                env=f.record("env", _env), launched_at=f.time("launched_at"), ready_at=f.opt_time("ready_at"),
                time_to_ready_s=f.opt_seconds("time_to_ready_s"), exit_code=f.opt_integer("exit_code", -255, 255),
                failure=f.opt_text("failure"), instance=f.opt_text("instance") or "")
            return cls(status=status, record=rec, readiness=f.record("readiness", _readiness),
                       smoke=f.opt_record("smoke", _smoke), timings=f.timings("timings"),
                       log_tail=f.texts("log_tail"), teardown=f.opt_record("teardown", StopReport.from_json),
                       cleared=f.opt_record("cleared", ClearResult.from_json),
                       fence_note=f.opt_text("containment_note"),
                       front=f.opt_record("front", FrontReport.from_json, default=None))


@dataclass(frozen=True, kw_only=True, slots=True)
class DownResult:
    name: str
    previous_state: UnitState
    report: StopReport
    timings: dict[str, float]
    strays: list[Stray] = field(default_factory=list)  # GPU holders started while the unit ran, not found in it
    #: always None since issue 32 (down --clear signals nothing down does not: strays are never signaled); a
    #: document of an older gpuslate may carry the clear it ran on its strays
    cleared: ClearResult | None = None
    corrupt: str | None = None  # why the unit's record was unreadable
    set_aside: str | None = None  # where the corrupt record was moved once the unit was stopped
    front: FrontReport | None = None  # the unit's front, stopped with it
    #: what down left alone and says so: strays on GPUs the unit was not given (released all the same)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.report.ok and (self.cleared is None or self.cleared.ok)

    @property
    def status(self) -> DownStatus:
        if self.ok:
            return DownStatus.STOPPED
        if self.report.permission_denied:
            return DownStatus.PERMISSION_DENIED
        alive = any(r.alive for r in self.report.results + self.report.swept)
        if self.report.verification == Verification.NOT_RULED_OUT and not alive and self.cleared is None:
            return DownStatus.NOT_RULED_OUT
        return DownStatus.TIMEOUT

    def to_json(self) -> dict[str, Any]:
        return {"schema": DOWN_SCHEMA, "ok": self.ok, "name": self.name, "previous_state": self.previous_state.value,
                **self.report.to_json(), "timings": {k: round(v, 4) for k, v in self.timings.items()},
                "strays": [s.to_json() for s in self.strays],
                "cleared": self.cleared.to_json() if self.cleared is not None else None,
                "corrupt": self.corrupt, "record_set_aside": self.set_aside, "warnings": self.warnings,
                "front": self.front.to_json() if self.front is not None else None}

    @classmethod
    def from_json(cls, doc: object) -> DownResult:
        """A ``gpuslate.down.v1`` document as the DownResult it was."""
        f = Fields(checked(doc, DOWN_SCHEMA))
        with reading(DOWN_SCHEMA):
            return cls(name=f.text("name"), previous_state=f.choice("previous_state", UnitState),
                       report=StopReport.from_json(f.d), timings=f.timings("timings"),
                       strays=f.items("strays", Stray.from_json),
                       cleared=f.opt_record("cleared", ClearResult.from_json),
                       corrupt=f.opt_text("corrupt"), set_aside=f.opt_text("record_set_aside"),
                       warnings=f.texts("warnings", default=[]),
                       front=f.opt_record("front", FrontReport.from_json, default=None))


def _env(d: object) -> dict[str, str]:
    f = Fields(d)
    return {str(k): f.text(k) for k in f.d}


def _readiness(d: object) -> dict[str, Any]:
    """How readiness was checked (up's document): its kind, what it probed, what it last said."""
    f = Fields(d)
    return {"kind": f.text("kind"), "target": f.opt_text("target"), "detail": f.text("detail")}


def _smoke(d: object) -> dict[str, Any]:
    """The smoke completion's outcome (up's document)."""
    f = Fields(d)
    return {"ok": f.flag("ok"), "model": f.opt_text("model"), "status": f.opt_integer("status", 0, 999),
            "latency_s": f.opt_seconds("latency_s"), "error": f.opt_text("error")}



def check_startable(unit: Unit | None, name: str) -> None:
    """The guards every start passes (``up``, ``swap``'s NEW, a batch's ``up``), on the unit as it was
    loaded under the host lock (``None``: no record): a corrupt record may describe a live server, and
    a running unit is not started twice. :class:`~gpuslate.errors.UsageError` (exit 2) if either."""
    if unit is None:
        return
    if unit.corrupt:
        found = [st.pid for st in unit.members()]
        raise UsageError(unit.describe_problem() + (f"; processes of it still run: {found}" if found else
                         "; it may describe a live server"),
                         hint=f"'gpuslate down {name}' stops what is left of it and sets the record aside")
    if unit.running() and unit.record is not None and unit.record.park is not None:
        raise UsageError(f"unit {name} is parked (pid {unit.record.pid}, {unit.record.park.method}): 'gpuslate "
                         f"resume {name}' brings it back, 'gpuslate swap OLD {name} --park' switches to it",
                         hint=f"'gpuslate down {name}' stops it")
    if unit.running():
        raise UsageError(f"unit {name} is already running (pid {unit.record.pid}): "  # type: ignore[union-attr]
                         f"stop it first with 'gpuslate down {name}'")


def phase_start(host: HostContext, phase: str, started: float | None) -> float:
    """When the verb that runs ``phase`` began (its ``started``, else now); a phase function runs
    under the host lock its caller holds (it neither takes the lock nor reads the record again)."""
    if not host.lock_depth:
        raise RuntimeError(f"{phase} runs under the host lock its caller holds")
    return time.monotonic() if started is None else started


def start_checked(host: HostContext, spec: UnitSpec, opts: UpOptions, *, lock_wait: float = 0.0,
                  started: float | None = None, units: store.UnitStore | None = None) -> UpResult:
    """``up``'s start phase: ``spec`` (validated) passed :func:`check_startable` on the unit as its
    caller loaded it, under the host lock of ``host``, which the caller holds (``up``, ``swap``: the
    lock is not taken again, and the record not read again). ``lock_wait``: the caller's wait for
    the lock; ``started``: when the caller's verb began (``time.monotonic()``), for ``total_s``;
    ``units``: the records it is kept in (default: the host's units; a front's processes have their own)."""
    t0 = phase_start(host, "start_checked", started)
    note = host.note
    units = units or store.UnitStore.of(host)
    be = host.backend
    t_lock = time.monotonic()
    gpus = resolve_gpus(be, spec.gpus)
    limit = host.max_used(opts.max_used)
    if spec.port is not None:
        check_port(spec.ready_host, spec.port, for_unit=spec.name, left_by=lambda pid: _left_by(units, pid))
    cleared = None
    if opts.clear_first:
        cleared = clear(host, Selection(gpus=tuple(gpus)),
                        ClearOptions(grace=spec.grace, timeout=spec.stop_timeout, max_used=limit,
                                     confirm=opts.confirm))
        if not cleared.ok:
            raise NotDoneError(f"--clear could not free {gpus_phrase(gpus)} for unit {spec.name}: "
                               + "; ".join(d.summary() for d in cleared.diagnosis),
                               hint="see 'gpuslate clear --gpus ... --json' for the whole story")
    collect_stale_cgroups()  # under the host lock
    # parked units keep their residue on the GPUs (units/park.py): free beside it, as beside a daemon's
    check_gpus(be, gpus, limit, for_unit=spec.name,
               owners=lambda: unit_of_pids([u for u in load_units(units) if u.name != spec.name], ProcTable()),
               parked=lambda: parked_allowance(load_units(units), ProcTable(), but=spec.name))
    t_pre = time.monotonic()
    # from the fork until the record is on disk, an interrupt would leave a server no record
    # names: it is held back and acted on once the unit can be found (and stopped)
    with deferred_interrupts(lambda _s: note(f"interrupted: stopping {spec.name}, please wait")) as pending:
        launched = launch(spec, units, host.sim_root)
        rec = store.UnitRecord(
            name=spec.name, spec=spec.to_json(), phase=Phase.STARTING, pid=launched.ident.pid,
            start_ticks=launched.ident.start_ticks, pgid=launched.ident.pid, sid=launched.ident.pid,
            containment=launched.fence, cgroup=launched.cgroup, log=str(launched.log), gpus=gpus,
            port=spec.port, env=launched.env, launched_at=launched.spawned_at, launched_by=_me(),
            instance=launched.instance, boot=boot_id())
        units.save(rec)
    current = Unit(spec.name, units.record_path(spec.name), rec, None, spec, fence_of(rec, units.mark()))
    t_launch = time.monotonic()
    timings = {"lock_wait_s": lock_wait, "preflight_s": t_pre - t_lock, "launch_s": t_launch - t_pre}
    try:
        if pending:
            raise KeyboardInterrupt(f"{signal.Signals(pending[0]).name} while launching")
        status, probe = _await_ready(spec, launched, host)
        sm = None
        if status == UpStatus.READY:
            t_ready = time.monotonic()
            rec.time_to_ready_s = round(t_ready - launched.spawned, 4)
            rec.ready_at = time.time()
            timings["time_to_ready_s"] = t_ready - launched.spawned
            if spec.smoke:
                sm = smoke(spec, timeout=max(1.0, min(60.0, spec.start_timeout)))
                timings["smoke_s"] = sm["latency_s"]
                status = UpStatus.READY if sm["ok"] else UpStatus.SMOKE_FAILED
            if status == UpStatus.READY and reference.wanted(spec, {**os.environ, **spec.env}):
                # the answer a resume must give again (units/park.py), asked once it serves
                t_ref = time.monotonic()
                got = reference.take(spec, timeout=max(1.0, min(60.0, spec.start_timeout)))
                timings["reference_s"] = time.monotonic() - t_ref
                if isinstance(got, dict):
                    rec.reference = got
                else:
                    note(f"{spec.name}: {got}; its first park asks again")
    except BaseException as exc:  # Ctrl-C, SIGTERM (see cli/commands/up.py), a bug: leave nothing half-started
        _stop_interrupted(host, units, current, spec, limit, str(exc) or type(exc).__name__)
        raise
    teardown, tail = None, []
    if status == UpStatus.READY:
        rec.phase = Phase.READY
        found = current.members()
        rec.members = [[st.pid, st.start_ticks] for st in found]
        current.record_seen(units, found)  # the instance's own file: an earlier instance's is replaced
    else:
        rec.failure = _failure(status, spec, probe, sm, rec)
        rec.exit_code = exit_status(rec.pid)
        with deferred_interrupts(lambda _s: note(f"stopping {spec.name}, please wait")):
            teardown = stop_unit(host, current, grace=spec.grace, timeout=spec.stop_timeout, run_id=new_run_id(),
                                 action="up-failed", max_used=limit)
            rec.phase, rec.stopped_at = Phase.FAILED, time.time()
        logfile.relay_done(launched.relay)  # its last words are in the log once the relay has written them
        tail = logfile.tail(launched.log, LOG_TAIL)
    units.save(rec)
    timings["total_s"] = time.monotonic() - t0
    return UpResult(status=status, record=rec,
                    readiness={"kind": probe.kind, "target": probe.target, "detail": probe.detail}, smoke=sm,
                    timings=timings, log_tail=tail, teardown=teardown, cleared=cleared, fence_note=launched.fence_note)


def _left_by(units: store.UnitStore, pid: int) -> str | None:
    """The unit whose last run left ``pid`` behind, holding its port or GPUs (a stray of it)."""
    every = load_units(units)
    table = ProcTable()
    members = {u.name: [st.pid for st in u.members(table)] for u in every}
    for u in every:
        claimed = [p for n, pids in members.items() if n != u.name for p in pids]
        if any(s.pid == pid for s in u.strays([], table, members[u.name], claimed)):
            return u.name
    return None


def _await_ready(spec: UnitSpec, launched: Launched, host: HostContext) -> tuple[UpStatus, Probe]:
    """Until the probe says ready, the process exits or the start timeout passes; the progress
    sink is told the server's last log line (else the probe's latest answer) meanwhile."""
    probe = Probe(spec, launched.log)
    deadline = launched.spawned + spec.start_timeout

    def news() -> str:
        last = logfile.tail(launched.log, 1)
        return last[0].strip() if last and last[0].strip() else probe.detail

    poll = Poller(first=0.002, cap=0.02)
    with host.ticker(f"{spec.name}: waiting until ready ({probe.kind})", spec.start_timeout,
                     started=launched.spawned) as tick:
        while True:
            if launched.proc.poll() is not None:
                return UpStatus.EXITED, probe
            if probe.check(timeout=max(0.05, min(5.0, deadline - time.monotonic()))):
                return UpStatus.READY, probe
            if time.monotonic() >= deadline:
                return UpStatus.TIMEOUT, probe
            tick(news)
            poll.sleep(deadline)


def _stop_interrupted(host: HostContext, units: store.UnitStore, unit: Unit, spec: UnitSpec, limit: int,
                      why: str) -> None:
    """Stop a unit whose start was interrupted; further Ctrl-C or SIGTERM cannot cut this short."""
    rec = unit.record
    assert rec is not None
    note = host.note
    note(f"stopping {spec.name}, please wait")
    with deferred_interrupts(lambda _s: note(f"stopping {spec.name}, please wait")):
        stop_unit(host, unit, grace=spec.grace, timeout=spec.stop_timeout, run_id=new_run_id(),
                  action="up-interrupted", max_used=limit)
        rec.phase, rec.stopped_at = Phase.FAILED, time.time()
        rec.failure = f"interrupted while starting ({why})"
        rec.exit_code = exit_status(rec.pid)
        units.save(rec)


def _failure(status: UpStatus, spec: UnitSpec, probe: Probe, sm: dict[str, Any] | None,
             rec: store.UnitRecord) -> str:
    if status == UpStatus.EXITED:
        code = exit_status(rec.pid)
        return f"the server exited before it was ready (exit code {code})"
    if status == UpStatus.TIMEOUT:
        return f"not ready after {spec.start_timeout:g} s ({probe.kind}: {probe.detail})"
    return f"the smoke completion failed: {sm['error'] if sm else 'unknown'}"


def _me() -> dict[str, Any]:
    st = read_stat(os.getpid())
    return {"pid": os.getpid(), "start_ticks": st.start_ticks if st else None, "user": user_name(os.getuid())}


def stop_loaded(host: HostContext, u: Unit, opts: DownOptions, *, lock_wait: float = 0.0,
                started: float | None = None, units: store.UnitStore | None = None) -> DownResult:
    """``down``'s stop phase: unit ``u`` as its caller loaded it under the host lock of ``host``, which
    the caller holds (``down``, ``swap``'s OLD: the record is not read again); ``opts`` validated.
    ``lock_wait``, ``started`` and ``units`` as for :func:`start_checked`."""
    t0 = phase_start(host, "stop_loaded", started)
    name = u.name
    units = units or store.UnitStore.of(host)
    note = host.note
    be = host.backend
    spec = u.spec or UnitSpec(name)  # corrupt: the defaults
    grace_s = spec.grace if opts.grace is None else opts.grace
    limit = host.max_used(opts.max_used)
    collect_stale_cgroups()  # under the host lock
    table = ProcTable()
    found = u.members(table)
    previous = unit_state(u.facts(table, found))
    u.record_seen(units, found)  # proven now: proven still if this stop is cut short and a rename follows
    if u.corrupt:
        note(u.describe_problem() + "; stopping what is found of it")
    strays: list[Stray] = []
    warnings: list[str] = []

    def leftovers(deadline: float) -> Leftovers:
        table = ProcTable()
        readings = be.read(None, full=False)  # every GPU: a stray may hold one the unit was not given
        mine = [st.pid for st in u.members(table)]
        if not u.strays(readings, table, mine):
            return Leftovers(True)
        claimed = unit_of_pids([o for o in load_units(units) if o.name != name], table)
        strays[:] = u.strays(readings, table, mine, claimed)
        for s in strays:  # never signaled, with or without --clear: nothing proves them the unit's
            if not s.blocking:
                warnings.append(f"{s.describe()}: it started while unit {name} ran and holds another GPU, but "
                                f"nothing proves it the unit's, so it was left alone; '{s.remedy()}' ends it")
                note(f"unit {name} may have left a process on another GPU: {warnings[-1]}")
        blocking = [s for s in strays if s.blocking]
        if not blocking:
            return Leftovers(True)
        gpus = tuple(sorted({g for s in blocking for g in s.gpus}))
        who = "; ".join(f"{s.describe()} ('{s.remedy()}' ends it)" for s in blocking)
        note(f"unit {name} may have left processes it is not found in: {who}; they started while it ran and "
             "hold its GPUs or port, but nothing proves them its own, so gpuslate does not signal them")
        return Leftovers(False, gpus, f"not ruled out, started while the unit ran, not proven its own: {who}")

    stop_timeout = spec.stop_timeout if opts.timeout is None else opts.timeout
    report = stop_unit(host, u, grace=grace_s, timeout=stop_timeout, run_id=new_run_id(), action="down",
                       max_used=limit, before_verify=leftovers)
    aside = None
    rec = u.record
    if rec is None:
        if report.ok:
            aside = str(units.set_aside(u.path))
    else:
        if rec.phase != Phase.FAILED:
            rec.phase = Phase.STOPPED
        rec.park = None  # parked or not, it is stopped: a next up starts it cold
        if previous not in (UnitState.FAILED, UnitState.STOPPED, UnitState.EXITED) or rec.stopped_at is None:
            rec.stopped_at = time.time()
        if rec.exit_code is None:
            rec.exit_code = exit_status(rec.pid)
        units.save(rec)
    return DownResult(name=name, previous_state=previous, report=report,
                      timings={"lock_wait_s": lock_wait, **report.timings, "total_s": time.monotonic() - t0},
                      strays=strays, corrupt=u.problem.reason if u.problem else None, set_aside=aside,
                      warnings=warnings)
