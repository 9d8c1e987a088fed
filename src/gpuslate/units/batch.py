"""``up``, ``down`` and ``restart`` of several units at once, or of every unit of the unit file.

As ``docker compose up``/``down``/``restart`` with several service names, or none (every service
of the project):

* ``up``: the units in the order given (the file's order for all of them); a unit already running
  is left as it is and said so (compose leaves a running container alone), the first that fails
  stops the batch: the ones after it are not started (they would meet the GPUs or the port it
  left in doubt), and are listed as such;
* ``down``: the units in the reverse order (compose stops in reverse), every one of them even when
  one fails (stopping as much as can be stopped); a unit of the file never started is skipped;
* ``restart``: in the order given, stopping at the first failure, as ``up``.

Each unit goes through the one-unit verb (:func:`~.updown.up`'s phases: its record read once
under the lock, for the skip and the guards; :func:`~.updown.down`, :func:`~.restart.restart`)
on the same host context; the batch is a value with its status and
every unit's own result document, read back with ``from_json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from .._document import Fields, Malformed, checked, reading
from ..errors import UsageError
from ..host.session import HostContext
from ..options import DownOptions, RestartOptions, UpOptions
from ..outcome import Outcome, Parted, PartedStatus
from .front import reroute, up_behind_front
from .lifecycle import (
    DOWN_SCHEMA,
    UP_SCHEMA,
    DownResult,
    UpResult,
    check_startable,
)
from .restart import RESTART_SCHEMA, RestartResult, restart
from .spec import UnitSpec
from .store import UnitStore
from .unit import Unit
from .updown import down

BATCH_SCHEMA = "gpuslate.batch.v1"
Result = UpResult | DownResult | RestartResult
_READ: dict[str, Callable[[object], Result]] = {UP_SCHEMA: UpResult.from_json, DOWN_SCHEMA: DownResult.from_json,
                                                RESTART_SCHEMA: RestartResult.from_json}


class Verb(str, Enum):
    UP = "up"
    DOWN = "down"
    RESTART = "restart"


class BatchStatus(PartedStatus):
    """How a batch ended: every unit done (or left as it was), or one failed (its own status, and so
    its exit code, is the batch's)."""

    DONE = "done", Outcome.DONE
    FAILED = "failed", Outcome.PARTIAL


class Skipped(NamedTuple):
    name: str
    reason: str  # "already running", "never started"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchResult(Parted):
    verb: Verb
    results: list[Result]  # in the order they ran
    skipped: list[Skipped]  # left as they were
    not_run: list[str]  # not reached: a unit before them failed (up, restart)
    total_s: float

    @property
    def failed(self) -> Result | None:
        """The first unit that failed."""
        return next((r for r in self.results if not r.ok), None)

    @property
    def failed_name(self) -> str | None:
        r = self.failed
        return None if r is None else r.record.name if isinstance(r, UpResult) else r.name

    @property
    def ok(self) -> bool:
        return self.failed is None

    @property
    def status(self) -> BatchStatus:
        return BatchStatus.DONE if self.ok else BatchStatus.FAILED

    def deciding_parts(self) -> list[Result]:
        """Every unit that ran: a batch's exit status is theirs, as a fleet's is its hosts'."""
        return self.results

    def to_json(self) -> dict[str, Any]:
        return {"schema": BATCH_SCHEMA, "ok": self.ok, "status": self.status.value, "verb": self.verb.value,
                "results": [r.to_json() for r in self.results], "skipped": [s.to_json() for s in self.skipped],
                "not_run": self.not_run, "total_s": round(self.total_s, 4)}

    @classmethod
    def from_json(cls, doc: object) -> BatchResult:
        f = Fields(checked(doc, BATCH_SCHEMA))
        with reading(BATCH_SCHEMA):
            f.choice("status", BatchStatus)

            def result(r: object) -> Result:
                read = _READ.get(Fields(r).raw("schema"))
                if read is None:
                    raise Malformed(f"expected an up, down or restart document, got {str(r)[:60]}")
                return read(r)

            def skipped(s: object) -> Skipped:
                one = Fields(s)
                return Skipped(name=one.text("name"), reason=one.text("reason"))
            return cls(verb=f.choice("verb", Verb), results=f.items("results", result),
                       skipped=f.items("skipped", skipped), not_run=f.texts("not_run"), total_s=f.seconds("total_s"))


def _known(units: UnitStore, names: Sequence[str]) -> None:
    """Every name a unit with a record, before any is acted on (bad input does nothing)."""
    for name in names:
        if not units.record_path(name).exists():
            raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps -a'; nothing was done")


def up_many(host: HostContext, specs: Sequence[UnitSpec], options: UpOptions = UpOptions()) -> BatchResult:
    """Start ``specs`` one after another (see the module docstring)."""
    t0 = time.monotonic()
    units = UnitStore.of(host)
    results: list[Result] = []
    skipped: list[Skipped] = []
    opts = options.validate()
    for i, spec in enumerate(specs):
        spec.validate()
        t_unit = time.monotonic()
        with host.locked(f"up {spec.name}", timeout=spec.start_timeout) as waited:
            current = Unit.load(units, spec.name)  # once, under the lock: the skip, the guards, as up's own
            if current is not None and not current.corrupt and current.running():
                try:  # its front left serving no one is routed to it again (as up NAME does)
                    rerouted = reroute(host, current, started=t_unit, lock_wait=waited)
                except UsageError as exc:
                    skipped.append(Skipped(name=spec.name, reason=f"already running; {exc}"))
                    continue
                if rerouted is None:
                    skipped.append(Skipped(name=spec.name, reason="already running"))
                else:
                    results.append(rerouted)
                continue
            check_startable(current, spec.name)
            r = up_behind_front(host, spec, opts, lock_wait=waited, started=t_unit)
        results.append(r)
        if not r.ok:
            return BatchResult(verb=Verb.UP, results=results, skipped=skipped,
                               not_run=[s.name for s in specs[i + 1:]], total_s=time.monotonic() - t0)
    return BatchResult(verb=Verb.UP, results=results, skipped=skipped, not_run=[], total_s=time.monotonic() - t0)


def down_many(host: HostContext, names: Sequence[str], options: DownOptions = DownOptions(), *,
              known_only: bool = False) -> BatchResult:
    """Stop ``names`` in the reverse order, each even when another failed. ``known_only`` (every
    unit of the file): a name without a record was never started, and is skipped."""
    t0 = time.monotonic()
    units = UnitStore.of(host)
    if not known_only:
        _known(units, names)
    results: list[Result] = []
    skipped: list[Skipped] = []
    for name in reversed(names):
        if known_only and not units.record_path(name).exists():
            skipped.append(Skipped(name=name, reason="never started"))
            continue
        results.append(down(host, name, options))
    return BatchResult(verb=Verb.DOWN, results=results, skipped=skipped, not_run=[], total_s=time.monotonic() - t0)


def restart_many(host: HostContext, names: Sequence[str], options: RestartOptions = RestartOptions()) -> BatchResult:
    """Restart ``names`` one after another, stopping at the first that fails."""
    t0 = time.monotonic()
    _known(UnitStore.of(host), names)
    results: list[Result] = []
    for i, name in enumerate(names):
        r = restart(host, name, options)
        results.append(r)
        if not r.ok:
            return BatchResult(verb=Verb.RESTART, results=results, skipped=[], not_run=list(names[i + 1:]),
                               total_s=time.monotonic() - t0)
    return BatchResult(verb=Verb.RESTART, results=results, skipped=[], not_run=[], total_s=time.monotonic() - t0)
