"""``park`` and ``resume``: a unit's GPU memory released while its processes live, proven by NVML,
and given back in seconds, proven again (docs/units.md, "Park and resume").

**Park** (:func:`park_loaded`, under the host lock): the way to park is chosen from the unit's spec
(``park``: level1, level2, checkpoint, none, auto) and what its own command and processes make
possible (:func:`choose`, pure: the engine's facts read from its command by
:func:`~gpuslate.engines.commands.read_park`, its CUDA processes, the host's memory); the guards
refuse before anything changes (the engine's start flag or environment missing, a level a known
hazard rules out, several CUDA processes for the driver's checkpoint, host memory that would not
hold what moves). Then, each phase written into the unit's record *before* its step
(:class:`~gpuslate.units.store.ParkRecord`): **draining** (a front holds new requests and those in
flight finish; the engine must report none running, bounded), **parking** (the engine's calls, or
the driver's lock and checkpoint of the one checked pid: cuda-checkpoint #41), then the proof
(:func:`~gpuslate.units.parkproof.prove_parked`: every process of the unit down to its method's
residue, every GPU as free as ``wait --free`` would call it but for the residues of parked units),
then **parked**. A park that did not free the memory, or that the engine or driver failed, is undone
(the unit serves again) unless its caller falls back to a cold stop (``swap --park``).

**Resume** (:func:`resume_loaded`): room on the unit's GPUs checked first (as ``up``'s pre-flight),
**resuming** recorded, the engine's resume calls (or the driver's restore and unlock, by the state
the driver reports), the memory proven back on the same GPUs, readiness, a warm-up completion, and
the reference answer (:mod:`.reference`): the same tokens for the fixed prompt as when the unit
first became ready, or the resume fails loudly and the unit is named **broken**.

A gpuslate killed at any point leaves a phase the next ``ps`` names (``interrupted``: the gpuslate
that wrote it is gone); ``resume`` ends it by what is true now (the driver's state, the memory NVML
shows), never by what the record meant, and ``down`` stops the unit as any other. Every call that
acts on the unit's processes (an engine's park and resume calls, the driver's lock, checkpoint,
restore, unlock) is written to the audit log before it is made.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from .._document import Fields, Malformed, checked, parse_json, reading
from .._parse import format_size
from ..engines.base import Park, ParkLevel, ParkReading, ParkStyle, RunningCheck
from ..engines.commands import read_park
from ..errors import CheckpointError, GpuslateError, UsageError
from ..gpu.types import CheckpointState, GpuReading, HostMemory, ProcessKind
from ..host.audit import new_run_id
from ..host.session import HostContext
from ..host.snapshot import take_snapshot
from ..options import ParkOptions, ParkWay, ResumeOptions
from ..outcome import Outcome, StatusEnum
from ..proc.procfs import PROC, ProcessId, is_alive, read_info, read_stat
from ..proc.terminate import Poller
from ..proc.tree import ProcTable
from . import reference, store
from .fence import read_environ
from .front import Front
from .frontreport import DrainReport, FrontReport, FrontState
from .lifecycle import phase_start
from .parkproof import GpuFigure, ParkMethod, ParkProof, ProcessFigure, host_memory_fits, prove_parked
from .readiness import Probe, http
from .spec import UnitSpec
from .state import ParkPhase, UnitState, unit_state
from .unit import Unit, load_units, parked_allowance

PARK_SCHEMA = "gpuslate.park.v1"
RESUME_SCHEMA = "gpuslate.resume.v1"
#: the most an answer of the engine's running check may take
_RUNNING_TIMEOUT = 2.0


class ParkStatus(StatusEnum):
    """How a ``park`` ended (the JSON ``status``)."""

    PARKED = "parked", Outcome.DONE  # proven: its GPU memory left, down to its method's residue
    ALREADY_PARKED = "already_parked", Outcome.DONE  # nothing to do
    REFUSED = "refused", Outcome.NOT_DONE  # a guard refused it before anything changed (the reason says which)
    NOT_FREED = "not_freed", Outcome.NOT_DONE  # the park ran, and NVML shows memory that did not leave
    FAILED = "failed", Outcome.FAILED  # the engine's park call or the driver refused or failed
    DIED = "died", Outcome.FAILED  # the server died while it was parked
    BROKEN = "broken", Outcome.FAILED  # it failed and could not be undone: the unit is named broken


class ResumeStatus(StatusEnum):
    """How a ``resume`` ended (the JSON ``status``)."""

    RESUMED = "resumed", Outcome.DONE  # memory back, serving, the same answer as before the park
    NOT_PARKED = "not_parked", Outcome.DONE  # it serves already: nothing to do
    NO_ROOM = "no_room", Outcome.NOT_DONE  # its GPUs lack the room for its memory: nothing done, still parked
    NOT_BACK = "not_back", Outcome.NOT_DONE  # its memory did not come back in time
    NOT_READY = "not_ready", Outcome.NOT_DONE  # it did not serve again in time
    FAILED = "failed", Outcome.FAILED  # the engine's resume or the driver's restore failed
    WRONG_ANSWER = "wrong_answer", Outcome.FAILED  # another answer than before the park: named broken
    DIED = "died", Outcome.FAILED  # the server died while it was resumed


# -- choosing how: pure -----------------------------------------------------------------------


class Choice(NamedTuple):
    """How a unit will be parked (``way`` None: it will not be, ``why`` says why)."""

    way: ParkWay | None
    level: ParkLevel | None  # the engine's level (None: the driver's checkpoint, or refused)
    why: str  # why this way, or why none
    moving: int = 0  # bytes that go into host memory (at most)


class Candidates(NamedTuple):
    """The facts :func:`choose` decides on, gathered once."""

    reading: ParkReading | None  # the engine's park, read from the unit's command (None: its engine has none)
    cuda: Mapping[int, Mapping[int, int]]  # pid -> gpu -> bytes: the unit's processes holding GPU memory
    checkpoint: str | None  # why the driver's checkpoint cannot be used here (None: it can)
    host: HostMemory | None


def choose(wanted: ParkWay, c: Candidates) -> Choice:
    """How to park: ``wanted`` (level1, level2, checkpoint), or with ``auto`` the first of them the
    facts allow, each refused with its reason: the engine's flag or environment missing, a level
    its command's flags do not give, a known hazard (vLLM #55013), several CUDA processes for the
    driver's checkpoint (cuda-checkpoint #27, #47), host memory that would not hold what moves.
    Total over every combination of facts (``hypothesis`` tests in tests/units/test_park.py)."""
    if wanted is ParkWay.NONE:
        return Choice(None, None, "its park setting is none")
    held = sum(b for gpus in c.cuda.values() for b in gpus.values())
    order = [wanted] if wanted is not ParkWay.AUTO else [ParkWay.LEVEL1, ParkWay.LEVEL2, ParkWay.CHECKPOINT]
    reasons: list[str] = []
    for way in order:
        got = _one(way, c, held)
        if isinstance(got, Choice):
            if wanted is ParkWay.AUTO:
                skipped = f" ({'; '.join(reasons)})" if reasons else ""
                got = got._replace(why=f"auto: {got.why}{skipped}")
            return got
        reasons.append(f"{way.value}: {got}")
    return Choice(None, None, "; ".join(reasons) if wanted is ParkWay.AUTO else reasons[0].partition(": ")[2])


def _one(way: ParkWay, c: Candidates, held: int) -> Choice | str:
    if way is ParkWay.CHECKPOINT:
        n = len(c.cuda)
        if n == 0:
            return "no process of the unit holds GPU memory"
        if n > 1:
            return (f"{n} CUDA processes: the driver's checkpoint is proven for one process only (multi-process "
                    "servers do not restore: cuda-checkpoint #27, #47; while one rank is locked its NCCL peers hang: "
                    "#30)")
        if c.checkpoint is not None:
            return c.checkpoint
        fit = host_memory_fits(held, c.host)
        return Choice(way, None, "the driver's checkpoint of its one CUDA process", held) if fit.fits else \
            f"host memory: {fit.why}"
    r = c.reading
    n = 1 if way is ParkWay.LEVEL1 else 2
    if r is None:
        return "its command is none whose engine parks (docs/engines.md)"
    if r.missing:
        return "; ".join(r.missing)
    found = next(((lv, h) for lv, h in r.levels if lv.level == n), None)
    if found is None:
        lv = r.park.level(n)
        if lv is None:
            return f"its engine has no level {n}"
        need = f"needs {lv.needs_flag}" if lv.needs_flag and lv.needs_flag not in r.flags else \
            f"not with {lv.not_with}" if lv.not_with else "not given"
        return f"level {n} {need}"
    lv, hazard = found
    if hazard is not None:
        other = "level 1 or a restart" if n == 2 else "a restart"
        return f"{hazard.why} ({hazard.source}): {other} instead"
    moving = held if lv.offloads else 0
    fit = host_memory_fits(moving, c.host)
    if not fit.fits:
        return f"host memory: {fit.why}"
    return Choice(way, lv, f"the engine's level {n} ({lv.frees})", moving)


def residue_of(way: ParkWay, park: Park | None, held: Mapping[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    """What each (pid, gpu) may keep once parked: nothing for the driver's checkpoint (the process
    leaves every GPU's list); for an engine's park, its context and what it keeps outside its pools,
    bounded by the engine's facts: at most ``residue_fraction`` of what it held, and ``residue_cap``."""
    if way is ParkWay.CHECKPOINT or park is None:
        return dict.fromkeys(held, 0)
    return {k: min(int(b * park.residue_fraction), park.residue_cap) for k, b in held.items()}


