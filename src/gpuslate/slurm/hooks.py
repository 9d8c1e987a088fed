"""The Slurm hooks: ``epilog`` (end what the ended job left, verify its GPUs free)
and ``prolog`` (verify the allocated GPUs free); either drains the node when
its GPUs are not free in time.

Epilog, in order:

1. Find the job's processes among those holding a GPU (memory, a context or a
   handle, on any GPU): :mod:`.find`'s rule, its uid and its ``SLURM_JOB_ID``,
   or its cgroup; then, for the job's user's holders of memory on the job's
   GPUs that rule does not find (a title written over the environment), the
   second rule, :mod:`.leftover` (its GPUs, its user and its time, shown
   exclusive by Slurm: ``scontrol`` is asked only then). A holder neither
   finds is named in ``unproven``, with the fact that was not shown.
2. End them with ``clear``'s plan/act/verify, selected by pid (``--pid`` with
   ``--all-users --include-handles``: the epilog runs as root for any user),
   audited with the job id in every entry. The plan is gated before any
   signal: if it would signal any process the job-finding rules do not find,
   read again (a job member that cleared its environment, another job's
   process in the same process group), nothing is signaled and the node is
   drained instead.
   Unknown never widens what is signaled.
3. Verify the job's GPUs (``SLURM_JOB_GPUS``) free, whole-GPU, within the
   remaining time; else drain with a reason naming what holds them.

Prolog: step 3 only, for the job about to start; it never signals anything.
The time limit covers everything, the host lock included.
"""

from __future__ import annotations

import os
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from .._document import Fields, checked, reading
from ..clearing.wait import GpuDiagnosis, LeakStop, diagnose, poll_until_free
from ..errors import Interrupted, NotDoneError, PermissionDenied, UsageError
from ..gpu.types import GpuBackend
from ..host.session import HostContext
from ..host.snapshot import resolve_gpus, take_snapshot
from ..outcome import Outcome, StatusEnum
from ..proc.daemons import DaemonWatch
from ..proc.procfs import read_signal_facts
from . import scontrol
from .drain import DRAIN_MIN_S, DrainOutcome, drain_node, drain_reason
from .find import FoundBy, JobProcess, find_job_processes, own_lineage
from .job import SlurmJob
from .leftover import Slurm, Unproven, candidates, decide, gather_holders, gather_slurm

if TYPE_CHECKING:
    from ..clearing.clear import ClearResult
    from ..clearing.plan import Plan

SCHEMA = "gpuslate.slurm.v1"
#: how often the epilog re-finds the job's processes when one exits between finding and planning
_ATTEMPTS = 3


class Hook(str, Enum):
    PROLOG = "prolog"
    EPILOG = "epilog"


class HookStatus(StatusEnum):
    CLEAN = "clean", Outcome.DONE  # the job's GPUs are free
    DRAINED = "drained", Outcome.NOT_DONE  # not free in time: the node was drained with gpuslate's reason
    DRAIN_FAILED = "drain_failed", Outcome.NOT_DRAINED  # not free in time, and scontrol could not drain the node
    NOT_FREE = "not_free", Outcome.NOT_DONE  # not free in time; draining was not asked for (--no-drain)


class HookResult(NamedTuple):
    hook: Hook
    status: HookStatus
    job: SlurmJob
    found: list[JobProcess]  # the job's processes holding a GPU on this node (epilog)
    clear: ClearResult | None  # ending the ones that held GPUs (epilog)
    refused: str | None  # why the job's processes were not ended, when they were not
    diagnosis: list[GpuDiagnosis]
    drain: DrainOutcome | None
    timings: dict[str, float]
    unproven: list[Unproven] = []  # the user's holders of the job's GPUs not shown to be the job's (epilog)

    @property
    def ok(self) -> bool:
        return self.status == HookStatus.CLEAN

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "hook": self.hook.value, "status": self.status.value, "ok": self.ok,
            "job": self.job.to_json(), "found": [p.to_json() for p in self.found],
            "unproven": [u.to_json() for u in self.unproven],
            "clear": self.clear.to_json() if self.clear is not None else None, "refused": self.refused,
            "diagnosis": [d.to_json() for d in self.diagnosis],
            "drain": self.drain.to_json() if self.drain is not None else None,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }

    @classmethod
    def from_json(cls, doc: object) -> HookResult:
        """A ``gpuslate.slurm.v1`` document as the HookResult it was (its clear as
        :meth:`ClearResult.from_json` reads one)."""
        from ..clearing.clear import ClearResult  # lazy: startup (the prolog never loads clear)

        f = Fields(checked(doc, SCHEMA))
        with reading(SCHEMA):
            return cls(f.choice("hook", Hook), f.choice("status", HookStatus), f.record("job", SlurmJob.from_json),
                       f.items("found", JobProcess.from_json), f.opt_record("clear", ClearResult.from_json),
                       f.opt_text("refused"), f.items("diagnosis", GpuDiagnosis.from_json),
                       f.opt_record("drain", DrainOutcome.from_json), f.timings("timings"),
                       f.items("unproven", Unproven.from_json))


