"""A unit's front: the real proxy (Caddy, :mod:`gpuslate.front`) clients use, which gpuslate starts
and steers so that a swap loses no request.

A front is named by its port (``front-PORT``) and serves one unit at a time. Its two Caddy
processes (the front and its route, see :mod:`gpuslate.front.config`) run as one managed
process group exactly as a unit's do (``launch``: own session, cgroup where possible, markers,
log relay; ``stop_unit``: audited signals), recorded in ``STATE/fronts`` beside a small steering
record (``front-PORT.state``: which unit it serves, what gpuslate last made it do, and which
gpuslate process is steering it now).

The steering verbs, each one admin call to the route process, are what ``swap`` and
``restart`` (and a park swap, later) are made of:

* :meth:`Front.hold`: the route closes; new requests wait in the front, in their order;
* :meth:`Front.drain`: until the requests through to the old unit are done (streams too), bounded;
  what is still running at the bound is counted as cut (stopping the unit then cuts it);
* :meth:`Front.route`: the route opens to the next unit (proven ready by then): the held requests
  go through;
* :meth:`Front.refuse`: the route answers 503 at once, saying why (a swap that could not finish:
  nothing serves, and holding would hide it).

:func:`reroute` is ``up NAME`` of a unit that runs behind a front left serving no one (stranded,
its route or its own process gone): the front is routed to it again, started again where its
processes are gone.

What a front does is read back from Caddy itself (:meth:`Front.live`), never taken from the
steering record alone: a gpuslate killed between two steps leaves the record saying what it
meant, and the live state saying what is; ``ps`` shows both.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from .._document import checked, reading
from .._parse import format_front
from .._walk import open_dir
from ..errors import NotDoneError, UsageError
from ..front.admin import Admin, AdminError
from ..front.caddy import find_caddy
from ..front.config import front_config, hold_config, refuse_config, route_config, routed_upstream
from ..front.counters import HoldMeter, HoldReport, read_counters
from ..host.session import HostContext
from ..options import Containment, DownOptions, UpOptions
from ..proc.procfs import ProcessId, is_alive, read_stat
from . import store
from .frontreport import DrainReport, FrontReport, FrontState
from .lifecycle import DownResult, UpResult, UpStatus, phase_start, start_checked, stop_loaded
from .preflight import check_port
from .readiness import Probe
from .spec import UnitSpec
from .state import UnitState
from .unit import Unit

FOLDER = "fronts"
FRONT_SCHEMA = "gpuslate.front.v1"
_SOCK_MAX = 100  # a Unix socket path is at most 107 bytes (sun_path); kept well under
_READY_S = 20.0  # the most a front's processes take to answer


class FrontPhase(str, Enum):
    """What gpuslate last made a front do (the steering record's ``phase``)."""

    SERVING = "serving"  # routed to the unit
    HOLDING = "holding"  # holding requests: a swap (or an up) is under way
    REFUSING = "refusing"  # answering 503: no unit serves it, and the record says why
    STOPPED = "stopped"  # its processes were stopped (down)

    def __str__(self) -> str:
        return self.value


def front_name(port: int) -> str:
    return f"front-{port}"


def front_store(host: HostContext) -> store.UnitStore:
    """The records of the fronts' processes (their own folder: their markers never match a unit's)."""
    return store.UnitStore(host.state_dir(), FOLDER)


@dataclass
class FrontRecord:
    """The steering record of one front (``STATE/fronts/front-PORT.state``)."""

    name: str
    host: str
    port: int
    unit: str | None  # the unit it serves, or served last
    phase: FrontPhase
    upstream: str | None = None  # HOST:PORT routed to (serving)
    next: str | None = None  # while holding for a swap: the unit meant to serve it next
    reason: str | None = None  # holding: for what; refusing: why
    by: list[int] | None = None  # [pid, start_ticks] of the gpuslate steering it now (holding)
    since: float = 0.0  # epoch of the last change
    last_swap: dict[str, Any] | None = None  # the last swap's FrontReport (for ps and the exporter)

    def to_json(self) -> dict[str, Any]:
        return {"schema": FRONT_SCHEMA, "name": self.name, "host": self.host, "port": self.port,
                "unit": self.unit, "phase": self.phase.value, "upstream": self.upstream, "next": self.next,
                "reason": self.reason, "by": self.by, "since": self.since, "last_swap": self.last_swap}

    @classmethod
    def from_json(cls, doc: object) -> FrontRecord:
        d = checked(doc, FRONT_SCHEMA)
        with reading(FRONT_SCHEMA):
            by = d.get("by")
            if by is not None and not (isinstance(by, list) and len(by) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in by)):
                raise ValueError("by must be [pid, start_ticks]")
            port = d["port"]
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                raise ValueError("port must be 1 to 65535")
            for key in ("unit", "upstream", "next", "reason"):
                if d.get(key) is not None and not isinstance(d[key], str):
                    raise ValueError(f"{key} must be a string or null")
            return cls(name=str(d["name"]), host=str(d["host"]), port=port, unit=d.get("unit"),
                       phase=FrontPhase(d["phase"]), upstream=d.get("upstream"), next=d.get("next"),
                       reason=d.get("reason"), by=by, since=float(d.get("since") or 0.0),
                       last_swap=d.get("last_swap") if isinstance(d.get("last_swap"), dict) else None)

    @property
    def address(self) -> str:
        return format_front(self.host, self.port)


