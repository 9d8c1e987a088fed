"""Verification: are the GPUs free? Wait until they are, or say exactly why not.

A GPU is free when its query succeeded, the driver lists no process with a
context on it (compute, graphics or MPS) but spared GPU daemons, and its used
memory less what those daemons hold (their baseline: an idle MPS server's
66 MiB, see :mod:`gpuslate.host.daemons`) is at most ``max_used``. The default
``max_used`` counts an idle GPU as free on drivers with and without the v2
memory API:

* v2 drivers (R510+) report driver-reserved memory apart from 'used', so an
  idle GPU reads 0 used: the default is 64 MiB.
* v1 drivers count the reserved memory (a few hundred MiB, 645 MB on an H200)
  as used: the default is 1 GiB.

A failed query is never free. Diagnosis names, per GPU, what still holds it
and why, with a remedy that does what it says (a GPU daemon is spared by
``clear``: its remedy is never "run clear"); gpuslate never resets a GPU itself.

Memory held by no process (:func:`~gpuslate.gpu.types.held_by_no_process`: a leaked or
driver-held context) does not go away by waiting: once it is all that keeps the GPUs busy, with
nothing listed whose exit could free it, and it has not gone down for :data:`LEAK_SETTLE_S`
(a teardown still running frees memory, or lists its process), ``wait`` and ``clear`` say so
at once (:class:`LeakWatch`) instead of after their whole ``--timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from .._document import Fields, checked, reading
from .._parse import format_size, gpus_phrase
from .._record import Record
from ..gpu.types import GpuBackend, GpuReading, ProcessKind, held_by_no_process, memory_from_json, memory_json
from ..host.daemons import BASELINE_CAP, DaemonHold, baseline
from ..host.session import HostContext, Ticker
from ..host.snapshot import GpuState, HolderProcess, Snapshot, leak_reason, leak_remedy, resolve_gpus, take_snapshot
from ..options import WaitOptions
from ..outcome import Outcome, StatusEnum
from ..proc.daemons import MPS_CONTROL, MPS_SERVER, DaemonWatch
from ..proc.procfs import EXITED_STATES, zombie_reason, zombie_remedy
from ..proc.terminate import Poller, VictimResult

WAIT_SCHEMA = "gpuslate.wait.v1"


def is_free(r: GpuReading, max_used: int, daemons: Mapping[int, str] | None = None) -> bool:
    """Free (see the module doc); ``daemons`` (pid -> program) are the spared GPU daemons,
    whose memory within their baseline is neither a holder nor counted as used."""
    if r.error is not None or r.memory is None or r.processes is None:
        return False
    spared = reading_baseline(r, daemons)
    pids = {h.pid for h in spared}
    return all(p.pid in pids for p in r.processes) and r.memory.used - sum(h.bytes for h in spared) <= max_used


def state_is_free(g: GpuState, max_used: int) -> bool:
    """:func:`is_free` for a GPU of a snapshot, whose holders say which are GPU daemons."""
    return is_free(g.reading, max_used, {h.pid: h.program for h in g.baseline()})


def reading_baseline(r: GpuReading, daemons: Mapping[int, str] | None) -> list[DaemonHold]:
    """What the spared GPU daemons ``daemons`` hold on the GPU of a reading (its baseline)."""
    if not daemons or not r.processes:
        return []
    return baseline(r.index, [(p.pid, p.used_memory) for p in r.processes], daemons)


def readings_baseline(readings: Sequence[GpuReading], watch: DaemonWatch) -> list[DaemonHold]:
    """The baseline of every GPU of ``readings``, the daemons found by ``watch``."""
    daemons = watch({p.pid for r in readings for p in r.processes or []})
    return [h for r in readings for h in reading_baseline(r, daemons)]


def is_released(r: GpuReading, max_used: int, ended: frozenset[int] | set[int]) -> bool:
    """The processes ``ended`` hold nothing on this GPU any more, whoever else does.

    None of them is listed by the driver, and the memory not accounted for by the
    processes still listed is at most ``max_used`` (their teardown is over). When
    the driver does not report a listed process's memory, only the first part can
    be checked. A failed query is never released.
    """
    if r.error is not None or r.memory is None or r.processes is None:
        return False
    if any(p.pid in ended for p in r.processes):
        return False
    others = [p.used_memory for p in r.processes]
    if any(u is None for u in others):
        return True
    return r.memory.used - sum(u or 0 for u in others) <= max_used


class Problem(NamedTuple):
    """One reason a GPU is not free."""

    pid: int | None
    user: str | None
    command: str | None
    used_memory: int | None
    reason: str
    remedy: str | None
    #: the process that must act for it to go: a zombie's parent, which alone can reap it
    parent: int | None = None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> Problem:
        f = Fields(d)
        return cls(f.opt_pid("pid"), f.opt_text("user"), f.opt_text("command"), f.opt_size("used_memory"),
                   f.text("reason"), f.opt_text("remedy"), f.opt_pid("parent", default=None))


class GpuDiagnosis(NamedTuple):
    gpu: int
    used: int | None
    max_used: int
    error: str | None
    problems: list[Problem]

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "used": self.used, "max_used": self.max_used, "error": self.error,
                "problems": [p.to_json() for p in self.problems]}

    @classmethod
    def from_json(cls, d: object) -> GpuDiagnosis:
        f = Fields(d)
        return cls(f.gpu("gpu"), f.opt_size("used"), f.size("max_used"), f.opt_text("error"),
                   f.items("problems", Problem.from_json))

    def summary(self) -> str:
        head = f"GPU {self.gpu}: " + (f"{format_size(self.used)} used" if self.used is not None else "state unknown")
        return head + "; " + "; ".join(p.reason for p in self.problems)


class WaitStatus(StatusEnum):
    """How a ``wait --free`` ended (its JSON document's ``status``; ``ok``: free)."""

    FREE = "free", Outcome.DONE
    NOT_FREE = "not_free", Outcome.NOT_DONE  # not free within the timeout
    LEAKED = "leaked", Outcome.NOT_DONE  # not free, and only memory held by no process keeps it so: said at once


class WaitResult(Record):
    """What a ``wait`` found; built by keywords only (``max_used`` and ``elapsed_s`` sit side by
    side, and an int passes for a float). A :class:`~gpuslate._record.Record`: ``clear`` imports it."""

    ok: bool
    gpus: list[int]
    max_used: int
    elapsed_s: float
    readings: list[GpuReading]
    diagnosis: list[GpuDiagnosis]
    baseline: tuple[DaemonHold, ...] = ()  # what spared GPU daemons held at the end, not counted as used
    leaked: bool = False  # gave up before the timeout: memory held by no process (see LeakWatch)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": WAIT_SCHEMA, "status": self.status.value, "ok": self.ok, "gpus": self.gpus,
            "max_used": self.max_used, "elapsed_s": round(self.elapsed_s, 4),
            "memory": [memory_json(r) for r in self.readings],
            "baseline": [h.to_json() for h in self.baseline],
            "diagnosis": [d.to_json() for d in self.diagnosis],
        }

    @property
    def status(self) -> WaitStatus:
        return WaitStatus.FREE if self.ok else WaitStatus.LEAKED if self.leaked else WaitStatus.NOT_FREE

    @classmethod
    def from_json(cls, doc: object) -> WaitResult:
        f = Fields(checked(doc, WAIT_SCHEMA))
        with reading(WAIT_SCHEMA):
            status = f.choice("status", WaitStatus, default=None)  # absent: a gpuslate before the status
            return cls(ok=f.flag("ok"), gpus=f.gpus("gpus"), max_used=f.size("max_used"),
                       elapsed_s=f.seconds("elapsed_s"), readings=f.items("memory", memory_from_json),
                       diagnosis=f.items("diagnosis", GpuDiagnosis.from_json),
                       baseline=tuple(f.items("baseline", DaemonHold.from_json, default=[])),
                       leaked=status == WaitStatus.LEAKED)


