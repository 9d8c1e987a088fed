"""Managed units: model servers started, watched, stopped and swapped by gpuslate.

    up(spec)            start, return once ready (or failed and cleaned up)
    down(name)          stop every process of the unit, verify its GPUs released
    swap(old, new)      down + verify + up, phases timed; optional rollback
    list_units()        every unit with its live state (ps)
    resolve(name, ...)  a unit's spec from gpuslate.toml / the command line / its last run

Each returns a result object with ``ok`` and ``to_json()``; nothing here
prints or exits. See docs/units.md.
"""

from __future__ import annotations

from .lifecycle import DownResult, UpResult, down, up
from .listing import PsResult, UnitStatus, list_units
from .spec import UnitSpec, resolve
from .swap import SwapResult, swap

__all__ = ["up", "down", "swap", "list_units", "resolve", "UnitSpec", "UpResult", "DownResult",
           "SwapResult", "PsResult", "UnitStatus"]
