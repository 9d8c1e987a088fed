"""``clear``: plan, act, verify. The safe replacement for
``fuser -k /dev/nvidia*; sleep 2; nvidia-smi | grep MiB | head -4``.

1. Plan (under the host lock): the targets and the spared, with reasons.
2. Act: SIGTERM to every target at once, grace, SIGKILL to survivors; each
   signal audited before it is sent and sent only to the exact process, after
   the act-time gate (:mod:`.gate`) has checked it again against fresh facts.
3. Verify: poll until every target is gone and every selected GPU is free
   (what spared GPU daemons hold, an idle MPS server's memory, is the host's
   baseline: shown apart, not counted); on timeout, a diagnosis per GPU. A
   restarted target is named with its supervisor, not fought in a loop.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from typing import Any, NamedTuple

from .._document import Fields, checked, reading
from .._parse import format_gpu_list
from .._record import Record
from .._time import iso_time
from ..errors import NotConfirmed, NotDoneError
from ..gpu.types import GpuBackend, GpuReading, ProcessKind, memory_from_json, memory_json
from ..host.audit import new_run_id
from ..host.daemons import DaemonHold
from ..host.session import HostContext, Ticker
from ..host.snapshot import Snapshot, take_snapshot
from ..options import ClearOptions, Selection
from ..outcome import Outcome, StatusEnum
from ..proc.daemons import DaemonWatch
from ..proc.jobs import Protection
from ..proc.procfs import list_pids, read_cgroup, read_info, read_stat, user_name
from ..proc.terminate import Victim, VictimResult, terminate
from ..proc.tree import ProcTable
from .gate import ActGate
from .plan import Plan, Role, Spared, Target, VerifyMode, make_plan, resolve
from .wait import (
    GpuDiagnosis,
    LeakWatch,
    diagnose,
    is_free,
    is_released,
    poll_until_free,
    reading_baseline,
    readings_baseline,
)

SCHEMA = "gpuslate.clear.v1"
SUPERVISORS = {
    "systemd": "systemctl stop {unit}", "supervisord": "supervisorctl stop <program>",
    "runsv": "sv down <service>", "s6-supervise": "s6-svc -d <service>", "pm2": "pm2 stop <name>",
    "containerd-shim": "docker stop {container} (or kubectl delete pod / crictl stop)",
    "conmon": "podman stop {container}", "tini": "docker stop {container}", "docker-init": "docker stop {container}",
}


class Respawn(NamedTuple):
    pid: int
    command: str | None
    replaces: int | None  # the target pid it looks like
    supervisor: str | None
    remedy: str

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> Respawn:
        f = Fields(d)
        return cls(pid=f.pid("pid"), command=f.text("command"), replaces=f.pid("replaces"),
                   supervisor=f.text("supervisor"), remedy=f.text("remedy"))


class ClearStatus(StatusEnum):
    CLEAN = "clean", Outcome.DONE  # every verified GPU is free
    TIMEOUT = "timeout", Outcome.NOT_DONE  # not free within the timeout
    HELD_BY_OTHERS = "held_by_others", Outcome.NOT_DONE  # every target gone; what still holds the GPUs is not a target
    LEAKED = "leaked", Outcome.NOT_DONE  # every target gone; memory no process holds keeps the GPUs busy (said at once)
    PERMISSION_DENIED = "permission_denied", Outcome.DENIED  # some target could not be signaled
    NOTHING_SELECTED = "nothing_selected", Outcome.NOT_DONE  # a selector chose no process this caller may signal
    REFUSED = "refused", Outcome.NOT_DONE  # a target the act-time gate refused still holds GPU memory
    DRY_RUN = "dry_run", Outcome.DONE


class ClearResult(Record):
    """What a ``clear`` did; built by keywords only (``before`` and ``after`` are both readings:
    a positional call could swap them unseen). A :class:`~gpuslate._record.Record`, not a
    dataclass: see there why."""

    status: ClearStatus
    host: str
    backend: str
    plan: Plan
    results: list[VictimResult]
    before: list[GpuReading]
    after: list[GpuReading]
    diagnosis: list[GpuDiagnosis]
    respawned: list[Respawn]
    timings: dict[str, float]
    max_used: int
    started_at: float
    baseline: tuple[DaemonHold, ...] = ()  # what spared GPU daemons held after, not counted as used

    @property
    def ok(self) -> bool:
        return self.status in (ClearStatus.CLEAN, ClearStatus.DRY_RUN)

    def to_json(self) -> dict[str, Any]:
        by_pid = {r.victim.ident.pid: r for r in self.results}
        targets = []
        for t in self.plan.targets:
            doc = t.to_json()
            r = by_pid.pop(t.ident.pid, None)
            doc.update(r.outcome_json() if r else {"signals": [], "exited_at_s": None, "ended_by": None,
                                                   "permission_denied": False, "refused": None})
            targets.append(doc)
        targets += [r.to_json() for r in by_pid.values()]  # forked by a job while it was stopped
        return {
            "schema": SCHEMA, "status": self.status.value, "ok": self.ok, "host": self.host,
            "backend": self.backend, "dry_run": self.status == ClearStatus.DRY_RUN,
            "started_at": iso_time(self.started_at), "gpus": self.plan.gpus,
            "verify": self.plan.verify_mode.value, "max_used": self.max_used,
            "before": [memory_json(r) for r in self.before], "after": [memory_json(r) for r in self.after],
            "baseline": [h.to_json() for h in self.baseline],
            "targets": targets, "spared": [s.to_json() for s in self.plan.spared],
            "respawned": [r.to_json() for r in self.respawned],
            "diagnosis": [d.to_json() for d in self.diagnosis],
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }

    @classmethod
    def from_json(cls, doc: object) -> ClearResult:
        """A ``gpuslate.clear.v1`` document as the ClearResult it was. What the document does not
        carry stays unknown: the plan's snapshot has no GPUs, its selection is empty (the document's
        ``verify`` says how the GPUs were verified), no pid is known to have been on the host."""
        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            status = f.choice("status", ClearStatus)
            targets: list[Target] = []
            results: list[VictimResult] = []

            def target(t: object) -> None:
                if Fields(t).raw("role") == Role.FORKED.value:  # forked by a job while it was stopped: a result only
                    results.append(VictimResult.from_json(t))
                    return
                one = Target.from_json(t)
                targets.append(one)
                if status not in (ClearStatus.DRY_RUN, ClearStatus.NOTHING_SELECTED):
                    results.append(VictimResult.from_json(t, one.audit_info()))

            f.items("targets", target)
            started = f.time("started_at")
            host, backend = f.text("host"), f.text("backend")
            plan = Plan(gpus=f.gpus("gpus"), targets=targets, spared=f.items("spared", Spared.from_json),
                        before=Snapshot(host=host, backend=backend, driver_version=None, taken_at=started, gpus=[],
                                        host_processes=[], warnings=[]), selection=Selection(),
                        known=frozenset(), verify=f.choice("verify", VerifyMode))
            return cls(status=status, host=host, backend=backend, plan=plan, results=results,
                       before=f.items("before", memory_from_json), after=f.items("after", memory_from_json),
                       diagnosis=f.items("diagnosis", GpuDiagnosis.from_json),
                       respawned=f.items("respawned", Respawn.from_json), timings=f.timings("timings"),
                       max_used=f.size("max_used"), started_at=started,
                       baseline=tuple(f.items("baseline", DaemonHold.from_json, default=[])))


def clear(host: HostContext, selection: Selection, options: ClearOptions = ClearOptions()) -> ClearResult:
    """Terminate the jobs holding the selected GPUs and verify the GPUs are free.

    Raises :class:`~gpuslate.errors.UsageError` on bad input before anything is
    signaled, and :class:`~gpuslate.errors.NotConfirmed` (an ``Interrupted``) when ``options.confirm``
    says no. The time ``confirm`` takes (a person reading the plan) counts in no
    timing and not against ``timeout``. The host lock is taken through ``host``
    (re-entrant: a verb that holds it, such as ``up --clear``, does not wait for it).
    """
    opts = options.validate()
    sel = selection
    resolved = resolve(sel)  # bad input fails before the host is even locked; the plan gets it as checked
    note = host.note
    timeout = opts.timeout
    be = host.backend  # opened (NVML initialised) before the clock starts and before the lock, as always
    limit = host.max_used(opts.max_used)
    t_start = time.monotonic()
    started_at = time.time()
    locked = nullcontext(0.0) if opts.dry_run else host.locked(_purpose(sel), timeout=timeout)
    with locked:
        plan = make_plan(be, resolved)
        t_plan = time.monotonic()
        before = plan.before_verified
        timings = {"plan_s": t_plan - t_start}
        spared_now = _spared_baseline(plan)
        if opts.dry_run:
            timings["total_s"] = time.monotonic() - t_start
            return ClearResult(status=ClearStatus.DRY_RUN, host=plan.before.host, backend=be.name, plan=plan,
                               results=[], before=before, after=before, diagnosis=[], respawned=[], timings=timings,
                               max_used=limit, started_at=started_at, baseline=spared_now)
        if t_plan - t_start > timeout:
            raise NotDoneError(f"planning took {t_plan - t_start:.1f} s, more than --timeout {timeout:g} s: "
                               "nothing was signaled")
        if sel.narrows and not plan.targets:
            # verifying an empty set of GPUs proves nothing: say that nothing was chosen
            timings["total_s"] = time.monotonic() - t_start
            return ClearResult(status=ClearStatus.NOTHING_SELECTED, host=plan.before.host, backend=be.name,
                               plan=plan, results=[], before=before, after=before, diagnosis=[], respawned=[],
                               timings=timings, max_used=limit, started_at=started_at, baseline=spared_now)
        if opts.confirm is not None and plan.targets:
            t_ask = time.monotonic()
            if not opts.confirm(plan):
                raise NotConfirmed("not confirmed: nothing was signaled")
            t_start += time.monotonic() - t_ask  # a person reading the plan is not clear's time
        deadline = t_start + timeout
        run_id = new_run_id()
        victims = [Victim(ident=t.ident, info=t.audit_info(), ignores_sigterm=t.ignores_sigterm, job=t.job,
                          waits_for=t.waits_for) for t in plan.targets]  # each target's audit record, built once: every
        # phase's audit line carries this one dict (the gate, by design, reads fresh facts instead)
        log = host.audit_log if victims else None
        results = terminate(victims, grace=min(opts.grace, max(0.0, deadline - time.monotonic())),
                            kill_wait=max(0.0, deadline - time.monotonic()), action="clear", run_id=run_id,
                            audit=log, on_event=note, clock_start=t_start, discover=_ForkWatch(plan),
                            gate=ActGate())
        t_exit = time.monotonic()
        timings["exit_s"] = t_exit - t_start
        watch = DaemonWatch(exclude={r.victim.ident.pid for r in results} | {t.ident.pid for t in plan.targets})
        with host.ticker("waiting for the GPU memory to be released", max(0.0, deadline - t_exit),
                         started=t_exit) as tick:
            ok, after, respawned, held, leaked = _verify(be, plan, results, limit, deadline, watch, tick)
        t_free = time.monotonic()
        if ok:
            timings["free_s"] = t_free - t_start
        diagnosis: list[GpuDiagnosis] = []
        if not ok:
            snap = take_snapshot(be, plan.gpus)
            victims_by_pid = {r.victim.ident.pid: r for r in results}
            released = plan.verify_mode == VerifyMode.RELEASED
            diagnosis = diagnose(snap, limit, victims=victims_by_pid,
                                 spared={s.pid: s.reason for s in plan.spared},
                                 planned=_planned(plan), only=set(victims_by_pid) if released else None)
            respawned = respawned or _respawns(plan, snap)
        timings["total_s"] = time.monotonic() - t_start
        refused_holders = {r.victim.ident.pid for r in results if r.refused is not None} & \
            {p.pid for r in after for p in (r.processes or [])}
        if any(r.permission_denied for r in results):
            status = ClearStatus.PERMISSION_DENIED
        elif ok:
            status = ClearStatus.CLEAN
        elif refused_holders:
            status = ClearStatus.REFUSED
        elif held and not respawned:
            status = ClearStatus.HELD_BY_OTHERS
        elif leaked and not respawned:
            status = ClearStatus.LEAKED
        else:
            status = ClearStatus.TIMEOUT
        return ClearResult(status=status, host=plan.before.host, backend=be.name, plan=plan, results=results,
                           before=before, after=after, diagnosis=diagnosis, respawned=respawned, timings=timings,
                           max_used=limit, started_at=started_at, baseline=tuple(readings_baseline(after, watch)))


def _spared_baseline(plan: Plan) -> tuple[DaemonHold, ...]:
    """What the spared GPU daemons held on the verified GPUs when the plan was made."""
    targets = {t.ident.pid for t in plan.targets}
    return tuple(h for g in plan.before.gpus if g.index in plan.gpus for h in g.baseline(exclude=targets))


def _purpose(sel: Selection) -> str:
    return f"gpuslate clear --gpus {format_gpu_list(list(sel.gpus)) if sel.gpus else 'all'}"


def _planned(plan: Plan) -> set[int]:
    return {t.ident.pid for t in plan.targets} | {s.pid for s in plan.spared} | \
        {p.pid for g in plan.before.gpus for p in g.processes}


class _ForkWatch:
    """Finds what a job forks while it is being stopped (a launcher's cleanup hook, a
    supervisor loop inside the job): processes started after the plan whose parent is
    a victim, or that joined the process group a target launcher leads. Only
    /proc entries not seen before are read, so a call costs one directory listing.
    A parent is a victim by identity (pid and start time), never by pid alone, and a
    group counts only while its launcher is still the planned process: a reused pid
    or group id brings nobody in."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.seen: set[int] = set(plan.known)
        self.spared = {s.pid for s in plan.spared}
        self.groups = {t.ident.pid: t.ident for t in plan.targets if t.role == Role.LAUNCHER}
        self.me = os.getuid()

    def __call__(self, victims: list[Victim]) -> list[Victim]:
        new_pids = [p for p in list_pids() if p not in self.seen]
        if not new_pids:
            return []
        self.seen.update(new_pids)
        idents = {v.ident.pid: v for v in victims}
        table = ProcTable()
        protect = Protection(table, os.getpid(), os.getuid())
        found: list[Victim] = []
        for pid in sorted(new_pids):
            st = table.get(pid)
            if st is None or st.has_exited or pid in self.spared:
                continue
            parent = idents.get(st.ppid)
            if parent is not None and not _is(table, parent.ident):
                parent = None  # the parent's pid names another process now
            launcher = self.groups.get(st.pgid)
            in_group = launcher is not None and _is(table, launcher)
            job = parent.job if parent is not None else (st.pgid if in_group else None)
            if job is None or protect(pid):
                continue
            uid = table.uid(pid)
            if uid != self.me and not self.plan.selection.all_users:
                continue
            argv = table.argv(pid)
            info: dict[str, Any] = {
                    "pid": pid, "start_ticks": st.start_ticks, "user": user_name(uid) if uid is not None else None,
                    "uid": uid, "command": " ".join(argv) if argv else f"[{st.name}]", "name": st.name,
                    "gpus": [], "used_memory": None, "role": Role.FORKED.value,
                    "reason": f"started by {st.ppid} after the plan, while its job was being stopped",
                    "job": job, "ignores_sigterm": None, "container": None, "cgroup": None}
            found.append(Victim(ident=st.ident, info=info, ignores_sigterm=None, job=job))
            idents[pid] = found[-1]
        return found


