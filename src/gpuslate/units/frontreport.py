"""What a front did in one verb (``front`` in the up, swap, restart and down documents), and what
a front does now: the records :mod:`.front` fills, kept apart so that the verbs' results
(:mod:`.lifecycle`, :mod:`.swap`) can carry them without importing the front's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..front.counters import HoldReport


class FrontState(str, Enum):
    """What a front does now, read from its processes and its route (``ps``)."""

    SERVING = "serving"
    HOLDING = "holding"  # steered by a gpuslate that still runs
    STRANDED = "stranded"  # holding, and the gpuslate that held it is gone: requests wait, then fail
    REFUSING = "refusing"
    NO_ROUTE = "no_route"  # the route process is gone: requests are held until the front's bound
    DOWN = "down"  # the front's process is gone: clients are refused
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True, slots=True)
class DrainReport:
    """The requests that were through to the old unit when the front began to hold."""

    in_flight: int  # through to the old unit at the hold
    drained: int  # of them, finished within the bound
    cut: int  # still running at the bound: cut when the unit is stopped, and counted here
    seconds: float  # the wait
    timeout_s: float

    def to_json(self) -> dict[str, Any]:
        return {"in_flight": self.in_flight, "drained": self.drained, "cut": self.cut,
                "seconds": round(self.seconds, 4), "timeout_s": self.timeout_s}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DrainReport:
        return cls(in_flight=int(d["in_flight"]), drained=int(d["drained"]), cut=int(d["cut"]),
                   seconds=float(d["seconds"]), timeout_s=float(d["timeout_s"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class FrontReport:
    """What a front did in one verb, and where it was left (``front`` in the swap, restart, up and
    down documents)."""

    address: str  # where clients connect
    state: FrontState  # where it was left
    unit: str | None  # the unit it serves (serving), or was left for
    started: bool = False  # its processes were started by this verb
    hold: HoldReport | None = None
    drain: DrainReport | None = None
    note: str | None = None  # what went wrong, when the front was not left serving

    @property
    def ok(self) -> bool:
        return self.state in (FrontState.SERVING, FrontState.STOPPED)

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "state": self.state.value, "unit": self.unit, "started": self.started,
                "hold": self.hold.to_json() if self.hold else None,
                "drain": self.drain.to_json() if self.drain else None, "note": self.note}

    @classmethod
    def from_json(cls, d: Any) -> FrontReport:
        if not isinstance(d, dict):
            raise ValueError("front: not an object")
        return cls(address=str(d["address"]), state=FrontState(d["state"]), unit=d.get("unit"),
                   started=bool(d.get("started")),
                   hold=HoldReport.from_json(d["hold"]) if d.get("hold") else None,
                   drain=DrainReport.from_json(d["drain"]) if d.get("drain") else None, note=d.get("note"))
