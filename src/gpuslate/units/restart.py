"""``restart NAME``: stop a unit and start it again with the spec it last ran with.

As ``docker compose restart``: what restarts is the unit as it was started (its recorded spec),
not what the unit file says now (``down`` then ``up`` takes the file's). A running unit is
restarted by :func:`~.swap.swap_loaded` to itself, under one hold of the host lock: ``down`` (its GPUs
verified free), then ``up``, with the downtime measured as ``swap`` measures it; a unit nothing
of which runs (stopped, failed, exited) is started with ``up``'s start phase. Its record is read
once, under the lock, and handed to those phases. The weights are not prefetched
by default: the server that just ran them has them in the page cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .._document import Fields, checked, reading
from ..errors import UsageError
from ..host.session import HostContext
from ..options import RestartOptions, SwapOptions, UpOptions
from ..outcome import Outcome, Parted, PartedStatus
from ..unitname import UnitName
from .front import up_behind_front
from .frontreport import FrontReport
from .lifecycle import DownResult, UpResult
from .state import UnitState
from .store import UnitStore
from .swap import SwapStatus, swap_loaded
from .unit import Unit

RESTART_SCHEMA = "gpuslate.restart.v1"


class RestartStatus(PartedStatus):
    """How a ``restart`` ended (the JSON ``status``)."""

    RESTARTED = "restarted", Outcome.DONE  # ready again
    DOWN_FAILED = "down_failed", Outcome.NOT_DONE  # not stopped cleanly: not started again
    UP_FAILED = "up_failed", Outcome.FAILED  # stopped, then did not come up (cleaned up by up)


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartResult(Parted):
    name: str
    status: RestartStatus
    previous_state: UnitState
    down: DownResult | None  # None: nothing of it ran
    up: UpResult | None  # None: not started again (the down failed)
    total_s: float
    downtime_s: float | None = None  # told to stop -> ready again (as swap's); None unless it ran
    front: FrontReport | None = None  # what the clients of its front saw

    @property
    def ok(self) -> bool:
        return self.status == RestartStatus.RESTARTED

    def deciding_parts(self) -> list[DownResult | UpResult]:
        """The part whose failure decides this one's exit status (stopping OLD, else starting NEW)."""
        return [part for part in (self.down, self.up) if part is not None and not part.ok][:1]

    def to_json(self) -> dict[str, Any]:
        return {"schema": RESTART_SCHEMA, "ok": self.ok, "status": self.status.value, "name": self.name,
                "previous_state": self.previous_state.value, "total_s": round(self.total_s, 4),
                "downtime_s": round(self.downtime_s, 4) if self.downtime_s is not None else None,
                "down": self.down.to_json() if self.down is not None else None,
                "up": self.up.to_json() if self.up is not None else None,
                "front": self.front.to_json() if self.front is not None else None}

    @classmethod
    def from_json(cls, doc: object) -> RestartResult:
        f = Fields(checked(doc, RESTART_SCHEMA))
        with reading(RESTART_SCHEMA):
            return cls(name=f.text("name"), status=f.choice("status", RestartStatus),
                       previous_state=f.choice("previous_state", UnitState),
                       down=f.opt_record("down", DownResult.from_json), up=f.opt_record("up", UpResult.from_json),
                       total_s=f.seconds("total_s"), downtime_s=f.opt_seconds("downtime_s"),
                       front=f.opt_record("front", FrontReport.from_json, default=None))


def restart(host: HostContext, name: str, options: RestartOptions = RestartOptions()) -> RestartResult:
    """Stop unit ``name`` (when anything of it runs) and start it again with its recorded spec."""
    name = UnitName(name)
    units = UnitStore.of(host)
    t0 = time.monotonic()
    with host.locked(f"restart {name}"):
        u = Unit.load(units, name)
        if u is None:
            raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps -a'")
        if u.spec is None:
            raise UsageError(u.describe_problem(), hint=f"'gpuslate down {name}' stops what is left of it")
        state = u.state()
        if not u.running():  # the guards of up passed: not corrupt (it has a spec), nothing of it runs
            started = up_behind_front(host, u.spec, UpOptions())
            return RestartResult(name=name, status=RestartStatus.RESTARTED if started.ok else RestartStatus.UP_FAILED,
                                 previous_state=state, down=None, up=started, total_s=time.monotonic() - t0,
                                 front=started.front)
        s = swap_loaded(host, u, u.spec, SwapOptions(prefetch=options.prefetch,  # u as loaded here
                                                      drain_timeout=options.drain_timeout))
        status = (RestartStatus.RESTARTED if s.status is SwapStatus.SWAPPED else
                  RestartStatus.DOWN_FAILED if s.status is SwapStatus.DOWN_FAILED else RestartStatus.UP_FAILED)
        return RestartResult(name=name, status=status, previous_state=state, down=s.down, up=s.up,
                             total_s=time.monotonic() - t0, downtime_s=s.downtime_s, front=s.front)