def _is(table: ProcTable, ident: Any) -> bool:
    """Whether ``ident``'s pid still names that very process (alive or a zombie)."""
    st = table.get(ident.pid)
    return st is not None and st.start_ticks == ident.start_ticks


def _verify(be: GpuBackend, plan: Plan, results: list[VictimResult], limit: int, deadline: float,
            daemons: DaemonWatch, tick: Ticker | None = None,
            ) -> tuple[bool, list[GpuReading], list[Respawn], bool, bool]:
    """Poll until free (or, for selected jobs, until they hold nothing on their GPUs).
    Stop early, without waiting out the timeout, when waiting cannot help: a target
    was restarted by a supervisor, what holds a GPU that must be free is a live
    process that is not a target (another user's job without --all-users, a spared
    process), memory held by no process stays once every target is gone (a leak: see
    :class:`~.wait.LeakWatch`), and no spared daemon within its baseline counts (``daemons``:
    the host's, never what keeps a GPU busy). Returns (done, readings, respawned, held by
    others, leaked)."""
    planned = _planned(plan)
    refused = {r.victim.ident.pid for r in results if r.refused is not None}
    targets = ({r.victim.ident.pid for r in results} | {t.ident.pid for t in plan.targets}) - refused
    released = plan.verify_mode == VerifyMode.RELEASED
    invisible_before = {p.pid for g in plan.before.gpus for p in g.processes if not p.visible}
    checked: set[int] = set()
    respawned: list[Respawn] = []
    held = leaked = False
    leak = LeakWatch(limit)

    def settled(readings: list[GpuReading]) -> bool:
        """Only memory held by no process keeps the GPUs busy, and it stays (nothing listed that
        clear waits for: a target; verifying free GPUs, any process)."""
        nonlocal leaked
        found = daemons(sorted({p.pid for r in readings for p in (r.processes or [])} - targets))
        pending = [r for r in readings if not (done(r) if done is not None else is_free(r, limit, found))]
        leaked = leak(pending, lambda r: any((released is False and p.pid not in found) or p.pid in targets
                                             for p in r.processes or []))
        return leaked

    def hopeless(readings: list[GpuReading]) -> bool:
        nonlocal held
        listed = {p.pid for r in readings for p in (r.processes or [])}
        new = listed - planned - checked
        if new:  # looked at first: a supervisor restarts a target while the driver still tears its context down
            checked.update(new)
            respawned.extend(_respawns(plan, take_snapshot(be, plan.gpus)))
        if respawned:
            return True
        if listed & targets:
            return False  # a target's context is still being torn down: its memory is not free yet
        if listed & refused:  # a target the gate refused still holds memory: nothing will end it
            held = True
            return True
        if released:
            return settled(readings)  # other jobs may hold these GPUs: that is theirs, not a failure
        found = daemons(listed - targets)
        base = {h.pid for r in readings for h in reading_baseline(r, found)}
        for pid in listed - targets - base:
            st = read_stat(pid)
            if (st is not None and not st.has_exited) or pid in invisible_before:
                held = True
                return True
        return settled(readings)

    # a refused target still counts as the selected job's: its memory is not released
    done = (lambda r: is_released(r, limit, targets | refused)) if released else None
    ok, readings = poll_until_free(be, plan.gpus, limit, deadline, give_up=hopeless, done=done, daemons=daemons,
                                   tick=tick)
    return ok, readings, respawned, held, leaked and not ok