def count_running(check: RunningCheck, status: int, body: bytes) -> int | None:
    """The requests a running check's answer reports (None: it reports none we can read)."""
    if status != 200:
        return None
    if check.prometheus:
        total, seen = 0.0, False
        for line in body.decode("utf-8", "replace").splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in check.prometheus:
                try:
                    total += float(line.rsplit(" ", 1)[1])
                    seen = True
                except (ValueError, IndexError):
                    return None
        return int(total) if seen else None
    try:
        doc = parse_json(body)
    except ValueError:
        return None
    items = doc if isinstance(doc, list) else [doc]
    found = [x.get(k) for x in items if isinstance(x, dict) for k in check.keys if k in x]
    counts = [v for v in found if isinstance(v, int) and not isinstance(v, bool)]
    if not found or len(counts) != len(found):
        return None
    return sum(counts)


# -- results ----------------------------------------------------------------------------------


def proof_json(p: ParkProof) -> dict[str, Any]:
    return {"parked": p.parked, "problems": list(p.problems),
            "processes": [f._asdict() for f in p.processes], "gpus": [g._asdict() for g in p.gpus]}


def proof_from_json(d: object) -> ParkProof:
    """A proof of a document, field by field (a peer's document is never trusted)."""
    f = Fields(d)

    def process(x: object) -> ProcessFigure:
        g = Fields(x)
        return ProcessFigure(g.pid("pid"), g.gpu("gpu"), g.opt_size("before"), g.opt_size("after"), g.flag("listed"),
                             g.size("allowed"), g.flag("ok"))

    def gpu(x: object) -> GpuFigure:
        g = Fields(x)
        return GpuFigure(g.gpu("gpu"), g.opt_size("used"), g.size("kept"), g.size("max_used"), g.flag("ok"))

    return ParkProof(f.flag("parked"), tuple(f.items("processes", process)), tuple(f.items("gpus", gpu)),
                     tuple(f.texts("problems")))


def _object(v: object) -> dict[str, Any]:
    """An object kept as it is (figures shown, never acted on)."""
    return Fields(v).d


def _list(v: object, read: Callable[[object], dict[str, Any]]) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise Malformed(f"expected a list, not {type(v).__name__}")
    return [read(x) for x in v]