@dataclass(frozen=True)
class FrontPaths:
    """Where a front's sockets and configurations are."""

    admin: str  # the front process's admin socket
    route_admin: str  # the route process's admin socket
    route: str  # the route socket the front proxies to
    front_config: str
    route_config: str
    home: str  # XDG_DATA_HOME and XDG_CONFIG_HOME of both: nothing of Caddy's in the user's home


def _sock_dir(fronts: Path) -> Path:
    """The folder of the fronts' sockets: ``fronts/sock`` when its paths fit a Unix socket address,
    else a private folder of this user's under the temporary folder, named by the state folder."""
    here = fronts / "sock"
    if len(str(here / "65535.ra")) <= _SOCK_MAX:
        with open_dir(fronts, create=True) as d, d.subdir("sock", create=True):
            return here
    base = Path(tempfile.gettempdir()) / f"gpuslate-{os.getuid()}"
    sub = hashlib.sha256(str(fronts).encode()).hexdigest()[:16]
    with open_dir(base, create=True) as d, d.subdir(sub, create=True):
        return base / sub


def front_paths(host: HostContext, port: int) -> FrontPaths:
    fronts = front_store(host).units_dir()
    sock = _sock_dir(fronts)
    name = front_name(port)
    return FrontPaths(admin=str(sock / f"{port}.a"), route_admin=str(sock / f"{port}.ra"),
                      route=str(sock / f"{port}.r"), front_config=str(fronts / f"{name}.caddy.json"),
                      route_config=str(fronts / f"{name}.route.json"), home=str(fronts / "caddy"))


def _me() -> list[int] | None:
    st = read_stat(os.getpid())
    return [os.getpid(), st.start_ticks] if st else None


