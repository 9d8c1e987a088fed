"""Verification: are the GPUs free? Wait until they are, or say exactly why not.

A GPU is free when its query succeeded, the driver lists no process with a
context on it (compute, graphics or MPS), and its used memory is at most
``max_used``. The default ``max_used`` counts an idle GPU as free on drivers
with and without the v2 memory API:

* v2 drivers (R510+) report driver-reserved memory apart from 'used', so an
  idle GPU reads 0 used: the default is 64 MiB.
* v1 drivers count the reserved memory (a few hundred MiB, 645 MB on an H200)
  as used: the default is 1 GiB.

A failed query is never free. Diagnosis names, per GPU, what still holds it
and why, with the remedy; gpuslate never resets a GPU itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any, NamedTuple

from .._document import checked, reading
from .._parse import check_seconds, check_size, format_size
from ..gpu.types import GpuBackend, GpuReading, memory_from_json, memory_json
from ..host.session import HostContext
from ..host.snapshot import HolderProcess, Snapshot, resolve_gpus, take_snapshot
from ..proc.procfs import EXITED_STATES, zombie_reason, zombie_remedy
from ..proc.terminate import Poller, VictimResult

WAIT_SCHEMA = "gpuslate.wait.v1"


def is_free(r: GpuReading, max_used: int) -> bool:
    return (r.error is None and r.memory is not None and r.processes is not None
            and not r.processes and r.memory.used <= max_used)


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
    def from_json(cls, d: dict[str, Any]) -> Problem:
        return cls(d["pid"], d["user"], d["command"], d["used_memory"], d["reason"], d["remedy"], d.get("parent"))


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
    def from_json(cls, d: dict[str, Any]) -> GpuDiagnosis:
        return cls(d["gpu"], d["used"], d["max_used"], d["error"], [Problem.from_json(p) for p in d["problems"]])

    def summary(self) -> str:
        head = f"GPU {self.gpu}: " + (f"{format_size(self.used)} used" if self.used is not None else "state unknown")
        return head + "; " + "; ".join(p.reason for p in self.problems)


class WaitStatus(str, Enum):
    """How a ``wait --free`` ended (its JSON document has ``ok``: derived from it)."""

    FREE = "free"
    NOT_FREE = "not_free"  # not free within the timeout


class WaitResult(NamedTuple):
    ok: bool
    gpus: list[int]
    max_used: int
    elapsed_s: float
    readings: list[GpuReading]
    diagnosis: list[GpuDiagnosis]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": WAIT_SCHEMA, "ok": self.ok, "gpus": self.gpus, "max_used": self.max_used,
            "elapsed_s": round(self.elapsed_s, 4),
            "memory": [memory_json(r) for r in self.readings],
            "diagnosis": [d.to_json() for d in self.diagnosis],
        }

    @property
    def status(self) -> WaitStatus:
        return WaitStatus.FREE if self.ok else WaitStatus.NOT_FREE

    @classmethod
    def from_json(cls, doc: object) -> WaitResult:
        d = checked(doc, WAIT_SCHEMA)
        with reading(WAIT_SCHEMA):
            return cls(bool(d["ok"]), list(d["gpus"]), d["max_used"], float(d["elapsed_s"]),
                       [memory_from_json(m) for m in d["memory"]],
                       [GpuDiagnosis.from_json(g) for g in d["diagnosis"]])


def poll_until_free(backend: GpuBackend, gpus: list[int], max_used: int, deadline: float, *,
                    give_up: Callable[[list[GpuReading]], bool] | None = None,
                    done: Callable[[GpuReading], bool] | None = None,
                    ) -> tuple[bool, list[GpuReading]]:
    """Poll memory and processes (the cheap query) until all GPUs are free (or
    ``done``, when given), the deadline passes, or ``give_up(readings)`` says
    waiting longer is pointless."""
    poll = Poller()
    ok = done if done is not None else (lambda r: is_free(r, max_used))
    while True:
        readings = backend.read(gpus, full=False)
        if all(ok(r) for r in readings):
            return True, readings
        if time.monotonic() >= deadline or (give_up is not None and give_up(readings)):
            return False, readings
        poll.sleep(deadline)


class WaitOptions(NamedTuple):
    """How long ``wait`` waits and what counts as free; plain data."""

    max_used: int | None = None  # most memory a free GPU may show; None: the host's default
    timeout: float = 60.0

    def validate(self) -> WaitOptions:
        check_seconds("--timeout", self.timeout)
        check_size("--max-used", self.max_used)
        return self


def wait_free(host: HostContext, gpus: Sequence[int] | None = None,
              options: WaitOptions = WaitOptions()) -> WaitResult:
    """Wait until the GPUs are free; signals nothing. ``ok`` is False on timeout, with a diagnosis."""
    opts = options.validate()
    be = host.backend
    sel = resolve_gpus(be, list(gpus) if gpus is not None else None)
    limit = host.max_used(opts.max_used)
    t0 = time.monotonic()
    ok, readings = poll_until_free(be, sel, limit, t0 + opts.timeout)
    elapsed = time.monotonic() - t0
    diag = [] if ok else diagnose(take_snapshot(be, sel), limit)
    return WaitResult(ok, sel, limit, elapsed, readings, diag)


def diagnose(snap: Snapshot, max_used: int, *, victims: dict[int, VictimResult] | None = None,
             spared: dict[int, str] | None = None, planned: set[int] | None = None,
             only: set[int] | None = None) -> list[GpuDiagnosis]:
    """Explain every GPU of ``snap`` that is not free.

    ``victims``/``spared``/``planned`` come from ``clear``: what it tried to end,
    what it left alone and why, and every pid its plan knew about. With ``only``
    (a clear of selected jobs), a GPU is explained when those processes still hold
    it, and other processes on it are not problems: their memory is theirs.
    """
    victims = victims or {}
    spared = spared or {}
    out: list[GpuDiagnosis] = []
    for g in snap.gpus:
        r = g.reading
        if is_free(r, max_used) if only is None else is_released(r, max_used, only):
            continue
        problems: list[Problem] = []
        if r.error:
            problems.append(Problem(None, None, None, None,
                                    f"the GPU could not be queried ({r.error}): its state is unknown, not free",
                                    f"check the driver (nvidia-smi -q -i {r.index}) and the kernel log"))
        accounted = 0
        for p in g.processes:
            if p.kind == "handle":
                continue  # holds no memory and no context: never what keeps a GPU busy
            accounted += p.used_memory or 0
            if only is None or p.pid in only:
                problems.append(_explain(p, victims.get(p.pid), spared.get(p.pid), planned))
        used = r.memory.used if r.memory else None
        if used is not None and used > max_used and used - accounted > max_used:
            orphan = used - accounted
            problems.append(Problem(
                None, None, None, orphan,
                f"{format_size(orphan)} held by no process: an orphaned context (an MPS server, a CUDA IPC "
                "handle, a process in another container or PID namespace) or a teardown still running",
                "if MPS runs, stop it with 'echo quit | nvidia-cuda-mps-control'; look for holders from the host "
                f"itself ('gpuslate status' outside containers); as a last resort an administrator can reset the "
                f"GPU ('nvidia-smi --gpu-reset -i {r.index}') once nothing uses it: gpuslate never resets a GPU"))
        out.append(GpuDiagnosis(r.index, used, max_used, r.error, problems))
    return out


def _explain(p: HolderProcess, victim: VictimResult | None, spared: str | None,
             planned: set[int] | None) -> Problem:
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
    return problem(f"holds {format_size(p.used_memory)} ({p.kind})", "end it, or run 'gpuslate clear'")