@dataclass(frozen=True, kw_only=True, slots=True)
class ParkResult:
    name: str
    status: ParkStatus
    method: str | None  # level1, level2, checkpoint (None: none chosen)
    why: str  # why this way (auto says what it passed over), or why none
    reason: str | None = None  # why it was refused or failed
    proof: ParkProof | None = None
    host_bytes: int | None = None  # what it holds in host memory once parked
    host: dict[str, Any] | None = None  # the host-memory guard's figures (moving, available, margin)
    drain: dict[str, Any] | None = None  # {front: DrainReport, running: N, seconds}
    undone: bool | None = None  # a failed park was undone: the unit serves again
    timings: dict[str, float]
    front: FrontReport | None = None

    @property
    def ok(self) -> bool:
        return self.status.outcome is Outcome.DONE

    def to_json(self) -> dict[str, Any]:
        return {"schema": PARK_SCHEMA, "ok": self.ok, "status": self.status.value, "name": self.name,
                "method": self.method, "why": self.why, "reason": self.reason,
                "proof": proof_json(self.proof) if self.proof is not None else None, "host_bytes": self.host_bytes,
                "host": self.host, "drain": self.drain, "undone": self.undone,
                "timings": {k: round(v, 4) for k, v in self.timings.items()},
                "front": self.front.to_json() if self.front is not None else None}

    @classmethod
    def from_json(cls, doc: object) -> ParkResult:
        """A ``gpuslate.park.v1`` document as the ParkResult it was."""
        f = Fields(checked(doc, PARK_SCHEMA))
        with reading(PARK_SCHEMA):
            method = f.opt_text("method")
            if method is not None and method not in store.PARK_METHODS:
                raise Malformed(f"method: expected one of {', '.join(store.PARK_METHODS)}")
            undone = f.raw("undone")
            if undone is not None and not isinstance(undone, bool):
                raise Malformed("undone: expected true, false or null")
            return cls(name=f.text("name"), status=f.choice("status", ParkStatus), method=method, why=f.text("why"),
                       reason=f.opt_text("reason"), proof=f.opt_record("proof", proof_from_json),
                       host_bytes=f.opt_size("host_bytes"), host=f.read("host", _object, optional=True),
                       drain=f.read("drain", _object, optional=True), undone=undone, timings=f.timings("timings"),
                       front=f.opt_record("front", FrontReport.from_json, default=None))


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeResult:
    name: str
    status: ResumeStatus
    method: str | None
    reason: str | None = None
    room: list[dict[str, Any]] | None = None  # per GPU: {gpu, need, free}
    back: list[dict[str, Any]] | None = None  # per process and GPU: {pid, gpu, before, now}
    readiness: dict[str, Any] | None = None  # {kind, detail}
    warmup: dict[str, Any] | None = None  # the smoke completion's {ok, latency_s, error}
    answer: dict[str, Any] | None = None  # {same, detail, text}: the reference prompt's answer
    timings: dict[str, float]
    front: FrontReport | None = None

    @property
    def ok(self) -> bool:
        return self.status.outcome is Outcome.DONE

    def to_json(self) -> dict[str, Any]:
        return {"schema": RESUME_SCHEMA, "ok": self.ok, "status": self.status.value, "name": self.name,
                "method": self.method, "reason": self.reason, "room": self.room, "back": self.back,
                "readiness": self.readiness, "warmup": self.warmup, "answer": self.answer,
                "timings": {k: round(v, 4) for k, v in self.timings.items()},
                "front": self.front.to_json() if self.front is not None else None}

    @classmethod
    def from_json(cls, doc: object) -> ResumeResult:
        """A ``gpuslate.resume.v1`` document as the ResumeResult it was."""
        f = Fields(checked(doc, RESUME_SCHEMA))
        with reading(RESUME_SCHEMA):
            method = f.opt_text("method")
            if method is not None and method not in store.PARK_METHODS:
                raise Malformed(f"method: expected one of {', '.join(store.PARK_METHODS)}")

            def room(x: object) -> dict[str, Any]:
                g = Fields(x)
                return {"gpu": g.gpu("gpu"), "need": g.size("need"), "free": g.opt_size("free")}

            def back(x: object) -> dict[str, Any]:
                g = Fields(x)
                return {"pid": g.pid("pid"), "gpu": g.gpu("gpu"), "before": g.size("before"), "now": g.size("now")}

            def answer(x: object) -> dict[str, Any]:
                g = Fields(x)
                same = g.raw("same")
                if same is not None and not isinstance(same, bool):
                    raise Malformed("same: expected true, false or null")
                return {"same": same, "detail": g.text("detail"), "text": g.opt_text("text")}

            return cls(name=f.text("name"), status=f.choice("status", ResumeStatus), method=method,
                       reason=f.opt_text("reason"), room=f.read("room", lambda v: _list(v, room), optional=True),
                       back=f.read("back", lambda v: _list(v, back), optional=True),
                       readiness=f.read("readiness", _object, optional=True),
                       warmup=f.read("warmup", _object, optional=True), answer=f.opt_record("answer", answer),
                       timings=f.timings("timings"), front=f.opt_record("front", FrontReport.from_json, default=None))


# -- the verbs --------------------------------------------------------------------------------


def park(host: HostContext, name: str, options: ParkOptions | None = None) -> ParkResult:
    """Park unit ``name`` (module docstring), under the host lock."""
    opts = (options or ParkOptions()).validate()
    t0 = time.monotonic()
    units = store.UnitStore.of(host)
    if not units.record_path(name).exists():
        raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
    with host.locked(f"park {name}") as waited:
        u = _loaded(units, name)
        return park_loaded(host, u, opts, lock_wait=waited, started=t0)


def resume(host: HostContext, name: str, options: ResumeOptions | None = None) -> ResumeResult:
    """Resume unit ``name`` (module docstring), under the host lock."""
    opts = (options or ResumeOptions()).validate()
    t0 = time.monotonic()
    units = store.UnitStore.of(host)
    if not units.record_path(name).exists():
        raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
    with host.locked(f"resume {name}") as waited:
        u = _loaded(units, name)
        return resume_loaded(host, u, opts, lock_wait=waited, started=t0)


