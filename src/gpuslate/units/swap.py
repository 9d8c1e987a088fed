"""``swap OLD NEW``: down OLD, verify its GPUs clean, up NEW, wait until it serves;
each phase timed. With ``rollback``, a NEW that fails is followed by OLD started
again (with the spec it last ran with) and made ready.

With ``park`` (``swap --park``), OLD is parked instead of stopped and NEW resumed if it is parked
(else started): a switch between two resident deployments in the engines' own park and wake time
(units/park.py). When OLD cannot be parked (a guard, a park that did not free its memory, the
engine's failure) the swap falls back to a cold stop of OLD, and when NEW cannot be resumed (no
room, its memory not back, another answer than before its park) to a cold stop and start of NEW,
each saying why; ``fallback=False`` (``--no-fallback``) stops there instead (OLD serves again).

The figure that matters to the people using the servers is the *downtime*:
from the moment the old server is told to stop until the new one is ready (and
has answered its smoke completion, when it has one). To shorten it, NEW's
weight files are read into the page cache first, while OLD still serves
(:mod:`.prefetch`); the swap waits for that read before it stops OLD.

The whole swap holds the host lock once (``down``'s and ``up``'s phases run inside it on the
same :class:`~gpuslate.host.session.HostContext`), so no ``clear`` or other ``up`` can
slip in between the old server leaving the GPUs and the new one taking them. Each record
is read once, under the lock: OLD's is stopped as loaded (and its spec is what a rollback
starts), NEW's is checked and resolved from as loaded (:func:`~.resolving.spec_for`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._document import MAX_SECONDS, Fields, checked, reading
from .._parse import format_size
from .._time import iso_time
from ..errors import NotDoneError, UsageError
from ..front.admin import AdminError
from ..front.counters import HoldMeter, HoldReport
from ..host.session import HostContext
from ..options import DownOptions, ParkOptions, ResumeOptions, SwapOptions, UpOptions
from ..outcome import Outcome, Parted, PartedStatus
from . import store
from .front import Front, check_front, start_front
from .frontreport import DrainReport, FrontReport, FrontState
from .lifecycle import (
    DownResult,
    UpResult,
    check_startable,
    phase_start,
    start_checked,
    stop_loaded,
)
from .park import ParkResult, ResumeResult, park_loaded, resume_loaded
from .prefetch import Prefetch, PrefetchReport, plan_prefetch
from .readiness import Probe
from .resolving import spec_for
from .spec import UnitSpec
from .unit import Unit


class SwapStatus(PartedStatus):
    """How a ``swap`` ended (the JSON ``status``)."""

    SWAPPED = "swapped", Outcome.DONE
    DOWN_FAILED = "down_failed", Outcome.NOT_DONE  # OLD not stopped cleanly: NEW not started
    UP_FAILED = "up_failed", Outcome.FAILED
    ROLLED_BACK = "rolled_back", Outcome.FAILED  # NEW failed, OLD serves again
    ROLLBACK_FAILED = "rollback_failed", Outcome.FAILED
    PARK_FAILED = "park_failed", Outcome.NOT_DONE  # --park --no-fallback: OLD not parked (it serves again)
    RESUME_FAILED = "resume_failed", Outcome.FAILED  # --park --no-fallback: NEW not resumed

SWAP_SCHEMA = "gpuslate.swap.v1"
#: the downtime's parts, in order: they add up to downtime_s. start_to_ready_s is split
#: into start_to_port_open_s + port_open_to_ready_s when the unit has a port.
DOWNTIME_PARTS = ("stop_old_s", "verify_clean_s", "preflight_new_s", "spawn_new_s", "start_to_ready_s",
                  "smoke_new_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class SwapResult(Parted):
    old: str
    new: str
    status: SwapStatus
    down: DownResult | None  # None: OLD was parked, not stopped
    up: UpResult | None
    rollback: UpResult | None
    phases: dict[str, float]  # lock_wait_s, stop_old_s, verify_clean_s, preflight_new_s, launch_new_s,
    #                           ready_new_s, smoke_new_s, rollback_s (present when they ran)
    total_s: float
    # from the old server told to stop to the new one ready (and smoke-tested); None unless swapped
    downtime_s: float | None = None
    downtime: dict[str, float] | None = None  # its breakdown, see DOWNTIME_PARTS
    prefetch: PrefetchReport | None = None
    stop_old_at: float | None = None  # epoch: the old server was told to stop
    overhead: float | None = None  # as a document gave it (else computed: see overhead_s)
    front: FrontReport | None = None  # what the clients of OLD's front saw (units/front.py)
    parked: ParkResult | None = None  # --park: OLD's park
    resumed: ResumeResult | None = None  # --park: NEW's resume (None: NEW was started)
    fallback: str | None = None  # --park: why a part went the cold way instead

    @property
    def switch(self) -> str:
        """How OLD left and NEW came: "park" (parked and resumed or started), "restart" (stopped and
        started), or "park+restart" (one of each)."""
        old = "park" if self.parked is not None and self.parked.ok else "restart"
        new = "park" if self.resumed is not None and self.resumed.ok else "restart"
        return old if old == new else "park+restart"

    @property
    def ok(self) -> bool:
        return self.status == SwapStatus.SWAPPED

    @property
    def overhead_s(self) -> float | None:
        """Total minus the old server's teardown, the new server's startup, the prefetch (done while
        the old server serves) and the drain behind a front (the old server finishing its requests):
        what gpuslate adds."""
        if self.overhead is not None or not self.ok:
            return self.overhead
        p = self.phases
        # the engines' own time: OLD's teardown or its park calls, NEW's startup or its resume calls
        return (self.total_s - p.get("prefetch_wait_s", 0.0) - p.get("drain_old_s", 0.0) - p.get("stop_old_s", 0.0)
                - p.get("verify_clean_s", 0.0) - p.get("park_old_s", 0.0) - p.get("resume_new_s", 0.0)
                - p.get("ready_new_s", 0.0) - p.get("smoke_new_s", 0.0))

    def deciding_parts(self) -> list[DownResult | UpResult | ParkResult | ResumeResult]:
        """The part whose failure decides this one's exit status (stopping or parking OLD, else
        starting or resuming NEW)."""
        old = self.down if self.down is not None else self.parked
        new = self.up if self.up is not None else self.resumed
        return [part for part in (old, new) if part is not None and not part.ok][:1]

    def to_json(self) -> dict[str, Any]:
        ov = self.overhead_s
        return {
            "schema": SWAP_SCHEMA, "ok": self.ok, "status": self.status.value, "old": self.old, "new": self.new,
            "phases": {k: round(v, 4) for k, v in self.phases.items()}, "total_s": round(self.total_s, 4),
            "overhead_s": round(ov, 4) if ov is not None else None,
            "downtime_s": round(self.downtime_s, 4) if self.downtime_s is not None else None,
            "downtime": {k: round(v, 4) for k, v in self.downtime.items()} if self.downtime else None,
            "stop_old_at": iso_time(self.stop_old_at) if self.stop_old_at is not None else None,
            "prefetch": self.prefetch.to_json() if self.prefetch else None,
            "down": self.down.to_json() if self.down else None, "up": self.up.to_json() if self.up else None,
            "rollback": self.rollback.to_json() if self.rollback else None,
            "front": self.front.to_json() if self.front else None,
            "switch": self.switch, "parked": self.parked.to_json() if self.parked else None,
            "resumed": self.resumed.to_json() if self.resumed else None, "fallback": self.fallback,
        }

    @classmethod
    def from_json(cls, doc: object) -> SwapResult:
        """A ``gpuslate.swap.v1`` document as the SwapResult it was."""
        f = Fields(checked(doc, SWAP_SCHEMA))
        with reading(SWAP_SCHEMA):
            return cls(old=f.text("old"), new=f.text("new"), status=f.choice("status", SwapStatus),
                       down=f.opt_record("down", DownResult.from_json), up=f.opt_record("up", UpResult.from_json),
                       rollback=f.opt_record("rollback", UpResult.from_json), phases=f.timings("phases"),
                       total_s=f.seconds("total_s"), downtime_s=f.opt_seconds("downtime_s"),
                       downtime=f.timings("downtime") if f.raw("downtime") is not None else None,
                       prefetch=f.opt_record("prefetch", PrefetchReport.from_json),
                       stop_old_at=f.opt_time("stop_old_at"),
                       overhead=f.opt_number("overhead_s", -MAX_SECONDS, MAX_SECONDS),
                       front=f.opt_record("front", FrontReport.from_json, default=None),
                       parked=f.opt_record("parked", ParkResult.from_json, default=None),
                       resumed=f.opt_record("resumed", ResumeResult.from_json, default=None),
                       fallback=f.opt_text("fallback", default=None))



def swap(host: HostContext, old: str, new: str | UnitSpec, options: SwapOptions = SwapOptions()) -> SwapResult:
    """Replace unit ``old`` with ``new`` (a unit name resolved like ``up NAME``, or a spec).

    The whole swap holds the host lock of ``host`` once; ``down``'s and ``up``'s phases run on the
    same host (one backend, one audit log) under it (:func:`swap_loaded`).
    With ``prefetch`` (the default), NEW's weight files are read into the page cache
    before OLD is stopped, for up to ``prefetch_timeout`` seconds; ``prefetch_memory``
    bounds it instead of the host's MemAvailable.
    """
    opts = options.validate()
    t0 = time.monotonic()
    new_name = new.name if isinstance(new, UnitSpec) else new
    units = store.UnitStore.of(host)
    if not units.record_path(old).exists():  # before waiting for the lock: a typo fails at once
        raise UsageError(f"unknown unit {old!r}: see 'gpuslate ps'")
    with host.locked(f"swap {old} -> {new_name}") as waited:
        old_unit = Unit.load(units, old)
        if old_unit is None:
            raise UsageError(f"unknown unit {old!r}: see 'gpuslate ps'")
        if old_unit.spec is None:
            raise UsageError(old_unit.describe_problem(), hint=f"'gpuslate down {old}' stops what is left of it")
        parked = None
        if new_name != old:  # NEW as it is now, under the lock: read once, for the guards and its spec
            new_unit = Unit.load(units, new_name)
            if opts.park and new_unit is not None and new_unit.record is not None and new_unit.record.park is not None \
                    and new_unit.spec is not None and new_unit.running():
                parked = new_unit  # resumed, as it runs: its spec is the one it runs with
            else:
                check_startable(new_unit, new_name)
        else:  # swapped to itself (restart): the record just loaded, not corrupt (it has a spec)
            if opts.park:
                raise UsageError(f"swap {old} {old} --park: a unit cannot be parked for itself")
            new_unit = old_unit
        if parked is not None:
            assert parked.spec is not None
            new_spec = parked.spec
        else:
            new_spec = new.validate() if isinstance(new, UnitSpec) else \
                spec_for(host, new, config=opts.config, previous=new_unit)
        if opts.park:
            return park_swap(host, old_unit, new_spec, parked, opts, lock_wait=waited, started=t0)
        return swap_loaded(host, old_unit, new_spec, opts, lock_wait=waited, started=t0)


def swap_loaded(host: HostContext, old_unit: Unit, new_spec: UnitSpec, opts: SwapOptions, *,
                lock_wait: float = 0.0, started: float | None = None) -> SwapResult:
    """``swap``'s phases, under the host lock of ``host``, which the caller holds: ``old_unit`` as
    loaded under it (a spec, so not corrupt), ``new_spec`` validated and past
    :func:`~.lifecycle.check_startable` (or OLD itself: ``restart``). Neither record is read again:
    OLD is stopped as loaded, NEW started, and OLD's rollback starts the spec loaded here."""
    t0 = phase_start(host, "swap_loaded", started)
    note = host.note
    units = store.UnitStore.of(host)
    old = old_unit.name
    old_spec = old_unit.spec
    if old_spec is None:
        raise ValueError(f"unit {old}'s record is corrupt: swap_loaded needs the spec it last ran with")
    pf: Prefetch | None = None
    # OLD's front moves to NEW: checked before anything changes (NEW may not be behind another one)
    front = check_front(host, new_spec, replacing=old)
    steer = _Steer(host, front, old, new_spec) if front is not None or new_spec.front is not None else None
    try:
        phases: dict[str, float] = {"lock_wait_s": lock_wait}
        pf_report = None
        pf = _start_prefetch(new_spec, opts.prefetch_memory, note) if opts.prefetch else None
        if pf is not None:
            t_pf = time.monotonic()
            pf_report = pf.wait(opts.prefetch_timeout)  # OLD still serves meanwhile
            phases["prefetch_wait_s"] = time.monotonic() - t_pf
            if pf_report.status == "partial":
                note(f"prefetch not done after {opts.prefetch_timeout:g} s: stopping {old} anyway; "
                     "the rest is read in the background")
            elif pf_report.status == "failed":
                note(f"prefetch failed ({pf_report.error}); going on without it")
        t_hold = time.monotonic()
        if steer is not None:
            steer.hold(opts.drain_timeout)  # new requests wait; those on OLD finish there (bounded)
            phases["drain_old_s"] = time.monotonic() - t_hold
        stop_at = time.time()
        t_stop = time.monotonic()
        d = stop_loaded(host, old_unit, DownOptions())  # OLD as loaded above, under this hold of the lock
        phases["stop_old_s"] = d.report.timings["stop_s"]
        phases["verify_clean_s"] = d.report.timings["verify_s"]

        def result(status: SwapStatus, **kw: Any) -> SwapResult:
            fr = steer.report() if steer is not None else None
            return SwapResult(old=old, new=new_spec.name, status=status, down=d, phases=phases,
                              total_s=time.monotonic() - t0, prefetch=pf_report, stop_old_at=stop_at, front=fr, **kw)

        if not d.ok:
            if steer is not None:
                steer.refuse(f"swap {old} -> {new_spec.name}: {old} was not stopped cleanly; nothing serves")
            return result(SwapStatus.DOWN_FAILED, up=None, rollback=None)
        t_up = time.monotonic()
        # the verification as the swap's clock saw it (down's own bookkeeping after its poll
        # included), so that the phase and the downtime's part of the same name are one figure
        phases["verify_clean_s"] = max(0.0, t_up - t_stop - phases["stop_old_s"])
        watch = _PortWatch(new_spec, units.log_path(new_spec.name)) if new_spec.port is not None else None
        try:
            u = start_checked(host, new_spec, UpOptions())  # NEW passed check_startable above
        finally:
            if watch is not None:
                watch.stop()
        t_ready = time.monotonic()
        phases["preflight_new_s"] = u.timings["preflight_s"]
        phases["launch_new_s"] = u.timings["launch_s"]
        if u.time_to_ready is not None:
            phases["ready_new_s"] = u.time_to_ready
        if "smoke_s" in u.timings:
            phases["smoke_new_s"] = u.timings["smoke_s"]
        if u.ok:
            if steer is not None:
                steer.route(new_spec)
            parts = _downtime_parts(phases, t_stop, t_up, t_ready, u, watch)
            return result(SwapStatus.SWAPPED, up=u, rollback=None, downtime_s=t_ready - t_stop, downtime=parts)
        if not opts.rollback:
            if steer is not None:
                steer.refuse(f"{new_spec.name} did not start ({u.record.failure})", next_unit=new_spec.name)
            return result(SwapStatus.UP_FAILED, up=u, rollback=None)
        note(f"{new_spec.name} failed ({u.record.failure}); rolling back to {old}")
        t_rb = time.monotonic()
        # OLD's spec as loaded above; no guard read of its record: stop_loaded has just stopped it
        # (d.ok: nothing of it runs) and written the record itself, under this same hold of the lock
        rb = start_checked(host, old_spec, UpOptions())
        phases["rollback_s"] = time.monotonic() - t_rb
        if steer is not None:
            if rb.ok:
                steer.route(old_spec)
            else:
                steer.refuse(f"{new_spec.name} did not start, and {old} did not come back ({rb.record.failure})",
                             next_unit=old)
        status = SwapStatus.ROLLED_BACK if rb.ok else SwapStatus.ROLLBACK_FAILED
        return result(status, up=u, rollback=rb)
    except BaseException:
        if steer is not None:
            steer.abandon()
        raise
    finally:
        if pf is not None:
            pf.cancel()  # a failed or interrupted swap leaves no reader behind


