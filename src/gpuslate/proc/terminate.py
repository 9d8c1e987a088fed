"""SIGTERM, grace, SIGKILL: the termination engine shared by ``clear`` and ``down``.

Every signal is written to the audit log before it is sent; the identity of
each process is checked at the moment of each signal (see :mod:`.signals`);
a caller's *gate* (``clear``'s act-time gate, :mod:`gpuslate.clearing.gate`) is
asked right before each signal phase which victims must not be signaled now,
and those are refused for the rest of the run, in the result and the audit log.
The run is a sequence of phases (:func:`send`, :func:`wait_phase`, :func:`kill_phase`), each
told the victims it acts on and answering, in ``psutil.wait_procs``'s shape, which of them are
gone and which alive. Waiting sleeps on the victims' pidfds and wakes at each exit, the moment the
last thread of a process is gone (where pidfds are missing, it polls /proc
with an adaptive interval): no fixed sleeps, and no CPU spent while waiting.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .._document import MAX_ID, Fields
from ..errors import PermissionDenied
from .procfs import ProcessId
from .signals import (
    DELIVERED,
    NOT_RUNNING,
    PERMISSION_DENIED,
    PID_REUSED,
    ExitWatch,
    is_gone,
    reap_if_child,
    send_signal,
)


class SignalAudit(Protocol):
    """Where every signal is written before it is sent: :class:`gpuslate.host.audit.AuditLog`.

    A protocol rather than an import, so that ``proc/`` (processes and signals)
    stays below ``host/`` (which builds on it) and the packages form no loop."""

    def before_signals(self, *, run_id: str, action: str, signal: str, targets: list[dict[str, Any]],
                       reason: str | None = None) -> list[str]: ...

    def outcomes(self, results: list[tuple[str, str, str | None]]) -> None: ...


class Victim(NamedTuple):
    """A process to terminate. ``info`` describes it for the audit log and reports
    (pid, start_ticks, user, command, gpus, used_memory, container ...)."""

    ident: ProcessId
    info: dict[str, Any]
    #: why SIGTERM will provably do nothing (SIG_IGN, a namespace's init without a handler), or None
    ignores_sigterm: str | None = None
    #: the job it belongs to, for reports
    job: int | None = None
    #: pids of the victims it started: one that ignores SIGTERM is SIGKILLed as soon as they have
    #: exited (a namespace's init takes its whole namespace with it when it dies)
    waits_for: tuple[int, ...] = ()


#: the gate: (signal, the victims about to receive it, the processes the run means to end) ->
#: {pid: why it must not be signaled}
Gate = Callable[[int, list[ProcessId], set[ProcessId]], dict[int, str]]
REFUSED = "refused"


class SignalRecord(NamedTuple):
    signal: str
    at: float  # seconds after the termination started
    outcome: str

    def to_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "at_s": round(self.at, 4), "outcome": self.outcome}

    @classmethod
    def from_json(cls, d: object) -> SignalRecord:
        f = Fields(d)
        return cls(f.text("signal"), f.seconds("at_s"), f.text("outcome"))


#: the fields of a victim's ``info`` that reports read back from a document, and how each is checked
_INFO = {"pid": "pid", "start_ticks": "ticks", "user": "text", "uid": "id", "command": "text", "name": "text",
         "gpus": "gpus", "used_memory": "size", "role": "text", "job": "pid", "container": "text", "unit": "text",
         "pgid": "id", "sid": "id", "cgroup": "text"}


def victim_info(d: dict[str, Any]) -> dict[str, Any]:
    """A victim's ``info`` read back from a document: its known fields checked (each may be null),
    the others (a newer gpuslate's) kept as they are, never read."""
    f = Fields(d)
    read: dict[str, Callable[[str], Any]] = {
        "pid": f.opt_pid, "ticks": lambda k: f.opt_integer(k, 0), "text": f.opt_text,
        "id": lambda k: f.opt_integer(k, 0, MAX_ID), "size": f.opt_size,
        "gpus": lambda k: None if f.raw(k) is None else f.gpus(k)}
    return {k: (read[_INFO[k]](k) if k in _INFO else v) for k, v in d.items()}


class VictimResult:
    """What happened to one victim."""

    def __init__(self, victim: Victim) -> None:
        self.victim = victim
        self.signals: list[SignalRecord] = []
        self.exited_at: float | None = None  # seconds after start; None: still running
        self.ended_by: str | None = None  # SIGTERM | SIGKILL | gone (before any signal) | pid_reused
        self.permission_denied = False
        self.refused: str | None = None  # why the act-time gate did not let it be signaled

    @property
    def alive(self) -> bool:
        """Still to be waited for: running, signalable, and not refused by the gate."""
        return self.exited_at is None and not self.permission_denied and self.refused is None

    def outcome_json(self) -> dict[str, Any]:
        return {"signals": [s.to_json() for s in self.signals],
                "exited_at_s": round(self.exited_at, 4) if self.exited_at is not None else None,
                "ended_by": self.ended_by, "permission_denied": self.permission_denied,
                "refused": self.refused}

    def to_json(self) -> dict[str, Any]:
        return {**self.victim.info, **self.outcome_json()}

    @classmethod
    def from_json(cls, d: object, info: dict[str, Any] | None = None) -> VictimResult:
        """A victim's result from its document (:meth:`to_json`, or :meth:`outcome_json` with the
        victim's ``info`` apart); every field it is read for checked (the info's too: what reports
        show of it)."""
        f = Fields(d)
        outcome = ("signals", "exited_at_s", "ended_by", "permission_denied", "refused")
        if info is None:
            info = victim_info({k: v for k, v in f.d.items() if k not in outcome})
        r = cls(Victim(ident=ProcessId(f.pid("pid"), f.opt_integer("start_ticks", 0, default=None) or 0), info=info))
        r.signals = f.items("signals", SignalRecord.from_json)
        r.exited_at, r.ended_by = f.opt_seconds("exited_at_s"), f.opt_text("ended_by")
        r.permission_denied, r.refused = f.flag("permission_denied"), f.opt_text("refused")
        return r

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VictimResult) and (self.victim, self.signals, self.exited_at, self.ended_by,
                                                    self.permission_denied, self.refused) == \
            (other.victim, other.signals, other.exited_at, other.ended_by, other.permission_denied, other.refused)

    __hash__ = None  # type: ignore[assignment]