def _loaded(units: store.UnitStore, name: str) -> Unit:
    u = Unit.load(units, name)
    if u is None:
        raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
    if u.record is None or u.spec is None:
        raise UsageError(u.describe_problem(), hint=f"'gpuslate down {name}' stops what is left of it")
    return u


def _me() -> list[int] | None:
    st = read_stat(os.getpid())
    return [os.getpid(), st.start_ticks] if st else None


def environment(pid: int, fallback: Mapping[str, str]) -> dict[str, str]:
    """``pid``'s environment as the kernel shows it (what its engine was started with); ``fallback``
    when it cannot be read."""
    raw = read_environ(pid)
    if raw is None:
        return dict(fallback)
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def cuda_holders(readings: Sequence[GpuReading], pids: set[int]) -> dict[int, dict[int, int]]:
    """pid -> gpu -> bytes, for the processes of ``pids`` holding GPU memory (not handles)."""
    out: dict[int, dict[int, int]] = {}
    for r in readings:
        for p in r.processes or []:
            if p.pid in pids and p.kind is not ProcessKind.HANDLE and (p.used_memory or 0) > 0:
                out.setdefault(p.pid, {})
                out[p.pid][r.index] = out[p.pid].get(r.index, 0) + (p.used_memory or 0)
    return out


def _kept(readings: Sequence[GpuReading], allowance: Mapping[tuple[int, int], int]) -> dict[int, int]:
    """gpu -> bytes the allowed residues of parked units take there now."""
    out: dict[int, int] = {}
    for r in readings:
        for p in r.processes or []:
            allowed = allowance.get((p.pid, r.index))
            if allowed is not None:
                out[r.index] = out.get(r.index, 0) + min(p.used_memory or 0, allowed)
    return out


class _Audit:
    """The audit log's lines for one park or resume: each call written before it is made."""

    def __init__(self, host: HostContext, action: str, u: Unit) -> None:
        self.host, self.action, self.u = host, action, u
        self.run_id = new_run_id()

    def before(self, what: str, pid: int) -> str:
        info = read_info(pid)
        target = {"pid": pid, "start_ticks": info.start_ticks if info else None, "name": info.name if info else None,
                  "unit": self.u.name, "command": info.command if info else None,
                  "user": info.user if info else None, "gpus": list(self.u.gpus)}
        return self.host.audit_log.before_signals(run_id=self.run_id, action=self.action, signal=what,
                                                  targets=[target], reason=f"{self.action} {self.u.name}")[0]

    def after(self, entry: str, error: str | None) -> None:
        self.host.audit_log.outcomes([(entry, "error" if error else "delivered", error)])


def _call(u: Unit, spec: UnitSpec, audit: _Audit, call: Any, timeout: float) -> str | None:
    """Make one of the engine's park or resume calls (audited first); None when it answered 200."""
    pid = u.record.pid  # type: ignore[union-attr]
    entry = audit.before(f"{call.method} {call.path}", pid)
    error = None
    try:
        status, body = http(call.method, spec.url(call.path), body=dict(call.body) if call.body is not None else None,
                            timeout=timeout)
        if status != 200:
            error = f"{call.method} {call.path} answered HTTP {status}: {body[:300].decode('utf-8', 'replace')}"
    except OSError as exc:
        error = f"{call.method} {call.path}: no answer ({exc})"
    audit.after(entry, error)
    return error


def _checked_pid(ident: ProcessId, u: Unit) -> None:
    """The pid the driver gets is a process of the unit, checked now: a live process with the start
    time recorded, a member of the unit, and a process itself (a thread's id would make the driver
    act on its whole process: cuda-checkpoint #41). Raises UsageError otherwise."""
    pid = ident.pid
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            tgid = next((int(line.split()[1]) for line in f.read(1 << 14).splitlines() if line.startswith(b"Tgid:")),
                        None)
    except (OSError, ValueError, IndexError):
        tgid = None
    if tgid != pid or not is_alive(ident) or pid not in {st.pid for st in u.members()}:
        raise UsageError(f"pid {pid} is no longer the unit {u.name}'s process it was (or is not a process): "
                         "the driver is not asked to act on it")


# -- park ---------------------------------------------------------------------------------------


