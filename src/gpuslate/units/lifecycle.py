"""``up`` and ``down``: start a unit and return once it serves; stop it and verify its GPUs.

Both run under the host lock, like ``clear``: ``up`` holds it from the
pre-flight until the unit is ready (or has failed and been cleaned up), so a
second ``up`` on the same GPUs waits and then finds them taken, rather than
racing the first one's workers for memory.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple

from ..host.audit import new_run_id
from ..errors import NotDoneError, UsageError
from ..gpu import GpuBackend, open_backend
from ..host.lock import HostLock, default_lock_dir
from ..proc.procfs import read_stat
from ..proc.terminate import Poller
from ..proc.tree import ProcTable
from .._time import iso_time
from ..host.snapshot import resolve_gpus
from ..slate.wait import default_max_used
from . import logfile, store
from .contain import collect_stale_cgroups, unit_processes
from .launch import Launched, exit_status, launch
from .preflight import check_gpus, check_port
from .readiness import Probe, smoke
from .spec import UnitSpec
from .stop import StopReport, stop_unit

UP_SCHEMA = "gpuslate.up.v1"
DOWN_SCHEMA = "gpuslate.down.v1"
LOG_TAIL = 20
Note = Callable[[str], None]


@contextmanager
def host_lock(backend: GpuBackend, purpose: str, use: bool, on_event: Note | None) -> Iterator[float]:
    """Hold the host lock (when ``use``); yields the seconds spent waiting for it."""
    if not use:
        yield 0.0
        return
    root = str(backend.host.root) if backend.name == "sim" else None  # type: ignore[attr-defined]
    lock = HostLock(default_lock_dir(root) / "host.lock", purpose=purpose)
    t0 = time.monotonic()
    lock.acquire(on_wait=lambda h: (on_event or (lambda _m: None))(
        f"waiting for the host lock: {h.get('purpose') or 'another gpuslate run'} "
        f"(pid {h.get('pid')}, user {h.get('user')}, since {h.get('since')})"))
    try:
        yield time.monotonic() - t0
    finally:
        lock.release()


@contextmanager
def backend_for(sim: str | None, backend: GpuBackend | None) -> Iterator[GpuBackend]:
    be = backend if backend is not None else open_backend(sim)
    try:
        yield be
    finally:
        if backend is None:
            be.close()


class UpResult(NamedTuple):
    status: str  # ready | exited | timeout | smoke_failed
    record: store.UnitRecord
    readiness: dict[str, Any]  # kind, target, detail
    smoke: dict[str, Any] | None
    timings: dict[str, float]  # lock_s, preflight_s, launch_s, time_to_ready_s, smoke_s, total_s
    log_tail: list[str]  # the last lines of the log when it failed
    teardown: StopReport | None  # how the failed unit was cleaned up
    cleared: Any  # the ClearResult of --clear, if it ran
    fence_note: str | None

    @property
    def ok(self) -> bool:
        return self.status == "ready"

    @property
    def time_to_ready(self) -> float | None:
        return self.timings.get("time_to_ready_s")

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "schema": UP_SCHEMA, "ok": self.ok, "status": self.status, "name": r.name,
            "pid": r.pid, "start_ticks": r.start_ticks, "pgid": r.pgid, "sid": r.sid,
            "containment": r.containment, "cgroup": r.cgroup, "containment_note": self.fence_note,
            "command": r.spec["command"], "env": r.env, "gpus": r.gpus, "port": r.port, "log": r.log,
            "launched_at": iso_time(r.launched_at), "ready_at": iso_time(r.ready_at) if r.ready_at else None,
            "time_to_ready_s": r.time_to_ready_s, "exit_code": r.exit_code, "failure": r.failure,
            "readiness": self.readiness, "smoke": self.smoke,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "log_tail": self.log_tail, "teardown": self.teardown.to_json() if self.teardown else None,
            "cleared": self.cleared.to_json() if self.cleared is not None else None,
        }


class DownResult(NamedTuple):
    name: str
    previous_state: str
    report: StopReport
    timings: dict[str, float]

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_json(self) -> dict[str, Any]:
        return {"schema": DOWN_SCHEMA, "ok": self.ok, "name": self.name, "previous_state": self.previous_state,
                **self.report.to_json(), "timings": {k: round(v, 4) for k, v in self.timings.items()}}


def is_running(rec: store.UnitRecord | None) -> bool:
    return rec is not None and bool(unit_processes(rec, ProcTable()))


def up(spec: UnitSpec, *, clear_first: bool = False, sim: str | None = None, backend: GpuBackend | None = None,
       lock: bool = True, max_used: int | None = None, on_event: Note | None = None) -> UpResult:
    """Start ``spec`` as a managed unit and return once it is ready, or failed and was cleaned up."""
    spec.validate()
    t0 = time.monotonic()
    with backend_for(sim, backend) as be, host_lock(be, f"up {spec.name}", lock, on_event) as waited:
        t_lock = time.monotonic()
        prev = store.load(spec.name)
        if is_running(prev):
            raise UsageError(f"unit {spec.name} is already running (pid {prev.pid}): "  # type: ignore[union-attr]
                             f"stop it first with 'gpuslate down {spec.name}'")
        gpus = resolve_gpus(be, spec.gpus)
        limit = default_max_used(be) if max_used is None else max_used
        if spec.port is not None:
            check_port(spec.ready_host, spec.port, for_unit=spec.name)
        cleared = None
        if clear_first:
            from ..slate.clear import clear

            cleared = clear(gpus, grace=spec.grace, timeout=spec.stop_timeout, max_used=limit, backend=be,
                            lock=False, on_event=on_event)
            if not cleared.ok:
                raise NotDoneError(f"--clear could not free GPUs {','.join(map(str, gpus))} for unit {spec.name}: "
                                   + "; ".join(d.summary() for d in cleared.diagnosis),
                                   hint="see 'gpuslate clear --gpus ... --json' for the whole story")
        collect_stale_cgroups()  # under the host lock
        check_gpus(be, gpus, limit, for_unit=spec.name, records=store.load_all())
        t_pre = time.monotonic()
        launched = launch(spec)
        rec = store.UnitRecord(
            name=spec.name, spec=spec.to_json(), phase=store.STARTING, pid=launched.ident.pid,
            start_ticks=launched.ident.start_ticks, pgid=launched.ident.pid, sid=launched.ident.pid,
            containment=launched.fence, cgroup=launched.cgroup, log=str(launched.log), gpus=gpus,
            port=spec.port, env=launched.env, launched_at=launched.spawned_at, launched_by=_me())
        store.save(rec)
        t_launch = time.monotonic()
        timings = {"lock_wait_s": waited, "preflight_s": t_pre - t_lock, "launch_s": t_launch - t_pre}
        status, probe = _await_ready(spec, launched, rec, be, limit, on_event)
        sm = None
        if status == "ready":
            t_ready = time.monotonic()
            rec.time_to_ready_s = round(t_ready - launched.spawned, 4)
            rec.ready_at = time.time()
            timings["time_to_ready_s"] = t_ready - launched.spawned
            if spec.smoke:
                sm = smoke(spec, timeout=max(1.0, min(60.0, spec.start_timeout)))
                timings["smoke_s"] = sm["latency_s"]
                status = "ready" if sm["ok"] else "smoke_failed"
        teardown, tail = None, []
        if status == "ready":
            rec.phase = store.READY
            rec.members = [[st.pid, st.start_ticks] for st in unit_processes(rec, ProcTable())]
        else:
            rec.failure = _failure(status, spec, probe, sm, rec)
            rec.exit_code = exit_status(rec.pid)
            tail = logfile.tail(launched.log, LOG_TAIL)
            teardown = stop_unit(rec, be, grace=spec.grace, timeout=spec.stop_timeout, run_id=new_run_id(),
                                 action="up-failed", max_used=limit, on_event=on_event)
            rec.phase, rec.stopped_at = store.FAILED, time.time()
        store.save(rec)
        timings["total_s"] = time.monotonic() - t0
        return UpResult(status, rec, {"kind": probe.kind, "target": probe.target, "detail": probe.detail}, sm,
                        timings, tail, teardown, cleared, launched.fence_note)


def _await_ready(spec: UnitSpec, launched: Launched, rec: store.UnitRecord, be: GpuBackend, limit: int,
                 on_event: Note | None) -> tuple[str, Probe]:
    probe = Probe(spec, launched.log)
    deadline = launched.spawned + spec.start_timeout
    poll = Poller(first=0.002, cap=0.02)
    try:
        while True:
            if launched.proc.poll() is not None:
                return "exited", probe
            if probe.check(timeout=max(0.05, min(5.0, deadline - time.monotonic()))):
                return "ready", probe
            if time.monotonic() >= deadline:
                return "timeout", probe
            poll.sleep(deadline)
    except BaseException:  # Ctrl-C while starting: leave nothing half-started behind
        stop_unit(rec, be, grace=spec.grace, timeout=spec.stop_timeout, run_id=new_run_id(),
                  action="up-interrupted", max_used=limit, on_event=on_event)
        rec.phase, rec.failure, rec.stopped_at = store.FAILED, "interrupted while starting", time.time()
        store.save(rec)
        raise


def _failure(status: str, spec: UnitSpec, probe: Probe, sm: dict[str, Any] | None, rec: store.UnitRecord) -> str:
    if status == "exited":
        code = exit_status(rec.pid)
        return f"the server exited before it was ready (exit code {code})"
    if status == "timeout":
        return f"not ready after {spec.start_timeout:g} s ({probe.kind}: {probe.detail})"
    return f"the smoke completion failed: {sm['error'] if sm else 'unknown'}"


def _me() -> dict[str, Any]:
    import os

    from ..proc.procfs import user_name

    st = read_stat(os.getpid())
    return {"pid": os.getpid(), "start_ticks": st.start_ticks if st else None, "user": user_name(os.getuid())}


def down(name: str, *, sim: str | None = None, backend: GpuBackend | None = None, lock: bool = True,
         grace: float | None = None, timeout: float | None = None, max_used: int | None = None,
         on_event: Note | None = None) -> DownResult:
    """Stop every process of unit ``name`` and verify its GPUs are released."""
    from .listing import classify

    rec = store.load(name)
    if rec is None:
        raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
    spec = UnitSpec.from_json(rec.spec)
    for label, v in (("grace", grace), ("timeout", timeout)):
        if v is not None and not v >= 0:
            raise UsageError(f"invalid --{label} {v}: must be at least 0")
    t0 = time.monotonic()
    with backend_for(sim, backend) as be, host_lock(be, f"down {name}", lock, on_event) as waited:
        rec = store.load(name) or rec  # it may have changed while we waited
        collect_stale_cgroups()  # under the host lock
        previous = classify(rec, ProcTable())
        report = stop_unit(rec, be, grace=spec.grace if grace is None else grace,
                           timeout=spec.stop_timeout if timeout is None else timeout, run_id=new_run_id(),
                           action="down", max_used=max_used, on_event=on_event)
        if rec.phase != store.FAILED:
            rec.phase = store.STOPPED
        rec.stopped_at = rec.stopped_at if previous in ("failed", "stopped", "exited") else time.time()
        if rec.exit_code is None:
            rec.exit_code = exit_status(rec.pid)
        store.save(rec)
        return DownResult(name, previous, report, {"lock_wait_s": waited, **report.timings,
                                                   "total_s": time.monotonic() - t0})