class Poller:
    """Adaptive polling: starts at ``first`` seconds and backs off to ``cap``;
    after ``patient_after`` seconds the cap rises to ``late_cap``.

    Teardowns usually end within a second, and each poll is cheap (a /proc
    read, or NVML's memory and process query: about 0.1 ms), so the first
    seconds poll every few milliseconds to see the end as it happens; a long
    wait (another user's job, a stuck process) then costs almost no CPU.
    """

    def __init__(self, first: float = 0.001, cap: float = 0.005, *, patient_after: float = 2.0,
                 late_cap: float = 0.05) -> None:
        self.delay = first
        self.cap = cap
        self.late_cap = late_cap
        self.patient_at = time.monotonic() + patient_after

    def next_delay(self) -> float:
        """The delay :meth:`sleep` would sleep now, and back off as if it had."""
        d = self.delay
        cap = self.cap if time.monotonic() < self.patient_at else self.late_cap
        self.delay = min(cap, self.delay * 1.5)
        return d

    def sleep(self, deadline: float | None = None) -> None:
        d = self.next_delay()
        if deadline is not None:
            d = max(0.0, min(d, deadline - time.monotonic()))
        time.sleep(d)


def terminate(
    victims: list[Victim], *, grace: float, kill_wait: float, action: str, run_id: str,
    audit: SignalAudit | None, on_event: Callable[[str], None] | None = None,
    clock_start: float | None = None, discover: Callable[[list[Victim]], list[Victim]] | None = None,
    discover_every: float = 0.05, gate: Gate | None = None, more: bool = False,
) -> list[VictimResult]:
    """Terminate every victim: SIGTERM to all at once, wait up to ``grace`` seconds,
    SIGKILL the survivors, wait up to ``kill_wait`` seconds more.

    A victim that provably ignores SIGTERM is SIGKILLed as soon as the victims
    it started have exited, not after the whole grace. ``discover``,
    called every ``discover_every`` seconds while waiting, returns processes the
    victims started since (a job forking while it stops); they are signaled with
    the phase's signal and reported. Processes that cannot be signaled
    (permission) are recorded and skipped; the others proceed. Returns one result
    per victim, in order, then the discovered ones. ``gate``, when given, is asked
    before each phase which of its victims must not be signaled (see the module doc).
    ``more``: a later round of the same stop (what a unit started meanwhile), said as such in the
    progress line ("SIGTERM sent to 2 more processes"), so that the counts add up to the report's.
    """
    t0 = clock_start if clock_start is not None else time.monotonic()
    results = [VictimResult(v) for v in victims]
    alive = [r for r in results if r.alive]
    if not alive:
        return results
    run = _Run(results, t0=t0, action=action, run_id=run_id, audit=audit, note=on_event or (lambda _m: None),
               discover=discover, discover_every=discover_every, gate=gate)
    try:
        _, alive = send(run, signal.SIGTERM, alive)
        sent = _processes(sum(1 for r in alive if r.signals[-1].outcome == DELIVERED), more=more)
        run.note(f"SIGTERM sent to {sent}")
        _, survivors = wait_phase(run, alive, time.monotonic() + grace, signal.SIGTERM)
        survivors += [r for r in adopt(run, signal.SIGTERM) if r not in survivors]
        if survivors:
            kill_phase(run, survivors, grace=grace, kill_wait=kill_wait)
        late = adopt(run, signal.SIGKILL)
        if late:
            wait_phase(run, late, time.monotonic() + kill_wait, signal.SIGKILL)
    finally:
        run.watch.close()
    return run.results