def park_loaded(host: HostContext, u: Unit, opts: ParkOptions, *, lock_wait: float = 0.0,
                started: float | None = None, steer_front: bool = True, undo: bool = True) -> ParkResult:
    """``park``'s phases, under the host lock of ``host`` (which the caller holds), on ``u`` as
    loaded under it. ``steer_front``: hold and drain the unit's front here (``swap`` steers its own);
    ``undo``: a failed park is undone (``swap --park`` falls back to a cold stop instead)."""
    t0 = phase_start(host, "park_loaded", started)
    units = store.UnitStore.of(host)
    be = host.backend
    rec, spec = u.record, u.spec
    assert rec is not None and spec is not None
    name = u.name
    timings: dict[str, float] = {"lock_wait_s": lock_wait}

    def result(status: ParkStatus, **kw: Any) -> ParkResult:
        timings["total_s"] = time.monotonic() - t0
        return ParkResult(name=name, status=status, timings=timings, **kw)

    table = ProcTable()
    members = u.members(table)
    state = unit_state(u.facts(table, members))
    if state is UnitState.PARKED:
        return result(ParkStatus.ALREADY_PARKED, method=rec.park.method if rec.park else None, why="already parked")
    if state in (UnitState.PARKING, UnitState.RESUMING, UnitState.INTERRUPTED, UnitState.BROKEN):
        raise UsageError(f"unit {name} is {state.value}" + (f" ({rec.park.reason})" if rec.park and rec.park.reason
                                                            else ""),
                         hint=f"'gpuslate resume {name}' ends a park or resume that was cut short, 'gpuslate down "
                         f"{name}' stops it" if state is not UnitState.BROKEN else
                         f"'gpuslate restart {name}' or 'gpuslate down {name}'")
    if state is not UnitState.READY:
        raise UsageError(f"unit {name} is {state.value}: only a ready unit can be parked")
    by_pid = {st.pid: st for st in members}
    before = be.read(None, full=False)
    cuda = cuda_holders(before, set(by_pid))
    env = environment(rec.pid, spec.env)
    r = read_park(spec.command, env)
    checkpoint_why = _checkpoint_why(host, cuda) if len(cuda) == 1 else None
    wanted = opts.method if opts.method is not None else spec.park
    choice = choose(ParkWay(wanted), Candidates(r, cuda, checkpoint_why, be.host_memory()))
    if choice.way is None:
        return result(ParkStatus.REFUSED, method=None, why=choice.why, reason=f"unit {name} cannot be parked: "
                      f"{choice.why}")
    way = choice.way
    host_fit = host_memory_fits(choice.moving, be.host_memory())
    host_doc = {"moving": host_fit.moving, "available": host_fit.available, "margin": host_fit.margin,
                "why": host_fit.why}
    if rec.reference is None and spec.port is not None:  # its first park: the answer to give again, asked now
        t_ref = time.monotonic()
        got = reference.take(spec, timeout=max(1.0, min(60.0, opts.timeout)))
        timings["reference_s"] = time.monotonic() - t_ref
        if isinstance(got, str):
            return result(ParkStatus.REFUSED, method=way.value, why=choice.why, host=host_doc,
                          reason=f"{got}: a resume could not be proven to give the same answer")
        rec.reference = got
    held = {(pid, gpu): b for pid, gpus in cuda.items() for gpu, b in gpus.items()}
    park_facts = r.park if r is not None else None
    residue = residue_of(way, park_facts, held)
    idents = [by_pid[pid].ident for pid in sorted(cuda)]
    front = Front.of_unit(host, name) if steer_front else None
    if front is not None and not (front.record.unit == name and front.running() and front.admin.alive()):
        front = None
    rec.park = store.ParkRecord(method=way.value, phase=ParkPhase.DRAINING, since=time.time(), by=_me(),
                                pids=[[i.pid, i.start_ticks] for i in idents],
                                held=[[p, g, b] for (p, g), b in sorted(held.items())],
                                residue=[[p, g, b] for (p, g), b in sorted(residue.items())],
                                front=front.record.address if front is not None else None, started_at=time.time())
    units.save(rec)  # from here a gpuslate killed leaves a phase ps names

    meter = None
    drain_doc: dict[str, Any] = {}
    t_drain = time.monotonic()
    if front is not None:
        meter = front.hold(f"park {name}", name)
        drain_doc["front"] = front.drain(opts.drain_timeout).to_json()
    running = _drain_engine(spec, park_facts, t_drain + opts.drain_timeout) if park_facts is not None else None
    drain_doc.update(running=running, seconds=round(time.monotonic() - t_drain, 4))
    timings["drain_s"] = time.monotonic() - t_drain
    fr: FrontReport | None = None

    def give_back(why: str) -> FrontReport | None:
        """The park did not happen (or was undone): the front routes to the unit again."""
        if front is None:
            return None
        hold = front.route(spec, meter)
        return FrontReport(address=front.record.address, state=FrontState.SERVING, unit=name, hold=hold,
                           drain=_drain_of(drain_doc), note=why)

    # an engine's park with requests in flight faults; the driver's lock waits for the work submitted
    if park_facts is not None and ((running is None and choice.level is not None) or (running or 0) > 0):
        rec.park = None
        units.save(rec)
        why = (f"{running} request{'s' if running != 1 else ''} still running after the {opts.drain_timeout:g} s "
               "drain" if running is not None else "its engine does not say how many requests run")
        return result(ParkStatus.REFUSED, method=way.value, why=choice.why, host=host_doc, drain=drain_doc,
                      reason=f"{why}: a park with requests in flight faults (vLLM #28714) or kills the server "
                      "(SGLang's release asserts that none runs)", front=give_back(why))

    rec.park = replace(rec.park, phase=ParkPhase.PARKING, since=time.time())
    units.save(rec)
    audit = _Audit(host, "park", u)
    model_path = r.model_path if r is not None else None
    host_before = be.host_memory()
    t_park = time.monotonic()
    error = None
    try:
        if choice.level is not None:
            for call in choice.level.park:
                error = _call(u, spec, audit, call.filled(level=choice.level.level, model_path=model_path),
                              opts.timeout)
                if error:
                    break
        else:
            ident = idents[0]
            _checked_pid(ident, u)
            lock_ms = int(opts.timeout * 1000)
            calls: tuple[tuple[str, Callable[[], None]], ...] = (
                ("checkpoint lock", lambda: be.checkpoint_lock(ident.pid, timeout_ms=lock_ms)),
                ("checkpoint", lambda: be.checkpoint(ident.pid)))
            for what, act in calls:
                entry = audit.before(what, ident.pid)
                try:
                    act()
                except CheckpointError as exc:
                    audit.after(entry, f"{exc.driver_code}: {exc}")
                    raise
                audit.after(entry, None)
    except CheckpointError as exc:
        error = f"the driver refused ({exc.driver_code}): {exc}"
    timings["park_s"] = time.monotonic() - t_park
    main = ProcessId(rec.pid, rec.start_ticks)
    proof = None
    if error is None:
        t_prove = time.monotonic()
        proof = _prove(host, u, before, idents, way, residue, opts, main)
        timings["prove_s"] = time.monotonic() - t_prove
    alive = is_alive(main) and all(is_alive(i) for i in idents)
    if not alive:
        return result(ParkStatus.DIED, method=way.value, why=choice.why, host=host_doc, drain=drain_doc,
                      proof=proof, reason=f"the server died while it was parked ({error or 'after its park call'}): "
                      f"see 'gpuslate logs {name}'", front=_refuse(front, meter, f"{name} died while parked",
                                                                  name, drain_doc))
    if error is None and proof is not None and proof.parked:
        after_host = be.host_memory()
        moved = (max(0, host_before.available - after_host.available) if host_before and after_host else None) \
            if choice.moving else 0
        rec.park = replace(rec.park, phase=ParkPhase.PARKED, since=time.time(), by=None, host_bytes=moved)
        units.save(rec)
        if front is not None:
            fr = _refuse(front, meter, f"unit {name} is parked: 'gpuslate resume {name}' serves it again", name,
                         drain_doc)
        return result(ParkStatus.PARKED, method=way.value, why=choice.why, proof=proof, host_bytes=moved,
                      host=host_doc, drain=drain_doc, front=fr)
    status = ParkStatus.FAILED if error is not None else ParkStatus.NOT_FREED
    reason = error or ("its memory did not leave within "
                       f"{opts.timeout:g} s: " + "; ".join(proof.problems if proof else ()))
    if not undo:
        rec.park = replace(rec.park, reason=reason, by=None)
        units.save(rec)
        return result(status, method=way.value, why=choice.why, proof=proof, reason=reason, host=host_doc,
                      drain=drain_doc, undone=False)
    back = _undo(host, u, way, choice.level, r, audit, opts)
    if back is None:  # serving again
        rec.park = None
        units.save(rec)
        return result(status, method=way.value, why=choice.why, proof=proof, reason=reason, host=host_doc,
                      drain=drain_doc, undone=True, front=give_back(reason))
    rec.park = replace(rec.park, phase=ParkPhase.BROKEN, by=None, reason=f"{reason}; undoing it failed: {back}")
    units.save(rec)
    return result(ParkStatus.BROKEN, method=way.value, why=choice.why, proof=proof, host=host_doc, drain=drain_doc,
                  reason=rec.park.reason, undone=False,
                  front=_refuse(front, meter, f"unit {name} is broken: {reason}", name, drain_doc))


