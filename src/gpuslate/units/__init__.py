"""Managed units: model servers started, watched, stopped and swapped by gpuslate.

    up(host, spec)      start, return once ready (or failed and cleaned up)
    down(host, name)    stop every process of the unit, verify its GPUs released
    swap(host, old, new)  down + verify + up, phases timed; optional rollback
    list_units(host)    every unit with its live state (ps; PsOptions(all=False): as ps without -a)
    restart(host, name)   down + up with the spec it last ran with
    rm(host, names)     remove the records and logs of units nothing of which runs
    up_many / down_many / restart_many   several units (or all of the file) at once (batch.py)
    resolve(name, ...)  a unit's spec from gpuslate.toml / the command line / its last run
    UnitStore.of(host)  the unit records of the host's state folder
    Unit.load(units, name)  one unit, loaded once: record (or why it is corrupt), spec, fence
    unit_state(facts)   the pure decision behind ps's states

The verbs take the :class:`~gpuslate.host.session.HostContext` they run on
first and an options object last; the public way in is ``gpuslate.Host``,
whose methods ``host.up(spec)``, ``host.down(name)``... call these.
Each returns a result object with ``ok`` and ``to_json()``; nothing here
prints or exits. See docs/units.md.

The names below load on first use (PEP 562, as ``gpuslate``'s own): importing one module of the
package (``units.spec``, ``units.logfile``) does not import every other (``gpuslate logs`` needs
no ``swap``, shell completion only the engines' names).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it
_EXPORTS = {
    "BatchResult": "batch", "down_many": "batch", "restart_many": "batch", "up_many": "batch",
    "DownResult": "lifecycle", "UpResult": "lifecycle", "down": "updown", "up": "updown",
    "PsResult": "listing", "UnitStatus": "listing", "list_units": "listing",
    "RmResult": "remove", "rm": "remove",
    "RestartResult": "restart", "restart": "restart",
    "UnitSpec": "spec", "resolve": "spec",
    "UnitFacts": "state", "UnitState": "state", "unit_state": "state",
    "UnitStore": "store",
    "SwapResult": "swap", "swap": "swap",
    "Unit": "unit",
    "DownOptions": "..options", "PsOptions": "..options", "RestartOptions": "..options", "SwapOptions": "..options",
    "UpOptions": "..options",
}

if TYPE_CHECKING:
    from ..options import DownOptions, PsOptions, RestartOptions, SwapOptions, UpOptions
    from .batch import BatchResult, down_many, restart_many, up_many
    from .lifecycle import DownResult, UpResult
    from .listing import PsResult, UnitStatus, list_units
    from .remove import RmResult, rm
    from .restart import RestartResult, restart
    from .spec import UnitSpec, resolve
    from .state import UnitFacts, UnitState, unit_state
    from .store import UnitStore
    from .swap import SwapResult, swap
    from .unit import Unit
    from .updown import down, up


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module if module.startswith("..") else "." + module, __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = [
           "BatchResult",
           "DownOptions",
           "DownResult",
           "PsOptions",
           "PsResult",
           "RestartOptions",
           "RestartResult",
           "RmResult",
           "SwapOptions",
           "SwapResult",
           "Unit",
           "UnitFacts",
           "UnitSpec",
           "UnitState",
           "UnitStatus",
           "UnitStore",
           "UpOptions",
           "UpResult",
           "down",
           "down_many",
           "list_units",
           "resolve",
           "restart",
           "restart_many",
           "rm",
           "swap",
           "unit_state",
           "up",
           "up_many",
]
