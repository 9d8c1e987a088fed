"""``swap OLD NEW``: down OLD, verify its GPUs clean, up NEW, wait until it serves;
each phase timed. With ``rollback``, a NEW that fails is followed by OLD started
again (with the spec it last ran with) and made ready.

The whole swap holds the host lock once, so no ``clear`` or other ``up`` can
slip in between the old server leaving the GPUs and the new one taking them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, NamedTuple

from ..errors import UsageError
from ..gpu import GpuBackend
from . import store
from .hostctx import backend_for, host_lock
from .lifecycle import DownResult, UpResult, down, up
from .spec import UnitSpec, resolve
from .unit import Unit

SwapStatus = Literal["swapped", "down_failed", "up_failed", "rolled_back", "rollback_failed"]

SWAP_SCHEMA = "gpuslate.swap.v1"


class SwapResult(NamedTuple):
    old: str
    new: str
    status: SwapStatus
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
    """Replace unit ``old`` with ``new`` (a unit name resolved like ``up NAME``, or a spec).

    Each unit is loaded once, under the host lock, and handed to ``down`` and ``up``."""
    t0 = time.monotonic()
    new_name = new.name if isinstance(new, UnitSpec) else new
    if not store.record_path(old).exists():  # before waiting for the lock: a typo fails at once
        raise UsageError(f"unknown unit {old!r}: see 'gpuslate ps'")
    with backend_for(sim, backend) as be, \
            host_lock(be, f"swap {old} -> {new_name}", lock, on_event) as waited:
        old_unit = Unit.load(old)
        if old_unit is None:
            raise UsageError(f"unknown unit {old!r}: see 'gpuslate ps'")
        if old_unit.spec is None:
            raise UsageError(old_unit.describe_problem(), hint=f"'gpuslate down {old}' stops what is left of it")
        new_unit = old_unit if new_name == old else Unit.load(new_name)
        if new_unit is not None and new_unit.corrupt:
            raise UsageError(new_unit.describe_problem(), hint=f"'gpuslate down {new_name}' stops what is left of it")
        if isinstance(new, UnitSpec):
            new_spec = new.validate()
        else:
            new_spec = resolve(new, config=config, previous=new_unit.spec.to_json() if new_unit and new_unit.spec
                               else None)
        if new_name != old and new_unit is not None and new_unit.running():
            raise UsageError(f"unit {new_name} is already running: nothing to swap to")
        phases: dict[str, float] = {"lock_wait_s": waited}
        d = down(old, backend=be, lock=False, on_event=on_event, unit=old_unit)
        phases["stop_old_s"] = d.report.timings["stop_s"]
        phases["verify_clean_s"] = d.report.timings["verify_s"]
        if not d.ok:
            return SwapResult(old, new_spec.name, "down_failed", d, None, None, phases, time.monotonic() - t0)
        u = up(new_spec, backend=be, lock=False, on_event=on_event, unit=new_unit)
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
        rb = up(old_unit.spec, backend=be, lock=False, on_event=on_event, unit=old_unit)
        phases["rollback_s"] = time.monotonic() - t_rb
        status = "rolled_back" if rb.ok else "rollback_failed"
        return SwapResult(old, new_spec.name, status, d, u, rb, phases, time.monotonic() - t0)