def _drain_of(doc: Mapping[str, Any]) -> DrainReport | None:
    d = doc.get("front")
    return DrainReport.from_json(d) if isinstance(d, dict) else None


def _refuse(front: Front | None, meter: Any, why: str, name: str, drain_doc: Mapping[str, Any]) -> FrontReport | None:
    if front is None:
        return None
    hold = front.refuse(why, meter, name)
    return FrontReport(address=front.record.address, state=FrontState.REFUSING, unit=name, hold=hold,
                       drain=_drain_of(drain_doc), note=why)


def _checkpoint_why(host: HostContext, cuda: Mapping[int, Mapping[int, int]]) -> str | None:
    """Why the driver's checkpoint cannot be used for the one CUDA process (None: it can: the
    driver reports it running)."""
    pid = next(iter(cuda))
    try:
        state = host.backend.checkpoint_state(pid)
    except (CheckpointError, GpuslateError) as exc:
        code = f" ({exc.driver_code})" if isinstance(exc, CheckpointError) else ""
        return f"the driver's checkpoint cannot be used{code}: {exc}"
    if state is not CheckpointState.RUNNING:
        return f"the driver reports pid {pid} {state.value}, not running"
    return None


def _drain_engine(spec: UnitSpec, park: Park, deadline: float) -> int | None:
    """Wait until the engine reports no request running or waiting, at most until ``deadline``:
    how many it reports then (None: it reports none we can read)."""
    poll = Poller(first=0.005, cap=0.05)
    check = park.running
    while True:
        try:
            status, body = http(check.call.method, spec.url(check.call.path), timeout=_RUNNING_TIMEOUT)
            n = count_running(check, status, body)
        except OSError:
            n = None
        if n is None or n == 0 or time.monotonic() >= deadline:  # None: it does not say (and will not)
            return n
        poll.sleep(deadline)


def _prove(host: HostContext, u: Unit, before: Sequence[GpuReading], idents: Sequence[ProcessId], way: ParkWay,
           residue: Mapping[tuple[int, int], int], opts: ParkOptions, main: ProcessId) -> ParkProof:
    """NVML's readings until the park is proven, or ``opts.timeout`` ran out (an engine's release may
    answer before the memory is free), or a process of it died: the last verdict."""
    be = host.backend
    limit = host.max_used(opts.max_used)
    gpus = sorted(set(u.gpus) | {g for _, g in residue})
    others = parked_allowance(load_units(store.UnitStore.of(host)), ProcTable(), but=u.name)
    daemons = {g.index: sum(h.bytes for h in g.baseline()) for g in take_snapshot(be, gpus).gpus}
    method = ParkMethod.CHECKPOINT if way is ParkWay.CHECKPOINT else ParkMethod.ENGINE
    pids = [i.pid for i in idents]
    deadline = time.monotonic() + opts.timeout
    poll = Poller(first=0.002, cap=0.02)
    while True:
        after = be.read(None, full=False)
        kept = _kept(after, others)
        baseline = {g: daemons.get(g, 0) + kept.get(g, 0) for g in set(daemons) | set(kept)}
        proof = prove_parked(before, after, pids, gpus, method, residue=residue, max_used=limit, baseline=baseline)
        if proof.parked or time.monotonic() >= deadline or not is_alive(main):
            return proof
        poll.sleep(deadline)


def _undo(host: HostContext, u: Unit, way: ParkWay, level: ParkLevel | None, r: ParkReading | None, audit: _Audit,
          opts: ParkOptions) -> str | None:
    """A failed park undone: the engine's resume calls, or the driver's restore and unlock by the
    state it reports. None once the unit serves again, else why it does not."""
    spec = u.spec
    assert spec is not None and u.record is not None
    model_path = r.model_path if r is not None else None
    if level is not None:
        if r is not None and r.park.style is ParkStyle.RELEASE and not _released(host, u):
            return None  # nothing was released: resuming a tag not released would kill the server (KeyError)
        for call in level.resume:
            error = _call(u, spec, audit, call.filled(level=level.level, model_path=model_path), opts.timeout)
            if error:
                return error
    else:
        error = _restore(host, u, audit)
        if error:
            return error
    probe = Probe(spec, Path(u.record.log))
    deadline = time.monotonic() + max(opts.timeout, 5.0)
    poll = Poller(first=0.005, cap=0.05)
    while not probe.check(timeout=2.0):
        if time.monotonic() >= deadline:
            return f"not ready again after the undo ({probe.detail})"
        poll.sleep(deadline)
    return None


