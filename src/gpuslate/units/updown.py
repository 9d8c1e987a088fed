"""``up`` and ``down``, the verbs: the host lock, the record read once under it, the unit's front.

The phases they run (:func:`~.lifecycle.start_checked`, :func:`~.lifecycle.stop_loaded`) are
:mod:`.lifecycle`'s, shared with ``swap`` and ``restart``; a unit behind a front is started with
its front (:func:`~.front.up_behind_front`: the front first, holding, the route to the unit once
it is ready) and stopped with it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from ..errors import UsageError
from ..host.session import HostContext
from ..options import DownOptions, UpOptions
from . import store
from .front import Front, reroute, up_behind_front
from .frontreport import FrontReport, FrontState
from .lifecycle import DownResult, UpResult, check_startable, stop_loaded
from .spec import UnitSpec
from .unit import Unit


def up(host: HostContext, spec: UnitSpec, options: UpOptions = UpOptions()) -> UpResult:
    """Start ``spec`` as a managed unit and return once it is ready, or failed and was cleaned up.

    Under the host lock of ``host`` (re-entrant: ``swap`` holds it already), from
    the pre-flight until the unit is ready or cleaned up. The unit's record is read once,
    under the lock, for :func:`~.lifecycle.check_startable`; then it is started (behind its
    front, when it has one: :func:`~.front.up_behind_front`). A unit that runs already is not
    started twice; when its front serves no one (stranded, its route or its own process gone), the
    front is routed to it again (:func:`~.front.reroute`)."""
    spec.validate()
    opts = options.validate()
    t0 = time.monotonic()
    with host.locked(f"up {spec.name}", timeout=spec.start_timeout) as waited:
        current = Unit.load(store.UnitStore.of(host), spec.name)  # under the lock: as it is now
        if current is not None and not current.corrupt and current.running():
            rerouted = reroute(host, current, started=t0, lock_wait=waited)
            if rerouted is not None:
                return rerouted
        check_startable(current, spec.name)
        return up_behind_front(host, spec, opts, lock_wait=waited, started=t0)


def down(host: HostContext, name: str, options: DownOptions = DownOptions()) -> DownResult:
    """Stop every process of unit ``name`` and verify its GPUs are released; and its front.

    Processes that hold memory on the unit's GPUs or its port, started while it ran but not found
    in it (a late fork that left the session and renamed itself before any scan recorded it,
    without a cgroup), keep the GPUs busy: ``down`` names them with the command that ends them
    (not ok), and never signals them, ``clear_strays`` or not: only what a tie proves the unit's
    is signaled. One on another GPU only is a warning.
    A unit whose record is corrupt is stopped by what can still be found of it (its cgroup,
    its ``GPUSLATE_UNIT`` marker, its port), and the record is then set aside.
    The front that serves the unit (or was left for it) is stopped first: no request reaches
    a unit that is going. Under the host lock of ``host`` (re-entrant: ``swap`` holds it already)."""
    opts = options.validate()
    units = store.UnitStore.of(host)
    if not units.record_path(name).exists():
        raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
    t0 = time.monotonic()
    with host.locked(f"down {name}", timeout=opts.timeout) as waited:
        u = Unit.load(units, name)  # under the lock: it may have changed while we waited
        if u is None:
            raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps'")
        front = Front.of_unit(host, name)
        report = None
        if front is not None and (front.running() or front.record.phase.value != "stopped"):
            stopped = front.stop()
            ok = stopped is None or stopped.ok
            report = FrontReport(address=front.record.address, state=FrontState.STOPPED if ok else FrontState.DOWN,
                                 unit=name, note=None if ok else "the front's processes could not all be stopped")
        d = stop_loaded(host, u, opts, lock_wait=waited, started=t0)
        return replace(d, front=report) if report is not None else d
