"""A unit's spec from its name: the one step ``up NAME``, ``swap OLD NEW`` (NEW given by name),
``restart`` and a batch ``up A B`` share.

:func:`~.spec.resolve` is pure (the unit file, the options given, the last run's spec as a
document); this is the step above it that knows where the last run is: the unit's record on
``ctx``'s host. A caller that has the unit loaded already (``swap`` loads NEW under the host
lock to check it) passes it, so that the record is read once; one that has not lets it be read
here.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import Any

from ..errors import UsageError
from ..host.session import HostContext
from ..unitname import UnitName
from .spec import CONFIG_NAME, CONFIG_VAR, UnitSpec, find_config, load_config, resolve
from .store import UnitStore
from .unit import Unit


class _NotLoaded(Enum):
    """``previous`` not given: the record is read here (``None`` given: the unit has none)."""

    TOKEN = "not loaded"


NOT_LOADED = _NotLoaded.TOKEN


def spec_for(ctx: HostContext, name: str, *, config: str | os.PathLike[str] | None = None,
             overrides: dict[str, Any] | None = None, command: list[str] | None = None,
             previous: Unit | _NotLoaded | None = NOT_LOADED) -> UnitSpec:
    """The spec of unit ``name`` as ``up NAME`` resolves it: the unit file's table (``config``,
    else found as :func:`~.spec.find_config` finds it), else the spec it last ran with, then
    ``overrides`` and ``command`` (see :func:`~.spec.resolve`). ``previous``: the unit as the caller
    loaded it (``None``: it has no record); not given, it is loaded from ``ctx``'s unit store."""
    if previous is NOT_LOADED:
        previous = Unit.load(UnitStore.of(ctx), name)
    last = previous.spec.to_json() if previous is not None and previous.spec is not None else None
    return resolve(name, overrides=overrides, command=command, config=config, previous=last)


def file_units(config: str | None, verb: str) -> list[str]:
    """Every unit of the unit file (``config``, else found as :func:`~.spec.find_config` finds it),
    in its order: what ``up``, ``down`` and ``restart`` without a name act on (``verb`` names the
    command in the error when there is no file)."""
    path = find_config(config)
    if path is None:
        raise UsageError(f"{verb} without a NAME acts on every unit of the unit file, and there is none "
                         f"({CONFIG_NAME} here or above, {CONFIG_VAR}, --config)", hint=f"gpuslate {verb} NAME")
    try:
        names: list[str] = [UnitName(n) for n in load_config(path)]
    except UsageError as exc:  # a table whose name no unit can have: the file is at fault
        raise UsageError(f"{path}: {exc}") from None
    if not names:
        raise UsageError(f"{path} defines no [units.NAME] table")
    return names