def _released(host: HostContext, u: Unit) -> bool:
    """Whether any process of a parked (or interrupted) unit holds less than it held before, by more
    than it may keep: NVML's word on whether the engine released anything."""
    pr = u.record.park if u.record else None
    if pr is None:
        return False
    now = cuda_holders(host.backend.read(None, full=False), {p for p, _ in pr.pids})
    allowed = {(p, g): b for p, g, b in pr.residue}
    return any(now.get(p, {}).get(g, 0) < b - allowed.get((p, g), 0) for p, g, b in pr.held)


def _restore(host: HostContext, u: Unit, audit: _Audit) -> str | None:
    """The driver's restore and unlock of each parked process, by the state it reports now (a park
    cut short may have left it locked, or checkpointed); None when each runs again."""
    pr = u.record.park if u.record else None
    assert pr is not None
    be = host.backend
    for pid, ticks in pr.pids:
        ident = ProcessId(pid, ticks)
        try:
            _checked_pid(ident, u)
            state = be.checkpoint_state(pid)
            if state is CheckpointState.FAILED:
                return (f"pid {pid}'s CUDA state failed in its checkpoint (CU_PROCESS_STATE_FAILED): it can no "
                        "longer use the GPU; only its end frees what it holds")
            steps: list[tuple[str, Callable[[int], None]]] = []
            if state is CheckpointState.CHECKPOINTED:
                steps.append(("checkpoint restore", be.checkpoint_restore))
            if state in (CheckpointState.CHECKPOINTED, CheckpointState.LOCKED):
                steps.append(("checkpoint unlock", be.checkpoint_unlock))
            for what, act in steps:
                entry = audit.before(what, pid)
                try:
                    act(pid)
                except CheckpointError as exc:
                    audit.after(entry, f"{exc.driver_code}: {exc}")
                    return f"the driver refused the {what} of pid {pid} ({exc.driver_code}): {exc}"
                audit.after(entry, None)
        except UsageError as exc:
            return str(exc)
    return None


# -- resume -------------------------------------------------------------------------------------