class _Finder:
    """The job's processes among the GPU holders, by both rules; Slurm is asked (once, at most)
    only when a holder of the job's GPUs is left that the first rule does not find."""

    def __init__(self, job: SlurmJob, be: GpuBackend, gpus: list[int], deadline: float) -> None:
        self.job, self.be, self.gpus, self.deadline = job, be, frozenset(gpus), deadline
        self.slurm: Slurm | None = None
        self.unproven: list[Unproven] = []

    def find(self, among: list[int] | None = None) -> list[JobProcess]:
        """The job's processes among the holders the GPUs list now (``among``: those pids only,
        listed or not: a plan's launcher holds nothing)."""
        listed, memory = _gpu_processes(self.be)
        found = find_job_processes(self.job.job_id, self.job.uid, among=listed if among is None else among)
        self.unproven = []
        if not self.gpus:
            return found
        holders = gather_holders({p: g for p, g in memory.items() if among is None or p in among}, self.job.uid)
        lineage = own_lineage()
        if not candidates(holders, self.job.job_id, self.job.uid, self.gpus, lineage):
            return found
        if self.slurm is None:
            self.slurm = gather_slurm(self.job.job_id, self.job.node,
                                      timeout=max(0.5, min(10.0, self.deadline - time.monotonic())))
        by_gpu, self.unproven = decide(holders, self.job.job_id, self.job.uid, self.gpus, self.slurm, lineage)
        known = {p.pid for p in found}
        return sorted(found + [JobProcess(p, FoundBy.GPU) for p in by_gpu if p not in known])


class _Gate:
    """``clear``'s confirmation, used as a gate: the plan may signal only processes the
    job-finding rules find in the job (each target is checked against them, afresh)."""

    def __init__(self, finder: _Finder) -> None:
        self.finder = finder
        self.refused: str | None = None

    def __call__(self, plan: Plan) -> bool:
        pids = [t.ident.pid for t in plan.targets]
        inside = {p.pid for p in self.finder.find(among=pids)}
        outside = [t for t in plan.targets if t.ident.pid not in inside]
        if outside:
            shown = ", ".join(f"{t.ident.pid} ({t.name})" for t in outside[:5])
            self.refused = (f"the plan reached beyond the job: {shown} "
                            f"{'is' if len(outside) == 1 else 'are'} in a job with its processes but not "
                            "found in it (no SLURM_JOB_ID, another uid, not shown to be the job's by its GPUs); "
                            "nothing was signaled")
            return False
        return True


def epilog(host: HostContext, job: SlurmJob, *, grace: float = 5.0, timeout: float = 30.0,
           max_used: int | None = None, drain: bool = True) -> HookResult:
    """End what job ``job`` left on ``host`` and verify its GPUs free, else drain (see the module doc).
    Every audit entry of ``host`` from now on names the job."""
    _check_times(grace, timeout)
    if os.geteuid() != 0 and job.uid != os.getuid():
        raise PermissionDenied(f"the epilog of job {job.job_id} (uid {job.uid}) must run as root, as Slurm runs "
                               f"Epilog: as uid {os.getuid()} it can neither find nor end that user's processes")
    t0 = time.monotonic()
    deadline = t0 + timeout
    timings: dict[str, float] = {}
    host.add_audit_context({"slurm_job": job.job_id, "slurm_hook": Hook.EPILOG.value, "slurm_node": job.node})
    be = host.backend
    gpus = resolve_gpus(be, list(job.gpus)) if job.gpus else []  # a GPU that does not exist: UsageError
    limit = host.max_used(max_used)
    found: list[JobProcess] = []
    cleared: ClearResult | None = None
    refused: str | None = None
    finder = _Finder(job, be, gpus, deadline)
    unproven: list[Unproven] = []
    for _attempt in range(_ATTEMPTS):
        found = finder.find()
        unproven = finder.unproven
        timings["find_s"] = time.monotonic() - t0
        refused = None
        if not found:
            break
        # imported here, not at the top, for the clean path's start-up time: only a job that
        # left a GPU holder needs clear's planner
        from ..clearing.clear import clear  # lazy: startup
        from ..options import ClearOptions, Selection  # lazy: startup

        gate = _Gate(finder)
        try:
            sel = Selection(pids=tuple(p.pid for p in found), all_users=True, include_handles=True)
            cleared = clear(host, sel, ClearOptions(grace=grace, timeout=max(0.0, deadline - time.monotonic()),
                                                    max_used=limit, confirm=gate))
            break
        except Interrupted:
            refused = gate.refused or "the plan was refused; nothing was signaled"
            break
        except UsageError as exc:  # a holder exited between finding and planning: find again
            refused = f"could not plan the end of the job's processes: {exc}"
        except (NotDoneError, PermissionDenied) as exc:  # the host lock, planning time, the audit log
            refused = f"the job's processes were not ended: {exc}" + (f" ({exc.hint})" if exc.hint else "")
            break
    timings["clear_s"] = time.monotonic() - t0
    result = _verify(Hook.EPILOG, job, be, gpus, limit, deadline, drain, found, cleared, refused, timings, t0)
    return result._replace(unproven=unproven)