def park_swap(host: HostContext, old_unit: Unit, new_spec: UnitSpec, parked: Unit | None, opts: SwapOptions, *,
              lock_wait: float = 0.0, started: float | None = None) -> SwapResult:
    """``swap --park``'s phases, under the host lock of ``host``, which the caller holds: OLD parked
    (else stopped, with ``opts.fallback``), then NEW resumed (``parked``: NEW's unit, parked) or
    started (else stopped and started cold, with ``opts.fallback``); each part's result kept, and
    why a part went the cold way. Behind a front, clients are held from before OLD's park until NEW
    serves, as a swap holds them (:class:`_Steer`)."""
    t0 = phase_start(host, "park_swap", started)
    note = host.note
    old = old_unit.name
    old_spec = old_unit.spec
    if old_spec is None:
        raise ValueError(f"unit {old}'s record is corrupt: park_swap needs the spec it last ran with")
    front = check_front(host, new_spec, replacing=old)
    steer = _Steer(host, front, old, new_spec) if front is not None or new_spec.front is not None else None
    pf: Prefetch | None = None
    try:
        phases: dict[str, float] = {"lock_wait_s": lock_wait}
        pf_report = None
        pf = _start_prefetch(new_spec, opts.prefetch_memory, note) if opts.prefetch and parked is None else None
        if pf is not None:
            t_pf = time.monotonic()
            pf_report = pf.wait(opts.prefetch_timeout)
            phases["prefetch_wait_s"] = time.monotonic() - t_pf
        if steer is not None:
            t_hold = time.monotonic()
            steer.hold(opts.drain_timeout)
            phases["drain_old_s"] = time.monotonic() - t_hold
        stop_at = time.time()
        t_stop = time.monotonic()
        p = park_loaded(host, old_unit, ParkOptions(drain_timeout=opts.drain_timeout, timeout=opts.park_timeout),
                        steer_front=False, undo=not opts.fallback)
        for key, into in (("park_s", "park_old_s"), ("prove_s", "prove_old_s")):
            if key in p.timings:
                phases[into] = p.timings[key]
        d: DownResult | None = None
        why: list[str] = []

        def result(status: SwapStatus, **kw: Any) -> SwapResult:
            fr = steer.report() if steer is not None else None
            return SwapResult(old=old, new=new_spec.name, status=status, down=d, phases=phases,
                              total_s=time.monotonic() - t0, prefetch=pf_report, stop_old_at=stop_at, front=fr,
                              parked=p, fallback="; ".join(why) or None, **kw)

        if not p.ok:
            if not opts.fallback:
                if steer is not None:
                    steer.route(old_spec)  # undone: OLD serves again
                return result(SwapStatus.PARK_FAILED, up=None, rollback=None)
            why.append(f"{old} was not parked ({p.status.value}: {p.reason or p.why}): stopped instead")
            note(why[-1])
            t_down = time.monotonic()
            d = stop_loaded(host, old_unit, DownOptions())
            phases["stop_old_s"] = d.report.timings["stop_s"]
            phases["verify_clean_s"] = max(0.0, time.monotonic() - t_down - phases["stop_old_s"])
            if not d.ok:
                if steer is not None:
                    steer.refuse(f"swap {old} -> {new_spec.name}: {old} was not stopped cleanly; nothing serves")
                return result(SwapStatus.DOWN_FAILED, up=None, rollback=None)
        u: UpResult | None = None
        rr: ResumeResult | None = None
        if parked is not None:
            rr = resume_loaded(host, parked, ResumeOptions(), steer_front=False)
            for key, into in (("resume_s", "resume_new_s"), ("back_s", "back_new_s"), ("ready_s", "serve_new_s"),
                              ("warmup_s", "warmup_new_s"), ("reference_s", "reference_new_s")):
                if key in rr.timings:
                    phases[into] = rr.timings[key]
            if not rr.ok and not opts.fallback:
                if steer is not None:
                    steer.refuse(f"{new_spec.name} was not resumed ({rr.status.value}: {rr.reason})",
                                 next_unit=new_spec.name)
                return result(SwapStatus.RESUME_FAILED, up=None, rollback=None, resumed=rr)
            if not rr.ok:
                why.append(f"{new_spec.name} was not resumed ({rr.status.value}: {rr.reason}): restarted cold")
                note(why[-1])
                gone = stop_loaded(host, parked, DownOptions())
                if not gone.ok:
                    if steer is not None:
                        steer.refuse(f"{new_spec.name} was not resumed, nor stopped cleanly", next_unit=new_spec.name)
                    return result(SwapStatus.UP_FAILED, up=None, rollback=None, resumed=rr)
        if rr is None or not rr.ok:
            u = start_checked(host, new_spec, UpOptions())
            phases["preflight_new_s"] = u.timings["preflight_s"]
            phases["launch_new_s"] = u.timings["launch_s"]
            if u.time_to_ready is not None:
                phases["ready_new_s"] = u.time_to_ready
            if "smoke_s" in u.timings:
                phases["smoke_new_s"] = u.timings["smoke_s"]
        t_ready = time.monotonic()
        if u is None or u.ok:
            if steer is not None:
                steer.route(new_spec)
            downtime = {k: phases[k] for k in ("park_old_s", "prove_old_s", "stop_old_s", "verify_clean_s",
                                               "resume_new_s", "back_new_s", "serve_new_s", "warmup_new_s",
                                               "reference_new_s", "ready_new_s", "smoke_new_s") if k in phases}
            return result(SwapStatus.SWAPPED, up=u, rollback=None, resumed=rr, downtime_s=t_ready - t_stop,
                          downtime=downtime)
        if not opts.rollback:
            if steer is not None:
                steer.refuse(f"{new_spec.name} did not start ({u.record.failure})", next_unit=new_spec.name)
            return result(SwapStatus.UP_FAILED, up=u, rollback=None, resumed=rr)
        note(f"{new_spec.name} failed ({u.record.failure}); rolling back to {old}")
        t_rb = time.monotonic()
        if d is None:  # parked: brought back as it was
            back = resume_loaded(host, old_unit, ResumeOptions(), steer_front=False)
            ok = back.ok
            rb = None
        else:
            rb = start_checked(host, old_spec, UpOptions())
            ok = rb.ok
        phases["rollback_s"] = time.monotonic() - t_rb
        if steer is not None:
            if ok:
                steer.route(old_spec)
            else:
                steer.refuse(f"{new_spec.name} did not start, and {old} did not come back", next_unit=old)
        return result(SwapStatus.ROLLED_BACK if ok else SwapStatus.ROLLBACK_FAILED, up=u, rollback=rb, resumed=rr)
    except BaseException:
        if steer is not None:
            steer.abandon()
        raise
    finally:
        if pf is not None:
            pf.cancel()