def resume_loaded(host: HostContext, u: Unit, opts: ResumeOptions, *, lock_wait: float = 0.0,
                  started: float | None = None, steer_front: bool = True) -> ResumeResult:
    """``resume``'s phases, under the host lock of ``host`` (which the caller holds), on ``u`` as
    loaded under it. ``steer_front``: route the unit's front to it once it serves (``swap`` routes
    its own)."""
    t0 = phase_start(host, "resume_loaded", started)
    units = store.UnitStore.of(host)
    be = host.backend
    rec, spec = u.record, u.spec
    assert rec is not None and spec is not None
    name = u.name
    timings: dict[str, float] = {"lock_wait_s": lock_wait}
    pr = rec.park

    def result(status: ResumeStatus, **kw: Any) -> ResumeResult:
        timings["total_s"] = time.monotonic() - t0
        return ResumeResult(name=name, status=status, method=pr.method if pr else None, timings=timings, **kw)

    table = ProcTable()
    members = u.members(table)
    state = unit_state(u.facts(table, members))
    if pr is None:
        if state is UnitState.READY:
            return result(ResumeStatus.NOT_PARKED, reason="it is not parked: it serves")
        raise UsageError(f"unit {name} is {state.value}, not parked")
    if state in (UnitState.PARKING, UnitState.RESUMING):
        by = pr.by[0] if pr.by else "?"
        raise UsageError(f"unit {name} is {state.value} (gpuslate pid {by}): wait for it, or stop that gpuslate")
    if state is UnitState.BROKEN:
        raise UsageError(f"unit {name} is broken: {pr.reason}",
                         hint=f"'gpuslate restart {name}' starts it again as it last ran, 'gpuslate down {name}' "
                         "stops it")
    if state not in (UnitState.PARKED, UnitState.INTERRUPTED):
        raise UsageError(f"unit {name} is {state.value}: its server is gone",
                         hint=f"'gpuslate down {name}' cleans up what is left of it")
    way = ParkWay(pr.method)
    front = Front.of_unit(host, name) if steer_front else None
    if front is not None and not (front.running() and front.admin.alive()
                                  and name in (front.record.unit, front.record.next)):
        front = None
    if pr.phase is ParkPhase.DRAINING:  # cut short before anything was parked: give it back its clients
        rec.park = None
        units.save(rec)
        return result(ResumeStatus.RESUMED, reason="its park was cut short while draining: nothing had been parked",
                      front=_route(front, spec, name))
    before = be.read(None, full=False)
    now = cuda_holders(before, {p for p, _ in pr.pids})
    need: dict[int, int] = {}
    for pid, gpu, b in pr.held:
        need[gpu] = need.get(gpu, 0) + max(0, b - now.get(pid, {}).get(gpu, 0))
    room = []
    short = []
    for g in before:
        if g.index not in need:
            continue
        free = g.memory.free if g.memory is not None else None
        room.append({"gpu": g.index, "need": need[g.index], "free": free})
        if free is None or free < need[g.index]:
            short.append(f"GPU {g.index}: needs {format_size(need[g.index])}, "
                         + (f"{format_size(free)} free" if free is not None else "its memory unknown"))
    if short:
        return result(ResumeStatus.NO_ROOM, room=room, reason=f"no room to resume unit {name}: " + "; ".join(short)
                      + " (stop or park what holds its GPUs first: 'gpuslate status')")
    timings["room_s"] = time.monotonic() - t0
    rec.park = replace(pr, phase=ParkPhase.RESUMING, since=time.time(), by=_me())
    units.save(rec)
    audit = _Audit(host, "resume", u)
    env = environment(rec.pid, spec.env)
    r = read_park(spec.command, env)
    model_path = r.model_path if r is not None else None
    t_call = time.monotonic()
    error = None
    if way is ParkWay.CHECKPOINT:
        error = _restore(host, u, audit)
    else:
        level = r.park.level(1 if way is ParkWay.LEVEL1 else 2) if r is not None else None
        if level is None:
            error = f"its command no longer reads as one its engine parks at {way.value}"
        else:
            calls = level.resume
            if r is not None and r.park.style is ParkStyle.RELEASE and not _released(host, u):
                # nothing is released (a park cut short before its release, or a resume after its resume
                # call): resuming a tag not released would kill it (KeyError); the weights still loaded again
                calls = tuple(c for c in calls if c.route != level.resume[0].route)
            for call in calls:
                error = _call(u, spec, audit, call.filled(level=level.level, model_path=model_path),
                              opts.timeout or spec.start_timeout)
                if error:
                    break
    timings["resume_s"] = time.monotonic() - t_call
    main = ProcessId(rec.pid, rec.start_ticks)
    if not is_alive(main):
        return result(ResumeStatus.DIED, reason=f"the server died while it was resumed ({error or 'after its calls'}): "
                      f"see 'gpuslate logs {name}'")
    if error is not None:
        broken = "CU_PROCESS_STATE_FAILED" in error
        rec.park = replace(rec.park, phase=ParkPhase.BROKEN if broken else ParkPhase.PARKED, by=None,
                           reason=f"resume failed: {error}")
        units.save(rec)
        return result(ResumeStatus.FAILED, room=room, reason=error)
    limit_s = opts.timeout if opts.timeout is not None else spec.start_timeout
    deadline = time.monotonic() + limit_s
    t_back = time.monotonic()
    back, figures = _await_back(host, pr, deadline)
    timings["back_s"] = time.monotonic() - t_back
    if not back:
        rec.park = replace(rec.park, phase=ParkPhase.PARKED, by=None, reason="its memory did not come back in time")
        units.save(rec)
        return result(ResumeStatus.NOT_BACK, room=room, back=figures,
                      reason=f"its memory did not come back on its GPUs within {limit_s:g} s")
    t_ready = time.monotonic()
    probe = Probe(spec, Path(rec.log))
    poll = Poller(first=0.002, cap=0.02)
    while not probe.check(timeout=max(0.05, min(5.0, deadline - time.monotonic()))):
        if not is_alive(main):
            return result(ResumeStatus.DIED, reason=f"the server died after its memory came back: see 'gpuslate logs "
                          f"{name}'", back=figures)
        if time.monotonic() >= deadline:
            rec.park = replace(rec.park, phase=ParkPhase.BROKEN, by=None,
                               reason=f"not serving after its resume ({probe.detail})")
            units.save(rec)
            return result(ResumeStatus.NOT_READY, room=room, back=figures, reason=rec.park.reason,
                          readiness={"kind": probe.kind, "detail": probe.detail})
        poll.sleep(deadline)
    timings["ready_s"] = time.monotonic() - t_ready
    readiness = {"kind": probe.kind, "detail": probe.detail}
    warm: dict[str, Any] = {"ok": True, "latency_s": 0.0, "error": None}
    same, detail = True, "a unit without a port: its memory back and its readiness are what is proven"
    answer: dict[str, Any] = {"same": None, "detail": detail, "text": None}
    if spec.port is not None:
        t_warm = time.monotonic()
        warm = reference.warm_up(spec, rec.reference, timeout=max(1.0, min(60.0, deadline - time.monotonic())))
        timings["warmup_s"] = time.monotonic() - t_warm
        t_ref = time.monotonic()
        if rec.reference is not None:
            same, detail, got = reference.compare(spec, rec.reference,
                                                  timeout=max(1.0, min(60.0, deadline - time.monotonic())))
            answer = {"same": same, "detail": detail, "text": got["text"] if got else None}
        else:
            answer = {"same": None, "detail": "no reference answer was recorded", "text": None}
        timings["reference_s"] = time.monotonic() - t_ref
    if not is_alive(main):
        return result(ResumeStatus.DIED, room=room, back=figures, readiness=readiness, warmup=warm, answer=answer,
                      reason=f"the server died at its first requests after the resume (a known fault: vLLM #55013?): "
                      f"see 'gpuslate logs {name}'")
    if not same or not warm["ok"]:
        why = detail if not same else f"the warm-up completion failed: {warm['error']}"
        rec.park = replace(rec.park, phase=ParkPhase.BROKEN, by=None, reason=f"resumed wrong: {why}")
        units.save(rec)
        return result(ResumeStatus.WRONG_ANSWER, room=room, back=figures, readiness=readiness, warmup=warm,
                      answer=answer, reason=why)
    rec.park = None
    units.save(rec)
    return result(ResumeStatus.RESUMED, room=room, back=figures, readiness=readiness, warmup=warm, answer=answer,
                  front=_route(front, spec, name))


def _route(front: Front | None, spec: UnitSpec, name: str) -> FrontReport | None:
    if front is None:
        return None
    hold = front.route(spec, None)
    return FrontReport(address=front.record.address, state=FrontState.SERVING, unit=name, hold=hold)


def _await_back(host: HostContext, pr: store.ParkRecord, deadline: float) -> tuple[bool, list[dict[str, Any]]]:
    """Until every (pid, gpu) holds again at least what it held before, less what the park let it
    keep (the memory back on the same GPUs), or ``deadline``: whether it did, and the figures."""
    allowed = {(p, g): b for p, g, b in pr.residue}
    poll = Poller(first=0.002, cap=0.02)
    while True:
        now = cuda_holders(host.backend.read(None, full=False), {p for p, _ in pr.pids})
        figures = [{"pid": p, "gpu": g, "before": b, "now": now.get(p, {}).get(g, 0)} for p, g, b in pr.held]
        back = all(f["now"] >= f["before"] - allowed.get((f["pid"], f["gpu"]), 0) for f in figures)
        if back or time.monotonic() >= deadline:
            return back, figures
        poll.sleep(deadline)