class Front:
    """One front, loaded under the host lock: its steering record, its processes (a :class:`Unit`
    of the fronts' folder), its admin sockets."""

    def __init__(self, host: HostContext, record: FrontRecord, procs: Unit | None) -> None:
        self.host = host
        self.record = record
        self.procs = procs
        self.paths = front_paths(host, record.port)
        self.admin = Admin(self.paths.admin)
        self.route_admin = Admin(self.paths.route_admin)

    # -- finding ------------------------------------------------------------------

    @classmethod
    def load(cls, host: HostContext, port: int) -> Front | None:
        fs = front_store(host)
        raw = fs.read_file(f"{front_name(port)}.state")
        if raw is None:
            return None
        try:
            rec = FrontRecord.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"the record of front {port} is unreadable ({exc}): "
                             f"{fs.units_dir() / (front_name(port) + '.state')}") from None
        return cls(host, rec, Unit.load(fs, front_name(port)))

    @classmethod
    def all(cls, host: HostContext) -> list[Front]:
        out = []
        fs = front_store(host)
        for name in fs.names():
            if name.startswith("front-") and name[6:].isdigit():
                f = cls.load(host, int(name[6:]))
                if f is not None:
                    out.append(f)
        return out

    @classmethod
    def of_unit(cls, host: HostContext, unit: str) -> Front | None:
        """The front that serves ``unit``, or is held for it (a swap to it under way or cut short);
        a stopped front only if none other."""
        found = [f for f in cls.all(host) if unit in (f.record.unit, f.record.next)]
        live = [f for f in found if f.record.phase != FrontPhase.STOPPED]
        return (live or found)[0] if found else None

    # -- what it does now ---------------------------------------------------------

    def running(self) -> bool:
        return self.procs is not None and self.procs.running()

    def live(self) -> tuple[FrontState, str | None]:
        """What the front does now, and the upstream it routes to (or why it refuses)."""
        rec = self.record
        if rec.phase == FrontPhase.STOPPED and not self.running():
            return FrontState.STOPPED, None
        if not self.running() or not self.admin.alive():
            return FrontState.DOWN, None
        try:
            kind, what = routed_upstream(self.route_admin.config())
        except AdminError:
            return FrontState.NO_ROUTE, None
        if kind == "route":
            return FrontState.SERVING, (what or "").removeprefix("tcp/")
        if kind == "refuse":
            return FrontState.REFUSING, what
        if kind == "hold":
            by = rec.by
            alive = by is not None and is_alive(ProcessId(by[0], by[1]))
            return (FrontState.HOLDING if alive else FrontState.STRANDED), None
        return FrontState.NO_ROUTE, None

    def describe(self) -> str:
        """One line for ``ps``: the state, and what to do when nothing serves."""
        state, what = self.live()
        rec = self.record
        name = rec.unit or "?"
        if state == FrontState.SERVING:
            return f"front {rec.address} -> {name} ({what}): serving"
        if state == FrontState.HOLDING:
            return f"front {rec.address}: holding requests ({rec.reason})"
        if state == FrontState.STRANDED:
            nxt = rec.next or name
            return (f"front {rec.address}: holding requests for {rec.reason or 'a swap'}, and the gpuslate that held "
                    f"it is gone; they wait, then fail: 'gpuslate up {nxt}' routes it (to {nxt} if it runs, else "
                    f"once started), 'gpuslate down {name}' ends it")
        if state == FrontState.REFUSING:
            return f"front {rec.address}: answers 503, no unit serves it ({what}); 'gpuslate up {rec.next or name}'"
        if state == FrontState.NO_ROUTE:
            return (f"front {rec.address}: its route process is gone: requests are held until it fails them; "
                    f"'gpuslate up {name}' starts it again and routes it (the unit left running), "
                    f"'gpuslate down {name}' ends it")
        if state == FrontState.DOWN:
            return (f"front {rec.address}: its process is gone (clients are refused); 'gpuslate up {name}' starts it "
                    "again and routes it (the unit left running)")
        return f"front {rec.address}: stopped"

    def to_json(self) -> dict[str, Any]:
        state, what = self.live()
        rec = self.record
        return {"name": rec.name, "address": rec.address, "state": state.value, "unit": rec.unit,
                "next": rec.next, "upstream": what if state == FrontState.SERVING else None,
                "reason": what if state == FrontState.REFUSING else rec.reason,
                "pid": self.procs.record.pid if self.procs and self.procs.record else None,
                "last_swap": rec.last_swap}

    def counters_now(self) -> tuple[int, int] | None:
        """(held, through) now; None when the front does not answer."""
        try:
            c = read_counters(self.admin, self.paths.route)
        except AdminError:
            return None
        return c.held, c.through

    # -- steering -----------------------------------------------------------------

    def _save(self, **changes: Any) -> None:
        self.record = replace(self.record, since=time.time(), **changes)
        front_store(self.host).write_file(f"{self.record.name}.state",
                                          json.dumps(self.record.to_json(), indent=2).encode())

    def hold(self, reason: str, next_unit: str | None) -> HoldMeter:
        """Close the route: requests arriving from now on wait in the front. The record says so
        first (a gpuslate killed right after leaves a named state), then the route closes."""
        self._save(phase=FrontPhase.HOLDING, reason=reason, next=next_unit, by=_me())
        meter = HoldMeter(self.admin, self.paths.route)
        self.route_admin.load(hold_config(admin=self.paths.route_admin))
        return meter

    def drain(self, timeout: float, poll: float = 0.01) -> DrainReport:
        """Wait until no request is through to the old unit (streams included), at most ``timeout``."""
        t0 = time.monotonic()
        first = read_counters(self.admin, self.paths.route).through
        now = first
        deadline = t0 + timeout
        while now > 0 and time.monotonic() < deadline:
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
            try:
                now = read_counters(self.admin, self.paths.route).through
            except AdminError:
                break
        if now:
            self.host.note(f"drain: {now} request{'s' if now != 1 else ''} still running after {timeout:g} s: "
                           "cut when the unit stops")
        return DrainReport(in_flight=first, drained=max(0, first - now), cut=now, seconds=time.monotonic() - t0,
                           timeout_s=timeout)

    def route(self, spec: UnitSpec, meter: HoldMeter | None) -> HoldReport | None:
        """Open the route to ``spec``'s address (its ``ready_host:port``, and nothing else)."""
        if spec.port is None:
            raise UsageError(f"unit {spec.name} has no port: a front routes to a unit's port")
        upstream = format_front(spec.ready_host, spec.port)
        self.route_admin.load(route_config(admin=self.paths.route_admin, route=self.paths.route, upstream=upstream))
        report = meter.stop() if meter is not None else None
        self._save(phase=FrontPhase.SERVING, unit=spec.name, upstream=upstream, next=None, reason=None, by=None)
        return report

    def refuse(self, reason: str, meter: HoldMeter | None, next_unit: str | None = None) -> HoldReport | None:
        """Answer 503 at once, with ``reason``: nothing serves the front, and it says so."""
        try:
            self.route_admin.load(refuse_config(admin=self.paths.route_admin, route=self.paths.route, reason=reason))
        except AdminError as exc:
            self.host.note(f"front {self.record.address}: could not make it refuse requests ({exc})")
        report = meter.stop() if meter is not None else None
        self._save(phase=FrontPhase.REFUSING, reason=reason, next=next_unit, by=None, upstream=None)
        return report

    def remember(self, report: FrontReport) -> None:
        self._save(last_swap=report.to_json())

    def stop(self) -> DownResult | None:
        """End the front's processes (as ``down`` ends a unit's: audited, verified gone)."""
        result = None
        if self.procs is not None:
            result = stop_loaded(self.host, self.procs, DownOptions(), units=front_store(self.host))
        self._save(phase=FrontPhase.STOPPED, by=None, upstream=None)
        return result