class _Steer:
    """The front's part of one swap: hold and drain before OLD stops, route to whichever unit
    serves after (NEW, or OLD rolled back), or refuse saying why; and what the clients saw.
    A NEW declaring a front that OLD did not have gets it started once it is ready, as ``up`` does."""

    def __init__(self, host: HostContext, front: Front | None, old: str, new: UnitSpec) -> None:
        self.host, self.front, self.old, self.new = host, front, old, new
        self.meter: HoldMeter | None = None
        self.drain: DrainReport | None = None
        self.hold_report: HoldReport | None = None
        self.state: FrontState | None = None
        self.unit: str | None = None
        self.note: str | None = None
        self.started = False
        self.stopped_old = False

    def hold(self, drain_timeout: float) -> None:
        f = self.front
        if f is None:
            return
        if not f.running() or not f.admin.alive():
            self.note = f"the front on {f.record.address} was not running: started again once {self.new.name} is ready"
            self.host.note(self.note)
            return
        self.meter = f.hold(f"swap {self.old} -> {self.new.name}", self.new.name)
        self.drain = f.drain(drain_timeout)

    def _front_for(self, spec: UnitSpec) -> Front | None:
        f = self.front
        if f is not None and f.running() and f.admin.alive():
            return f
        if f is not None or spec.front is not None:  # gone meanwhile, or never there: start it, holding
            if f is not None and f.running():
                f.stop()
            target = spec if spec.front is not None else replace(spec, front=f.record.address)  # type: ignore[union-attr]
            try:
                self.front = start_front(self.host, target, unit=spec.name, next_unit=spec.name)
            except (UsageError, NotDoneError, OSError) as exc:
                self.note = f"the front could not be started: {exc}"
                self.host.note(self.note)
                self.state = FrontState.DOWN
                return None
            self.started = True
            if self.meter is not None:
                self.note = (self.note or "") + " (it died during the swap: the requests it held were lost)"
                self.meter = None
            return self.front
        return None

    def route(self, spec: UnitSpec) -> None:
        f = self._front_for(spec)
        if f is None:
            return
        try:
            self.hold_report = f.route(spec, self.meter)
        except AdminError as exc:
            self.note = f"the front could not be routed to {spec.name}: {exc}"
            self.state = FrontState.NO_ROUTE
            return
        self.meter = None
        self.state, self.unit = FrontState.SERVING, spec.name

    def refuse(self, reason: str, next_unit: str | None = None) -> None:
        f = self.front
        if f is None or not f.running():
            return
        self.hold_report = f.refuse(reason, self.meter, next_unit)
        self.meter = None
        self.state, self.unit, self.note = FrontState.REFUSING, next_unit, reason
        self.host.note(f"front {f.record.address}: {reason}: it answers 503 until a unit serves it")

    def abandon(self) -> None:
        """The swap was interrupted: the front answers 503 rather than hold for nothing."""
        if self.meter is not None:
            try:
                self.refuse(f"swap {self.old} -> {self.new.name} was interrupted", self.new.name)
            except (AdminError, OSError):
                pass

    def report(self) -> FrontReport | None:
        f = self.front
        if f is None:
            return None
        r = FrontReport(address=f.record.address, state=self.state or f.live()[0], unit=self.unit or f.record.unit,
                        started=self.started, hold=self.hold_report, drain=self.drain, note=self.note)
        try:
            f.remember(r)
        except OSError:
            pass
        return r


