"""``rm NAME...``: forget units nothing of which runs: their records and their logs.

As ``docker rm`` removes a stopped container (its configuration and its logs) and refuses a
running one, ``rm`` removes a unit that is ``stopped``, ``failed`` or ``exited`` and refuses
every other state, before removing anything: a unit with live processes (``starting``,
``ready``, ``orphaned``: ``down`` stops it first), and one whose record is corrupt (the record
is the last clue to what may still run: ``down`` stops what is found of it and sets it aside).
The audit log keeps every signal ever sent to it. Under the host lock, so no ``up`` of the same
name starts while its record goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from .._document import Fields, checked, reading
from ..errors import UsageError
from ..host.session import HostContext
from ..outcome import Outcome, StatusEnum
from ..proc.tree import ProcTable
from ..unitname import UnitName
from .state import UnitState
from .store import UnitStore
from .unit import Unit

RM_SCHEMA = "gpuslate.rm.v1"
#: the states in which a unit may be removed: nothing of it runs
REMOVABLE = (UnitState.STOPPED, UnitState.FAILED, UnitState.EXITED)


class RmStatus(StatusEnum):
    """How an ``rm`` ended: it removes every unit named, or (bad input) none."""

    REMOVED = "removed", Outcome.DONE


class Removed(NamedTuple):
    name: str
    state: UnitState  # what it was
    files: list[str]  # the record and the logs removed

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state.value, "files": self.files}


class RmResult(NamedTuple):
    units: list[Removed]

    @property
    def ok(self) -> bool:
        return True

    @property
    def status(self) -> RmStatus:
        return RmStatus.REMOVED

    def to_json(self) -> dict[str, Any]:
        return {"schema": RM_SCHEMA, "ok": True, "status": self.status.value,
                "units": [u.to_json() for u in self.units]}

    @classmethod
    def from_json(cls, doc: object) -> RmResult:
        f = Fields(checked(doc, RM_SCHEMA))
        with reading(RM_SCHEMA):
            f.choice("status", RmStatus)

            def removed(d: object) -> Removed:
                u = Fields(d)
                return Removed(u.text("name"), u.choice("state", UnitState), u.texts("files"))
            return cls(f.items("units", removed))


def rm(host: HostContext, names: Sequence[str]) -> RmResult:
    """Remove the records and logs of the units ``names``, each stopped, failed or exited; a unit
    in any other state (or unknown, or corrupt) is :class:`UsageError` and nothing is removed."""
    wanted = list(dict.fromkeys(UnitName(n) for n in names))
    if not wanted:
        raise UsageError("rm needs the names of the units to remove")
    units = UnitStore.of(host)
    with host.locked(f"rm {' '.join(wanted)}"):
        table = ProcTable()
        found: list[tuple[str, UnitState]] = []
        for name in wanted:
            u = Unit.load(units, name)
            if u is None:
                raise UsageError(f"unknown unit {name!r}: see 'gpuslate ps -a'")
            if u.corrupt:
                raise UsageError(u.describe_problem(), hint=f"'gpuslate down {name}' stops what is found of it "
                                 "and sets the record aside")
            state = u.state(table)
            if state not in REMOVABLE:
                what = "still has processes" if state is UnitState.ORPHANED else "is running"
                raise UsageError(f"unit {name} {what} ({state.value}): nothing was removed",
                                 hint=f"stop it first with 'gpuslate down {name}'")
            found.append((name, state))
        return RmResult([Removed(name, state, [str(p) for p in units.remove(name)]) for name, state in found])