def start_front(host: HostContext, spec: UnitSpec, *, unit: str, next_unit: str | None = None) -> Front:
    """Start a front's processes for ``spec.front``, holding (the route closed), under the host lock:
    pre-flight (Caddy installed and recent enough, the port free), launch as a unit is launched,
    ready once both Caddy processes answer. Raises (nothing left running) when it cannot."""
    addr = spec.front_address
    assert addr is not None
    fhost, port = addr
    caddy, _version = find_caddy()
    check_port(fhost, port, for_unit=f"front of {unit}")
    fs = front_store(host)
    paths = front_paths(host, port)
    for sock in (paths.admin, paths.route_admin, paths.route):  # Caddy's own, left by a killed one
        try:
            if os.path.exists(sock) and not os.path.isdir(sock):
                os.unlink(sock)
        except OSError:
            pass
    fs.write_file(os.path.basename(paths.front_config), json.dumps(front_config(
        host=fhost, port=port, admin=paths.admin, route=paths.route, hold_s=spec.front_hold)).encode())
    fs.write_file(os.path.basename(paths.route_config), json.dumps(hold_config(admin=paths.route_admin)).encode())
    os.makedirs(paths.home, mode=0o700, exist_ok=True)
    probe_host = "127.0.0.1" if fhost in ("0.0.0.0", "") else "::1" if fhost == "::" else fhost
    proc_spec = UnitSpec(
        name=front_name(port), gpus=[], port=port, ready_host=probe_host, start_timeout=_READY_S, grace=5.0,
        stop_timeout=30.0, containment=spec.containment if spec.containment != Containment.SCOPE else Containment.AUTO,
        env={"XDG_DATA_HOME": paths.home, "XDG_CONFIG_HOME": paths.home},
        # the route process in the background, the front in the foreground (the unit's main process)
        command=["/bin/sh", "-c", '"$0" run --config "$1" & exec "$0" run --config "$2"',
                 str(caddy), paths.route_config, paths.front_config]).validate()
    rec = FrontRecord(name=front_name(port), host=fhost, port=port, unit=unit, phase=FrontPhase.HOLDING,
                      next=next_unit, reason=f"up {next_unit or unit}", by=_me(), since=time.time())
    fs.write_file(f"{rec.name}.state", json.dumps(rec.to_json(), indent=2).encode())
    result = start_checked(host, proc_spec, UpOptions(), units=fs)
    front = Front(host, rec, Unit.load(fs, front_name(port)))
    if not result.ok:
        front._save(phase=FrontPhase.STOPPED, by=None)
        raise NotDoneError(f"the front on {rec.address} did not start: {result.record.failure}",
                           hint="see " + result.record.log)
    deadline = time.monotonic() + _READY_S
    while not (front.admin.alive() and front.route_admin.alive()):
        if time.monotonic() > deadline:
            front.stop()
            raise NotDoneError(f"the front on {rec.address} started, but its admin sockets do not answer",
                               hint="see " + result.record.log)
        time.sleep(0.01)
    return front


