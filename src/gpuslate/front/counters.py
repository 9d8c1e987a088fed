"""What clients see at a front, read from its Caddy: held requests, requests through, errors.

Two readings of the front process, each one admin call:

* ``/metrics`` (the HTTP metrics of the ``front`` server): ``caddy_http_requests_in_flight``
  counts a request from its arrival until its answer is sent (held ones included);
  ``caddy_http_requests_total`` counts it once done, ``caddy_http_request_errors_total`` when the
  front itself failed it (a hold that ran out, a reset it could not retry). So arrivals are
  ``in_flight + total`` (a request leaving is counted in both for a moment, never in neither);
* ``/reverse_proxy/upstreams``: the route socket's ``num_requests``, the requests through the
  front to the unit right now (streams until their last byte). A held request is counted there
  only for the microseconds of each refused dial.

Held now = in flight at the front - through to the unit.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from .admin import Admin, AdminError

_SAMPLE = re.compile(r'^(caddy_http_(?:requests_in_flight|requests_total|request_errors_total))'
                     r'\{([^}]*)\}\s+([0-9.eE+-]+|NaN)\s*$')


class FrontCounters(NamedTuple):
    in_flight: int  # at the front: held, or through to the unit
    done: int  # answered (or failed) since the front started
    errors: int  # failed by the front itself (502/503 of its own)
    through: int  # through to the unit right now

    @property
    def arrived(self) -> int:
        return self.in_flight + self.done

    @property
    def held(self) -> int:
        return max(0, self.in_flight - self.through)


def parse_metrics(text: str, server: str = "front") -> tuple[int, int, int]:
    """(in flight, total, errors) of ``server`` in a Prometheus text page (summed over handlers)."""
    out = {"caddy_http_requests_in_flight": 0.0, "caddy_http_requests_total": 0.0,
           "caddy_http_request_errors_total": 0.0}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or f'server="{server}"' not in m[2]:
            continue
        v = float(m[3])
        if math.isfinite(v) and v >= 0:
            out[m[1]] += v
    return (int(out["caddy_http_requests_in_flight"]), int(out["caddy_http_requests_total"]),
            int(out["caddy_http_request_errors_total"]))


def through(upstreams: Any, route: str) -> int:
    """``num_requests`` of the route socket in ``/reverse_proxy/upstreams`` (0 when not listed)."""
    if not isinstance(upstreams, list):
        raise AdminError("/reverse_proxy/upstreams: not a list")
    n = 0
    for u in upstreams[:1000]:
        if isinstance(u, dict) and u.get("address") == f"unix/{route}":
            v = u.get("num_requests")
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                n += v
    return n


def read_counters(admin: Admin, route: str) -> FrontCounters:
    text = admin.get_text("/metrics")
    ups = admin.get_json("/reverse_proxy/upstreams")
    in_flight, done, errors = parse_metrics(text)
    return FrontCounters(in_flight, done, errors, through(ups, route))


@dataclass(frozen=True, kw_only=True, slots=True)
class HoldReport:
    """What the clients of a front saw while it held: by keywords only."""

    held: int  # requests that arrived while the front held (each waited for the switch)
    longest_hold_s: float  # from the first of them arriving to the front letting them through
    most_held: int  # the most held at one time
    failed: int  # requests the front failed itself meanwhile (its hold ran out, a reset)
    seconds: float  # from the hold to the route (what a request arriving first waited at most)
    resolution_s: float  # the counters were read this often: longest_hold_s is at most this over

    def to_json(self) -> dict[str, Any]:
        return {"held": self.held, "longest_hold_s": round(self.longest_hold_s, 4), "most_held": self.most_held,
                "failed": self.failed, "seconds": round(self.seconds, 4), "resolution_s": self.resolution_s}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HoldReport:
        return cls(held=int(d["held"]), longest_hold_s=float(d["longest_hold_s"]), most_held=int(d["most_held"]),
                   failed=int(d["failed"]), seconds=float(d["seconds"]), resolution_s=float(d["resolution_s"]))


class HoldMeter:
    """Reads a holding front's counters every ``interval`` seconds on a thread, from the hold
    until :meth:`stop` (the route is open again): how many arrived, when the first did, the most
    held at once, the front's own failures. A reading that fails is skipped (the next one counts)."""

    def __init__(self, admin: Admin, route: str, interval: float = 0.01) -> None:
        self._admin, self._route, self.interval = admin, route, interval
        self.started = time.monotonic()
        self.first = read_counters(admin, route)
        self._last_quiet = self.started  # the last reading at which nothing had arrived yet
        self.first_arrival: float | None = None
        self.most_held = 0
        self.last = self.first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuslate-holdmeter", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            c = read_counters(self._admin, self._route)
        except AdminError:
            return
        now = time.monotonic()
        if self.first_arrival is None:
            if c.arrived > self.first.arrived:
                self.first_arrival = self._last_quiet
            else:
                self._last_quiet = now
        self.most_held = max(self.most_held, c.held)
        self.last = c

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._read()

    def stop(self) -> HoldReport:
        """The report, up to now (call it right after the route opened)."""
        self._stop.set()
        self._thread.join(5.0)
        self._read()
        end = time.monotonic()
        arrived = self.last.arrived - self.first.arrived
        longest = end - self.first_arrival if self.first_arrival is not None and arrived else 0.0
        return HoldReport(held=max(0, arrived), most_held=self.most_held, longest_hold_s=longest,
                          failed=max(0, self.last.errors - self.first.errors), seconds=end - self.started,
                          resolution_s=self.interval)