def _respawns(plan: Plan, snap: Snapshot) -> list[Respawn]:
    """New holders that look like a target restarted: same command line or same service cgroup."""
    planned = _planned(plan)
    by_cmd = {t.command: t for t in plan.targets if t.role == Role.HOLDER}
    by_cgroup = {t.cgroup: t for t in plan.targets if t.cgroup and t.cgroup.endswith(".service")}
    out: list[Respawn] = []
    table = ProcTable()
    for g in snap.gpus:
        for p in g.processes:
            if p.pid in planned or not p.visible or p.kind == ProcessKind.HANDLE or any(r.pid == p.pid for r in out):
                continue
            cg = read_cgroup(p.pid)
            old = by_cmd.get(p.command or "") or (by_cgroup.get(cg) if cg else None)
            if old is None:
                continue
            sup, remedy = _supervisor(table, p.pid, cg, p.container)
            out.append(Respawn(pid=p.pid, command=p.command, replaces=old.ident.pid, supervisor=sup, remedy=remedy))
    return out


def _supervisor(table: ProcTable, pid: int, cgroup: str | None, container: str | None) -> tuple[str | None, str]:
    unit = cgroup.rsplit("/", 1)[-1] if cgroup and cgroup.endswith(".service") else None
    for anc in table.ancestors(pid):
        info = read_info(anc)
        if info is None:
            continue
        base = "containerd-shim" if info.name.startswith("containerd-shim") else info.name
        if base in SUPERVISORS and (base != "systemd" or unit):
            remedy = SUPERVISORS[base].format(unit=unit, container=container or "<container>")
            return f"{info.name} (pid {anc})", f"stop it at its source: {remedy}"
        if anc == 1:
            break
        if base not in ("bash", "sh", "dash", "zsh"):
            continue
        return f"{info.name} (pid {anc}): {info.command}", (
            f"stop the loop that restarts it: end PID {anc} ({info.command}) first, then clear again")
    if unit:
        return f"systemd unit {unit}", f"stop it at its source: systemctl stop {unit}"
    return None, "find what restarts it (a service manager, a container runtime, a loop) and stop that first"

