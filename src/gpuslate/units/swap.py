"""``swap OLD NEW``: down OLD, verify its GPUs clean, up NEW, wait until it serves;
each phase timed. With ``rollback``, a NEW that fails is followed by OLD started
again (with the spec it last ran with) and made ready.

The whole swap holds the host lock once, so no ``clear`` or other ``up`` can
slip in between the old server leaving the GPUs and the new one taking them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from ..errors import UsageError
from ..gpu import GpuBackend
from ..proc.tree import ProcTable
from . import store
from .contain import unit_processes
from .lifecycle import DownResult, UpResult, backend_for, down, host_lock, up
from .spec import UnitSpec, resolve

SWAP_SCHEMA = "gpuslate.swap.v1"


class SwapResult(NamedTuple):
    old: str
    new: str
    status: str  # swapped | down_failed | up_failed | rolled_back | rollback_failed
    down: DownResult
    up: UpResult | None
    rollback: UpResult | None
    phases: dict[str, float]  # lock_wait_s, stop_old_s, verify_clean_s, preflight_new_s, launch_new_s,
    #                           ready_new_s, smoke_new_s, rollback_s (present when they ran)
    total_s: float

    @property
    def ok(self) -> bool:
        return self.status == "swapped"

    @property
    def overhead_s(self) -> float | None:
        """Total minus the old server's teardown and the new server's startup: what gpuslate adds."""
        if not self.ok:
            return None
        p = self.phases
        return self.total_s - p["stop_old_s"] - p["verify_clean_s"] - p["ready_new_s"] - p.get("smoke_new_s", 0.0)

    def to_json(self) -> dict[str, Any]:
        ov = self.overhead_s
        return {
            "schema": SWAP_SCHEMA, "ok": self.ok, "status": self.status, "old": self.old, "new": self.new,
            "phases": {k: round(v, 4) for k, v in self.phases.items()}, "total_s": round(self.total_s, 4),
            "overhead_s": round(ov, 4) if ov is not None else None,
            "down": self.down.to_json(), "up": self.up.to_json() if self.up else None,
            "rollback": self.rollback.to_json() if self.rollback else None,
        }


def swap(old: str, new: str | UnitSpec, *, rollback: bool = False, config: str | None = None,
         sim: str | None = None, backend: GpuBackend | None = None, lock: bool = True,
         on_event: Callable[[str], None] | None = None) -> SwapResult:
    """Replace unit ``old`` with ``new`` (a unit name resolved like ``up NAME``, or a spec)."""
    t0 = time.monotonic()
    old_rec = store.load(old)
    if old_rec is None:
        raise UsageError(f"unknown unit {old!r}: see 'gpuslate ps'")
    old_spec = UnitSpec.from_json(old_rec.spec).validate()
    if isinstance(new, UnitSpec):
        new_spec = new.validate()
    else:
        prev = store.load(new)
        new_spec = resolve(new, config=config, previous=prev.spec if prev else None)
    new_rec = store.load(new_spec.name)
    if new_spec.name != old and new_rec is not None and unit_processes(new_rec, ProcTable()):
        raise UsageError(f"unit {new_spec.name} is already running: nothing to swap to")
    with backend_for(sim, backend) as be, \
            host_lock(be, f"swap {old} -> {new_spec.name}", lock, on_event) as waited:
        phases: dict[str, float] = {"lock_wait_s": waited}
        d = down(old, backend=be, lock=False, on_event=on_event)
        phases["stop_old_s"] = d.report.timings["stop_s"]
        phases["verify_clean_s"] = d.report.timings["verify_s"]
        if not d.ok:
            return SwapResult(old, new_spec.name, "down_failed", d, None, None, phases, time.monotonic() - t0)
        u = up(new_spec, backend=be, lock=False, on_event=on_event)
        phases["preflight_new_s"] = u.timings["preflight_s"]
        phases["launch_new_s"] = u.timings["launch_s"]
        if u.time_to_ready is not None:
            phases["ready_new_s"] = u.time_to_ready
        if "smoke_s" in u.timings:
            phases["smoke_new_s"] = u.timings["smoke_s"]
        if u.ok:
            return SwapResult(old, new_spec.name, "swapped", d, u, None, phases, time.monotonic() - t0)
        if not rollback:
            return SwapResult(old, new_spec.name, "up_failed", d, u, None, phases, time.monotonic() - t0)
        if on_event:
            on_event(f"{new_spec.name} failed ({u.record.failure}); rolling back to {old}")
        t_rb = time.monotonic()
        rb = up(old_spec, backend=be, lock=False, on_event=on_event)
        phases["rollback_s"] = time.monotonic() - t_rb
        status = "rolled_back" if rb.ok else "rollback_failed"
        return SwapResult(old, new_spec.name, status, d, u, rb, phases, time.monotonic() - t0)
