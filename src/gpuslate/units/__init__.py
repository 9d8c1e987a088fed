"""Managed units: model servers started, watched, stopped and swapped by gpuslate.

    up(spec)            start, return once ready (or failed and cleaned up)
    down(name)          stop every process of the unit, verify its GPUs released
    swap(old, new)      down + verify + up, phases timed; optional rollback
    list_units()        every unit with its live state (ps)
    resolve(name, ...)  a unit's spec from gpuslate.toml / the command line / its last run
    Unit.load(name)     one unit, loaded once: record (or why it is corrupt), spec, fence
    unit_state(facts)   the pure decision behind ps's states

Each returns a result object with ``ok`` and ``to_json()``; nothing here
prints or exits. See docs/units.md.
"""

from __future__ import annotations

from .lifecycle import DownResult, UpResult, down, up
from .listing import PsResult, UnitStatus, list_units
from .spec import UnitSpec, resolve
from .state import UnitFacts, UnitState, unit_state
from .swap import SwapResult, swap
from .unit import Unit

__all__ = [
           "DownResult",
           "PsResult",
           "SwapResult",
           "Unit",
           "UnitFacts",
           "UnitSpec",
           "UnitState",
           "UnitStatus",
           "UpResult",
           "down",
           "list_units",
           "resolve",
           "swap",
           "unit_state",
           "up",
]