def check_front(host: HostContext, spec: UnitSpec, *, replacing: str | None = None) -> Front | None:
    """The front ``spec`` is to be served behind, checked before anything starts: the front that
    serves or awaits ``spec.name`` (or ``replacing``'s), else the one its ``front`` names. A front
    that serves another unit that still runs is refused (exit 2): a swap moves it."""
    front = Front.of_unit(host, spec.name) or (Front.of_unit(host, replacing) if replacing else None)
    addr = spec.front_address
    if addr is not None:
        named = Front.load(host, addr[1])
        if front is not None and named is not None and front.record.name != named.record.name:
            raise UsageError(f"unit {spec.name} is behind front {front.record.address}, not {addr[1]}: "
                             "one unit, one front")
        front = front or named
    if front is None:
        return None
    rec = front.record
    owner = rec.unit
    if owner not in (spec.name, replacing, None) and rec.phase == FrontPhase.SERVING and front.running():
        owner_unit = Unit.load(store.UnitStore.of(host), owner) if owner else None
        if owner_unit is not None and owner_unit.running():
            raise UsageError(f"front {rec.address} serves unit {owner}, which runs: 'gpuslate swap {owner} "
                             f"{spec.name}' moves it")
    return front


def up_behind_front(host: HostContext, spec: UnitSpec, opts: UpOptions, *, started: float | None = None,
                    lock_wait: float = 0.0) -> UpResult:
    """``up``'s start phase with a front: the front first (started, or an existing one made to
    hold), so clients may connect at once and wait; then the unit; then the route to it. A unit that
    fails leaves a front this run started stopped, and an existing one refusing, saying why."""
    front = check_front(host, spec)
    if front is None and spec.front is None:
        return start_checked(host, spec, opts, lock_wait=lock_wait, started=started)
    started_front = False
    if front is None or not front.running() or not front.admin.alive():
        if front is not None and front.running():
            front.stop()
        target = spec if front is None else replace(spec, front=front.record.address)
        front = start_front(host, target, unit=spec.name, next_unit=spec.name)
        started_front = True
        meter = HoldMeter(front.admin, front.paths.route)
    else:
        meter = front.hold(f"up {spec.name}", spec.name)
    try:
        r = start_checked(host, spec, opts, lock_wait=lock_wait, started=started)
    except BaseException:
        if started_front:
            front.stop()
        else:
            front.refuse(f"up {spec.name} was interrupted", meter, spec.name)
        raise
    if r.ok:
        hold = front.route(spec, meter)
        report = FrontReport(address=front.record.address, state=FrontState.SERVING, unit=spec.name,
                             started=started_front, hold=hold)
    elif started_front:
        meter.stop()
        front.stop()
        report = FrontReport(address=front.record.address, state=FrontState.STOPPED, unit=spec.name,
                             started=True, note=f"{spec.name} did not start: the front was stopped")
    else:
        why = f"{spec.name} did not start ({r.record.failure})"
        hold = front.refuse(why, meter, spec.name)
        report = FrontReport(address=front.record.address, state=FrontState.REFUSING, unit=spec.name, hold=hold,
                             note=why)
    return replace(r, front=report)