def _start_prefetch(spec: UnitSpec, memory: int | None, note: Callable[[str], None]) -> Prefetch | None:
    """Plan NEW's prefetch and start reading; ``None`` when there is nothing to read."""
    plan = plan_prefetch(spec.command, spec.prefetch, cwd=spec.cwd, available=memory)
    if not plan.files:
        return None
    if plan.warning:  # it would not fit: reported, skipped
        note(plan.warning)
    else:
        note(f"prefetching {format_size(plan.total)} of {spec.name}'s weights "
             f"({_files(len(plan.files))}) while the old server still serves")
    return Prefetch(plan)


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


class _PortWatch:
    """Watches NEW's port from the swap's side, to split its start into process start ->
    port open -> ready (most servers bind their port before they load their weights)."""

    def __init__(self, spec: UnitSpec, log: Path) -> None:
        self.opened: float | None = None  # time.monotonic() of the first accepted connection
        self._probe = Probe(replace(spec, engine=None, ready_url=None, ready_log=None), log)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuslate-portwatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._probe.check(timeout=0.5):
                self.opened = time.monotonic()
                return
            self._stop.wait(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)


def _downtime_parts(phases: dict[str, float], t_stop: float, t_up: float, t_ready: float, u: UpResult,
                    watch: _PortWatch | None) -> dict[str, float]:
    """The downtime (``t_stop`` -> ``t_ready``, monotonic) split into parts that add up to it.

    ``spawn_new_s`` is gpuslate's own work between the pre-flight and the fork (fence, log
    file); ``start_to_ready_s`` runs from the fork to readiness, as ``up`` measured it;
    ``smoke_new_s`` from readiness until ``up`` returned (the smoke completion, if any,
    and the unit's state file). The rest of ``down`` counts as verification.
    """
    to_mono = time.monotonic() - time.time()  # the unit record keeps epoch times
    spawned = u.record.launched_at + to_mono
    ready = (u.record.ready_at + to_mono) if u.record.ready_at else t_ready
    parts = {"stop_old_s": phases["stop_old_s"], "verify_clean_s": phases["verify_clean_s"]}
    parts["preflight_new_s"] = max(0.0, min(phases["preflight_new_s"], spawned - t_up))
    parts["spawn_new_s"] = max(0.0, spawned - t_up - parts["preflight_new_s"])
    parts["start_to_ready_s"] = max(0.0, ready - spawned)
    if watch is not None and watch.opened is not None:
        opened = min(max(watch.opened, spawned), ready)
        parts["start_to_port_open_s"] = opened - spawned
        parts["port_open_to_ready_s"] = ready - opened
    parts["smoke_new_s"] = max(0.0, t_ready - ready)
    return parts