def prolog(host: HostContext, job: SlurmJob, *, timeout: float = 10.0, max_used: int | None = None,
           drain: bool = True) -> HookResult:
    """Verify the job's GPUs free on ``host`` before it starts, else drain; signals nothing."""
    _check_times(0.0, timeout)
    t0 = time.monotonic()
    be = host.backend
    gpus = resolve_gpus(be, list(job.gpus)) if job.gpus else []
    return _verify(Hook.PROLOG, job, be, gpus, host.max_used(max_used), t0 + timeout, drain, [], None, None, {}, t0)


def _check_times(grace: float, timeout: float) -> None:
    for name, v in (("grace", grace), ("timeout", timeout)):
        if not v >= 0:
            raise UsageError(f"invalid --{name} {v}: must be at least 0")


def _gpu_processes(be: GpuBackend) -> tuple[list[int], dict[int, frozenset[int]]]:
    """Every process the GPUs list (memory, a context or a device handle), on any GPU, and the
    GPUs each holds memory on; a thread id a driver reports stands for its process, as in
    clear's plan."""
    snap = take_snapshot(be, None, full=False)
    tgid: dict[int, int] = {}
    memory: dict[int, set[int]] = {}
    for g in snap.gpus:
        for p in g.processes:
            if not p.visible:
                continue
            if p.pid not in tgid:
                facts = read_signal_facts(p.pid)
                tgid[p.pid] = facts.tgid if facts is not None and facts.tgid else p.pid
            if p.used_memory:
                memory.setdefault(tgid[p.pid], set()).add(g.index)
    return sorted(set(tgid.values())), {pid: frozenset(gs) for pid, gs in memory.items()}


def _verify(hook: Hook, job: SlurmJob, be: GpuBackend, gpus: list[int], limit: int, deadline: float, drain: bool,
            found: list[JobProcess], cleared: ClearResult | None, refused: str | None,
            timings: dict[str, float], t0: float) -> HookResult:
    ok = True
    diagnosis: list[GpuDiagnosis] = []
    if gpus:
        # a GPU daemon of the job's own (an MPS server it started) is no spared baseline: it must be gone
        victims = {r.victim.ident.pid: r for r in cleared.results} if cleared is not None else {}
        mine = DaemonWatch(exclude={p.pid for p in found} | set(victims))
        # a leak: drain at once
        ok, _ = poll_until_free(be, gpus, limit, deadline, daemons=mine, give_up=LeakStop(limit))
        if not ok:
            diagnosis = diagnose(take_snapshot(be, gpus), limit, victims=victims)
            ok = not diagnosis  # freed between the last poll and the snapshot
    timings["verify_s"] = time.monotonic() - t0
    outcome: DrainOutcome | None = None
    if ok:
        status = HookStatus.CLEAN
    elif not drain:
        status = HookStatus.NOT_FREE
    else:
        when = "after" if hook == Hook.EPILOG else "before"
        outcome = drain_node(job.node, drain_reason(when, job.job_id, diagnosis),
                             timeout=max(DRAIN_MIN_S, min(scontrol.TIMEOUT_S, deadline - time.monotonic())))
        status = HookStatus.DRAINED if outcome.ok else HookStatus.DRAIN_FAILED
    timings["total_s"] = time.monotonic() - t0
    return HookResult(hook, status, job, found, cleared, refused, diagnosis, outcome, timings)