class _Run:
    """What the phases of one :func:`terminate` share: its victims' results (the discovered ones
    appended), its clock, where each signal is audited, the gate, the fork watch, and the pidfds
    (:class:`~.signals.ExitWatch`) the waits sleep on. The phases below take it and say, as
    ``psutil.wait_procs`` does, which of the victims they were given are gone and which alive."""

    def __init__(self, results: list[VictimResult], *, t0: float, action: str, run_id: str,
                 audit: SignalAudit | None, note: Callable[[str], None],
                 discover: Callable[[list[Victim]], list[Victim]] | None, discover_every: float,
                 gate: Gate | None) -> None:
        self.results = results
        self.t0 = t0
        self.action = action
        self.run_id = run_id
        self.audit = audit
        self.note = note
        self.discover = discover
        self.discover_every = discover_every
        self.gate = gate
        self.watch = ExitWatch()  # one pidfd per victim, so that waiting wakes at each exit

    def since(self) -> float:
        return time.monotonic() - self.t0


Split = tuple[list[VictimResult], list[VictimResult]]  # (gone, alive), as psutil.wait_procs returns them


def _split(who: list[VictimResult]) -> Split:
    return [r for r in who if not r.alive], [r for r in who if r.alive]


def send(run: _Run, sig: signal.Signals, who: list[VictimResult]) -> Split:
    """Signal ``who`` with ``sig``: the gate asked first (its refusals recorded), every line audited
    on disk (one fsync for the phase), then the signals, then their outcomes audited. Returns
    (gone, alive) of ``who``: gone are those found ended (or another process now) at the signal,
    refused by the gate or denied; alive, the ones still to be waited for."""
    refused: dict[int, str] = {}
    if run.gate is not None and who:
        intended = {r.victim.ident for r in run.results if r.refused is None}
        refused = run.gate(sig, [r.victim.ident for r in who], intended)
    audit = run.audit
    # every line on disk first (one fsync for the whole phase), then the signals
    try:
        entries = audit.before_signals(run_id=run.run_id, action=run.action, signal=sig.name,
                                       targets=[r.victim.info for r in who]) if audit and who else []
    except PermissionDenied as exc:
        sent = [r for r in run.results if _sent(r)]
        if not sent:
            raise
        raise PermissionDenied(exc.message, hint=(
            f"{sig.name} was not sent (it could not be audited), after earlier signals went to "
            f"{_processes(len(sent))}: {', '.join(str(r.victim.ident.pid) for r in sent[:10])}; "
            "set GPUSLATE_STATE_DIR to a writable directory")) from None
    outcomes: list[tuple[str, str | None]] = []
    for r in who:
        why = refused.get(r.victim.ident.pid)
        if why is not None:
            r.refused = why
            r.signals.append(SignalRecord(sig.name, run.since(), REFUSED))
            outcomes.append((REFUSED, why))
            run.note(f"{r.victim.ident.pid} not signaled: {why}")
            continue
        outcome = send_signal(r.victim.ident, sig)
        r.signals.append(SignalRecord(sig.name, run.since(), outcome))
        outcomes.append((outcome, None))
    if entries:
        audit.outcomes([(e, o, d) for e, (o, d) in zip(entries, outcomes)])  # type: ignore[union-attr]
    for r, (outcome, _) in zip(who, outcomes):
        if outcome == PERMISSION_DENIED:
            r.permission_denied = True
            run.note(f"permission denied signaling {r.victim.ident.pid}")
        elif outcome in (NOT_RUNNING, PID_REUSED):
            r.exited_at = run.since()
            r.ended_by = r.ended_by or ("gone" if outcome == NOT_RUNNING and not _sent(r) else
                                        "pid_reused" if outcome == PID_REUSED else sig.name)
    return _split(who)