#: how long memory held by no process must stay, not going down, before ``wait`` and ``clear`` call
#: it a leak: a driver tearing a context down frees memory (or still lists the process) meanwhile
LEAK_SETTLE_S = 1.0


class LeakWatch:
    """Says when waiting longer cannot free the GPUs: every GPU not yet done has more than
    ``max_used`` held by no process, the driver lists nothing on it whose exit could free it
    (``may_free``), and that memory has not gone down for :data:`LEAK_SETTLE_S`. A GPU whose
    memory or processes are unknown is never a leak. Call it with every poll's readings."""

    def __init__(self, max_used: int, *, settle: float = LEAK_SETTLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_used = max_used
        self.settle = settle
        self.clock = clock
        self._seen: dict[int, tuple[float, int]] = {}  # gpu -> (since when, least bytes seen since)

    def __call__(self, pending: Sequence[GpuReading], may_free: Callable[[GpuReading], bool]) -> bool:
        now = self.clock()
        verdict = bool(pending)
        for r in pending:
            left = held_by_no_process(r)
            if left is None or left <= self.max_used or may_free(r):
                self._seen.pop(r.index, None)
                verdict = False
                continue
            since, least = self._seen.get(r.index, (now, left))
            if left < least:  # going down: a teardown, still running
                since, least = now, left
            self._seen[r.index] = (since, least)
            verdict = verdict and now - since >= self.settle
        return verdict


class LeakStop:
    """``give_up`` for :func:`poll_until_free` of GPUs that must be free (``wait``, ``down``'s
    verification, the Slurm hooks): true, and ``verdict`` set, once only memory held by no process
    keeps them busy and it stays. A process still listed may exit (what waiting is for): only a
    GPU that lists none can be a leak."""

    def __init__(self, max_used: int) -> None:
        self.max_used = max_used
        self.watch = LeakWatch(max_used)
        self.verdict = False

    def __call__(self, readings: list[GpuReading]) -> bool:
        self.verdict = self.watch([r for r in readings if not is_free(r, self.max_used)], lambda r: bool(r.processes))
        return self.verdict


def poll_until_free(backend: GpuBackend, gpus: list[int], max_used: int, deadline: float, *,
                    give_up: Callable[[list[GpuReading]], bool] | None = None,
                    done: Callable[[GpuReading], bool] | None = None,
                    daemons: DaemonWatch | None = None,
                    tick: Ticker | None = None) -> tuple[bool, list[GpuReading]]:
    """Poll memory and processes (the cheap query) until all GPUs are free (or
    ``done``, when given), the deadline passes, or ``give_up(readings)`` says
    waiting longer is pointless; ``tick`` is told the memory still held. The GPU daemons
    found by ``daemons`` (default: every one) are spared: their baseline is no holder
    (see :func:`is_free`)."""
    poll = Poller()
    watch = daemons if daemons is not None else DaemonWatch()

    def free(r: GpuReading) -> bool:
        if done is not None:
            return done(r)
        if r.processes and r.error is None:  # /proc is read only for a GPU that lists someone
            return is_free(r, max_used, watch([p.pid for p in r.processes]))  # a list: no callback up here
        return is_free(r, max_used)

    while True:
        readings = backend.read(gpus, full=False)
        if all(free(r) for r in readings):
            return True, readings
        if time.monotonic() >= deadline or (give_up is not None and give_up(readings)):
            return False, readings
        if tick is not None:
            tick(partial(still_held, readings, free))
        poll.sleep(deadline)


def still_held(readings: Sequence[GpuReading], done: Callable[[GpuReading], bool]) -> str:
    """The GPUs not yet done and what they hold, for a progress line: ``GPU 2 5.0 GiB, GPU 3 (2
    processes) 1.0 GiB still used``."""
    parts = []
    for r in readings:
        if done(r):
            continue
        n = len(r.processes or [])
        procs = f" ({n} process{'es' if n != 1 else ''})" if n else ""
        parts.append(f"GPU {r.index}{procs} " + (format_size(r.memory.used) if r.memory else "unknown"))
    return ", ".join(parts) + " still used" if parts else ""


def wait_free(host: HostContext, gpus: Sequence[int] | None = None,
              options: WaitOptions = WaitOptions(), *,
              owners: Callable[[], Mapping[int, str]] | None = None) -> WaitResult:
    """Wait until the GPUs are free; signals nothing. ``ok`` is False on timeout, with a diagnosis.
    ``owners()``, asked only then: pid -> the managed unit it belongs to, whose remedy is to stop
    that unit (``gpuslate down NAME``, as ``up``'s pre-flight says), not to clear."""
    opts = options.validate()
    be = host.backend
    sel = resolve_gpus(be, list(gpus) if gpus is not None else None)
    limit = host.max_used(opts.max_used)
    t0 = time.monotonic()
    watch = DaemonWatch()
    leaked = LeakStop(limit)
    with host.ticker(f"waiting for {gpus_phrase(sel)} to be free",
                     opts.timeout) as tick:
        ok, readings = poll_until_free(be, sel, limit, t0 + opts.timeout, give_up=leaked, tick=tick, daemons=watch)
    elapsed = time.monotonic() - t0
    diag = [] if ok else diagnose(take_snapshot(be, sel), limit, owners=owners() if owners is not None else None)
    return WaitResult(ok=ok, gpus=sel, max_used=limit, elapsed_s=elapsed, readings=readings, diagnosis=diag,
                      baseline=tuple(readings_baseline(readings, watch)), leaked=leaked.verdict and not ok)


def diagnose(snap: Snapshot, max_used: int, *, victims: dict[int, VictimResult] | None = None,
             spared: dict[int, str] | None = None, planned: set[int] | None = None,
             only: set[int] | None = None, owners: Mapping[int, str] | None = None) -> list[GpuDiagnosis]:
    """Explain every GPU of ``snap`` that is not free.

    ``victims``/``spared``/``planned`` come from ``clear``: what it tried to end,
    what it left alone and why, and every pid its plan knew about. With ``only``
    (a clear of selected jobs), a GPU is explained when those processes still hold
    it, and other processes on it are not problems: their memory is theirs. The
    baseline of spared GPU daemons (not ``victims``) is no problem either.
    """
    victims = victims or {}
    spared = spared or {}
    out: list[GpuDiagnosis] = []
    for g in snap.gpus:
        r = g.reading
        base = g.baseline(exclude=victims)
        daemons = {h.pid: h.program for h in base}
        if is_free(r, max_used, daemons) if only is None else is_released(r, max_used, only):
            continue
        problems: list[Problem] = []
        if r.error:
            problems.append(Problem(None, None, None, None,
                                    f"the GPU could not be queried ({r.error}): its state is unknown, not free",
                                    f"check the driver (nvidia-smi -q -i {r.index}) and the kernel log"))
        for p in g.processes:
            if p.kind == ProcessKind.HANDLE:
                continue  # holds no memory and no context: never what keeps a GPU busy
            if p.pid in daemons:
                continue  # a spared daemon's baseline: the host's, not what keeps the GPU busy
            if only is None or p.pid in only:
                problems.append(_explain(p, victims.get(p.pid), spared.get(p.pid), planned,
                                         (owners or {}).get(p.pid)))
        used = r.memory.used if r.memory else None
        orphan = held_by_no_process(r)
        if (orphan is not None and orphan > max_used and used is not None
                and used - sum(h.bytes for h in base) > max_used):
            problems.append(Problem(None, None, None, orphan, leak_reason(orphan), leak_remedy(r.index, snap.backend)))
        out.append(GpuDiagnosis(gpu=r.index, used=used, max_used=max_used, error=r.error, problems=problems))
    return out


def _explain(p: HolderProcess, victim: VictimResult | None, spared: str | None,
             planned: set[int] | None, unit: str | None = None) -> Problem:
    def problem(reason: str, remedy: str | None, parent: int | None = None) -> Problem:
        return Problem(p.pid, p.user, p.command, p.used_memory, reason, remedy, parent)

    if not p.visible:
        if victim is not None and victim.exited_at is not None:
            return problem("exited; the driver is still releasing its memory (teardown)",
                           "wait longer (--timeout); teardown of large contexts can take seconds")
        return problem("its PID is not visible in this host's /proc: a process in another PID namespace "
                       "(a container) or one that just exited",
                       "run gpuslate on the host itself, or stop the container that owns it")
    if p.state in EXITED_STATES:  # every thread gone (a leader that exited while a thread runs is alive)
        return problem(zombie_reason(p.ppid) + "; the driver is releasing its memory", zombie_remedy(p.ppid),
                       p.ppid)
    if p.state == "D":
        return problem("in uninterruptible sleep (state D) inside the kernel or driver: signals take effect "
                       "only when that call returns",
                       f"wait; see 'cat /proc/{p.pid}/stack'; if it never returns, an administrator must reset "
                       "the GPU (gpuslate never resets a GPU)")
    if victim is not None:
        if victim.refused is not None:
            return problem(f"not signaled: refused at act time, {victim.refused}",
                           "end what it would take with it first, or stop it by hand if that is meant")
        if victim.permission_denied:
            return problem(f"gpuslate was not permitted to signal it (owned by {p.user})",
                           f"run as {p.user} or as root")
        sigs = ", ".join(s.signal for s in victim.signals) or "no signal"
        return problem(f"still running after {sigs}", "look at what it is blocked on; raise --timeout")
    if spared is not None:
        remedy = "add --all-users to include other users' jobs" if "another user" in spared else \
            "add --include-handles" if "handle" in spared else None
        return problem(f"not selected: {spared}", remedy)
    if planned is not None and p.pid not in planned:
        return problem("started after the plan was made (a new job, or a restarted one)",
                       "see 'respawned' in the report; stop its supervisor first")
    if p.daemon is not None:  # clear spares it: "run clear" would be no remedy
        held = format_size(p.used_memory) if p.used_memory is not None else "memory the driver does not report"
        stop = f"stop MPS at its source ('echo quit | {MPS_CONTROL}' as its user)" if p.daemon == MPS_SERVER \
            else "stop it at its source (its service)"
        if p.daemon_unproven is not None:
            return problem(f"runs a GPU daemon's program ({p.daemon}) holding {held}, not proven that daemon "
                           f"({p.daemon_unproven}): its memory is held; 'gpuslate clear' spares it",
                           f"{stop}, or end it with 'gpuslate clear --pid {p.pid} --include-handles'")
        why = (f"more than GPU daemons may hold together on a GPU ({format_size(BASELINE_CAP)})"
               if p.used_memory is not None else "so its baseline is unknown")
        return problem(f"a GPU daemon ({p.daemon}) holding {held}, {why}: 'gpuslate clear' spares it",
                       f"{stop}, or end it with 'gpuslate clear --include-handles'")
    if unit is not None:  # a managed unit's: stopped as a unit, its GPUs verified released
        return problem(f"holds {format_size(p.used_memory)} ({p.kind}) for unit {unit}",
                       f"stop the unit: gpuslate down {unit}")
    return problem(f"holds {format_size(p.used_memory)} ({p.kind})", "end it, or run 'gpuslate clear'")
