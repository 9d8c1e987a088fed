"""``spec_for``: a unit's spec from its name, its last run read from the host's records once (or
taken as the caller loaded it), as ``up NAME`` and ``swap OLD NEW`` resolve it."""

from __future__ import annotations

import sys

import pytest

from gpuslate import Host
from gpuslate.errors import UsageError
from gpuslate.units import Unit, UnitSpec, UnitStore
from gpuslate.units.resolving import spec_for
from unitkit import free_port


def test_the_last_run_is_read_once_or_taken_as_given(units_host, monkeypatch):
    port = free_port()
    failing = UnitSpec("a", command=[sys.executable, "-c", "raise SystemExit(3)"], port=port, gpus=[1],
                       start_timeout=10)
    with Host.open() as host:
        assert not host.up(failing).ok  # a record: the spec it last ran with
        loaded = Unit.load(UnitStore.of(host), "a")
        assert loaded is not None
        loads: list[str] = []
        real = Unit.load.__func__  # type: ignore[attr-defined]

        def counted(cls, units, name):  # type: ignore[no-untyped-def]
            loads.append(name)
            return real(cls, units, name)

        monkeypatch.setattr(Unit, "load", classmethod(counted))
        spec = spec_for(host, "a")
        assert loads == ["a"] and spec.command == failing.command and spec.port == port and spec.gpus == [1]
        # the caller's loaded unit: not read again; options given over it, a new command replacing it
        again = spec_for(host, "a", previous=loaded, overrides={"gpus": [2]})
        other = spec_for(host, "a", previous=loaded, command=["true"], overrides={"ready_log": "x"})
        assert loads == ["a"] and again.gpus == [2] and again.command == failing.command
        assert other.command == ["true"] and other.port is None  # a new command inherits nothing
        # None given: no record, and nothing read
        with pytest.raises(UsageError, match="unknown unit 'a'"):
            spec_for(host, "a", previous=None)
        assert loads == ["a"]
