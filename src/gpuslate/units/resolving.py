"""A unit's spec from its name, as ``gpuslate up NAME`` finds it: ``Host.up("name")``.

One function, so that the library's ``up`` of a name and the command's agree: the
unit file's table (``gpuslate.toml`` found upward, ``$GPUSLATE_CONFIG`` or the
file given), else the spec the unit last ran with, read once from its record.
"""

from __future__ import annotations

import os

from ..host.session import HostContext
from .spec import UnitSpec, resolve
from .store import UnitStore
from .unit import Unit


def spec_for(ctx: HostContext, name: str, *, config: str | os.PathLike[str] | None = None) -> UnitSpec:
    """The spec of unit ``name`` on ``ctx``'s host (:func:`~gpuslate.units.spec.resolve` with the
    unit's last run as ``previous``); an unknown unit is a :class:`~gpuslate.errors.UsageError`."""
    prev = Unit.load(UnitStore.of(ctx), name)
    return resolve(name, config=config, previous=prev.spec.to_json() if prev and prev.spec else None)
