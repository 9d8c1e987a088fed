"""``swap OLD NEW``: down OLD, verify its GPUs clean, up NEW, wait until it serves;
each phase timed. With ``rollback``, a NEW that fails is followed by OLD started
again (with the spec it last ran with) and made ready.

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
from typing import Any, NamedTuple

from .._document import checked, reading
from .._parse import check_seconds, check_size, format_size
from .._time import iso_time, parse_iso_time
from ..errors import UsageError
from ..host.session import HostContext
from ..outcome import Outcome, Parted, PartedStatus
from . import store
from .lifecycle import (
    DownOptions,
    DownResult,
    UpOptions,
    UpResult,
    check_startable,
    phase_start,
    start_checked,
    stop_loaded,
)
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
    down: DownResult
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

    @property
    def ok(self) -> bool:
        return self.status == SwapStatus.SWAPPED

    @property
    def overhead_s(self) -> float | None:
        """Total minus the old server's teardown, the new server's startup and the prefetch
        (done while the old server serves): what gpuslate adds."""
        if self.overhead is not None or not self.ok:
            return self.overhead
        p = self.phases
        return (self.total_s - p.get("prefetch_wait_s", 0.0) - p["stop_old_s"] - p["verify_clean_s"]
                - p["ready_new_s"] - p.get("smoke_new_s", 0.0))

    def deciding_parts(self) -> list[DownResult | UpResult]:
        """The part whose failure decides this one's exit status (stopping OLD, else starting NEW)."""
        return [part for part in (self.down, self.up) if part is not None and not part.ok][:1]

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
            "down": self.down.to_json(), "up": self.up.to_json() if self.up else None,
            "rollback": self.rollback.to_json() if self.rollback else None,
        }

    @classmethod
    def from_json(cls, doc: object) -> SwapResult:
        """A ``gpuslate.swap.v1`` document as the SwapResult it was."""
        d = checked(doc, SWAP_SCHEMA)
        with reading(SWAP_SCHEMA):
            return cls(old=d["old"], new=d["new"], status=SwapStatus(d["status"]),
                       down=DownResult.from_json(d["down"]),
                       up=UpResult.from_json(d["up"]) if d["up"] is not None else None,
                       rollback=UpResult.from_json(d["rollback"]) if d["rollback"] is not None else None,
                       phases=dict(d["phases"]), total_s=float(d["total_s"]), downtime_s=d["downtime_s"],
                       downtime=dict(d["downtime"]) if d["downtime"] is not None else None,
                       prefetch=PrefetchReport.from_json(d["prefetch"]) if d["prefetch"] is not None else None,
                       stop_old_at=parse_iso_time(d["stop_old_at"]) if d["stop_old_at"] is not None else None,
                       overhead=d["overhead_s"])


class SwapOptions(NamedTuple):
    """How ``swap`` replaces a unit; plain data."""

    rollback: bool = False  # NEW failed: start OLD again with the spec it last ran with
    config: str | None = None  # the unit file NEW is resolved from (default: found as up finds it)
    prefetch: bool = True  # read NEW's weight files into the page cache before OLD is stopped
    prefetch_memory: int | None = None  # bound for the prefetch instead of the host's MemAvailable
    prefetch_timeout: float = 600.0  # most seconds OLD keeps serving while NEW's weights are read

    def validate(self) -> SwapOptions:
        check_seconds("prefetch timeout", self.prefetch_timeout)
        check_size("prefetch memory", self.prefetch_memory)
        return self


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
        if new_name != old:  # NEW as it is now, under the lock: read once, for the guards and its spec
            new_unit = Unit.load(units, new_name)
            check_startable(new_unit, new_name)
        else:  # swapped to itself (restart): the record just loaded, not corrupt (it has a spec)
            new_unit = old_unit
        new_spec = new.validate() if isinstance(new, UnitSpec) else \
            spec_for(host, new, config=opts.config, previous=new_unit)
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
        stop_at = time.time()
        t_stop = time.monotonic()
        d = stop_loaded(host, old_unit, DownOptions())  # OLD as loaded above, under this hold of the lock
        phases["stop_old_s"] = d.report.timings["stop_s"]
        phases["verify_clean_s"] = d.report.timings["verify_s"]
        if not d.ok:
            return SwapResult(old=old, new=new_spec.name, status=SwapStatus.DOWN_FAILED, down=d, up=None,
                              rollback=None, phases=phases, total_s=time.monotonic() - t0, prefetch=pf_report,
                              stop_old_at=stop_at)
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
            parts = _downtime_parts(phases, t_stop, t_up, t_ready, u, watch)
            return SwapResult(old=old, new=new_spec.name, status=SwapStatus.SWAPPED, down=d, up=u, rollback=None,
                              phases=phases, total_s=time.monotonic() - t0, downtime_s=t_ready - t_stop,
                              downtime=parts, prefetch=pf_report, stop_old_at=stop_at)
        if not opts.rollback:
            return SwapResult(old=old, new=new_spec.name, status=SwapStatus.UP_FAILED, down=d, up=u, rollback=None,
                              phases=phases, total_s=time.monotonic() - t0, prefetch=pf_report, stop_old_at=stop_at)
        note(f"{new_spec.name} failed ({u.record.failure}); rolling back to {old}")
        t_rb = time.monotonic()
        # OLD's spec as loaded above; no guard read of its record: stop_loaded has just stopped it
        # (d.ok: nothing of it runs) and written the record itself, under this same hold of the lock
        rb = start_checked(host, old_spec, UpOptions())
        phases["rollback_s"] = time.monotonic() - t_rb
        status = SwapStatus.ROLLED_BACK if rb.ok else SwapStatus.ROLLBACK_FAILED
        return SwapResult(old=old, new=new_spec.name, status=status, down=d, up=u, rollback=rb, phases=phases,
                          total_s=time.monotonic() - t0, prefetch=pf_report, stop_old_at=stop_at)
    finally:
        if pf is not None:
            pf.cancel()  # a failed or interrupted swap leaves no reader behind


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