def adopt(run: _Run, phase: signal.Signals) -> list[VictimResult]:
    """The processes the victims forked since the last look (``discover``), added to the run's
    results and sent ``phase``'s signal; returns those of them still alive."""
    if run.discover is None:
        return []
    new = [VictimResult(v) for v in run.discover([r.victim for r in run.results])]
    if not new:
        return []
    run.results.extend(new)
    run.note(f"{_processes(len(new))} forked by the job while stopping: {phase.name}")
    return send(run, phase, new)[1]


def early_kill(run: _Run, pending: list[VictimResult]) -> None:
    """SIGKILL the victims SIGTERM cannot reach once the victims they started are gone."""
    running = {r.victim.ident.pid for r in pending}
    hopeless = [r for r in pending if r.victim.ignores_sigterm is not None and not _killed(r)
                and not running.intersection(r.victim.waits_for)]
    if hopeless:
        run.note(f"SIGKILL to {_processes(len(hopeless))} that SIGTERM cannot stop: "
                 + "; ".join(f"{r.victim.ident.pid} {r.victim.ignores_sigterm}" for r in hopeless))
        send(run, signal.SIGKILL, hopeless)


def wait_phase(run: _Run, who: list[VictimResult], until: float, phase: signal.Signals) -> Split:
    """Wait until every one of ``who`` has exited, or ``until`` (monotonic): asleep on their pidfds,
    woken at each exit (by the adaptive poll for those without one), adopting what the job forks
    every ``discover_every`` seconds; in the SIGTERM phase, :func:`early_kill` as their children go.
    Returns (gone, alive): of ``who`` and the adopted, those ended and those still running."""
    poll = Poller()
    every = list(who)
    pending = [r for r in who if r.alive]
    next_discovery = time.monotonic() + run.discover_every
    while pending:
        for r in pending:
            run.watch.add(r.victim.ident)
            reap_if_child(r.victim.ident.pid)
            exited = run.watch.exited(r.victim.ident.pid)
            if exited or (exited is None and is_gone(r.victim.ident)):
                r.exited_at = run.since()
                r.ended_by = "SIGKILL" if _killed(r) else phase.name
        pending = [r for r in pending if r.alive]
        if phase == signal.SIGTERM:
            early_kill(run, pending)
        now = time.monotonic()
        if now >= next_discovery:
            adopted = adopt(run, phase)
            every += adopted
            pending += adopted
            next_discovery = now + run.discover_every
        if not pending or now >= until:
            break
        # woken by the first exit; by the fork watch's turn; or, for processes
        # without a pidfd, by the adaptive poll
        run.watch.wait(min(until, next_discovery) - now, poll.next_delay())
    left = {id(r) for r in pending}
    return [r for r in every if id(r) not in left], pending


def kill_phase(run: _Run, survivors: list[VictimResult], *, grace: float, kill_wait: float) -> Split:
    """SIGKILL the survivors of the grace not killed yet, then wait up to ``kill_wait`` seconds for
    every one of them (see :func:`wait_phase`). Returns (gone, alive)."""
    unkilled = [r for r in survivors if not _killed(r)]
    if unkilled:
        run.note(f"{_processes(len(unkilled))} survived SIGTERM for {grace:g} s: SIGKILL")
        send(run, signal.SIGKILL, unkilled)
    return wait_phase(run, survivors, time.monotonic() + kill_wait, signal.SIGKILL)


def _processes(n: int, *, more: bool = False) -> str:
    return f"{n}{' more' if more else ''} process{'' if n == 1 else 'es'}"


def _sent(r: VictimResult) -> bool:
    return any(s.outcome == DELIVERED for s in r.signals)


def _killed(r: VictimResult) -> bool:
    return any(s.signal == "SIGKILL" and s.outcome == DELIVERED for s in r.signals)