#: what ``ps`` calls a front that serves no one while its unit may run: ``up NAME`` routes it again
LEFT_STATES = (FrontState.STRANDED, FrontState.NO_ROUTE, FrontState.DOWN)


def reroute(host: HostContext, unit: Unit, *, started: float | None = None, lock_wait: float = 0.0) -> UpResult | None:
    """``up NAME`` of unit ``unit``, which runs (loaded under the host lock its caller holds): when
    the front that serves it, or was held for it, serves no one (``ps``: stranded, no_route, down),
    route it to the unit again and say so: a stranded front is routed at once (the requests it held
    go through); one whose route or own process is gone is started again first (the requests its
    live process still held are cut, and counted in the note). None when no front of the unit is in
    such a state (``up`` then refuses a unit that runs, as ever). The unit must be ready and answer
    its readiness check: otherwise :class:`UsageError`, and nothing is changed."""
    front = Front.of_unit(host, unit.name)
    if front is None or unit.spec is None or unit.record is None:
        return None
    state, _ = front.live()
    if state not in LEFT_STATES:
        return None
    t0 = phase_start(host, "reroute", started)
    spec, rec, address = unit.spec, unit.record, front.record.address
    now = unit.state()
    if now != UnitState.READY:
        raise UsageError(f"front {address} is {state} and unit {unit.name} runs, but is {now}: nothing routed",
                         hint=f"'gpuslate restart {unit.name}' starts it again behind its front")
    probe = Probe(spec, Path(rec.log))
    if not probe.check():
        raise UsageError(f"front {address} is {state} and unit {unit.name} runs, but does not answer its readiness "
                         f"check ({probe.detail}): nothing routed",
                         hint=f"'gpuslate restart {unit.name}' starts it again behind its front")
    counted = front.counters_now()
    held = counted[0] if counted else 0
    waiting = f"{held} request{'s' if held != 1 else ''}"
    if state == FrontState.STRANDED:
        since = max(0.0, time.time() - front.record.since)
        why = front.record.reason or "a swap"
        front.route(spec, None)
        note = (f"it was stranded (holding for {why} {since:.1f} s, the gpuslate that held it gone): routed to "
                f"{unit.name}; the {waiting} it held went through")
        restarted = False
    else:
        gone = "its route process" if state == FrontState.NO_ROUTE else "its process"
        front.stop()
        front = start_front(host, replace(spec, front=address), unit=unit.name)
        front.route(spec, None)
        lost = f"; the {waiting} it held were cut" if held else ""
        note = f"{gone} was gone: started again and routed to {unit.name}{lost}"
        restarted = True
    host.note(f"front {address}: {note}")
    report = FrontReport(address=address, state=FrontState.SERVING, unit=unit.name, started=restarted, note=note)
    return UpResult(status=UpStatus.READY, record=rec,
                    readiness={"kind": probe.kind, "target": probe.target, "detail": probe.detail}, smoke=None,
                    timings={"lock_s": round(lock_wait, 4), "total_s": time.monotonic() - t0}, log_tail=[],
                    teardown=None, cleared=None, fence_note=None, front=report)
