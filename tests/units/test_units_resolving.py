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


def test_an_unknown_new_unit_is_told_how_to_make_it_not_to_give_swap_a_command(units_host, units, tmp_path,
                                                                                 monkeypatch):
    """``swap OLD NEW`` takes no command: the hint for an unknown NEW is the unit file or an ``up``
    with its command, the same line ``up NEW`` gets (docs/units.md's first example)."""
    monkeypatch.chdir(tmp_path)
    r = units("up", "old", "--gpus", "0", "--ready-log", "ready", "--", "sh", "-c", "echo ready; exec sleep 60")
    assert r.returncode == 0, r.stderr
    for argv in (["swap", "old", "speculative"], ["up", "speculative"]):
        r = units(*argv)
        assert r.returncode == 2, r.stderr
        error, hint = r.stderr.splitlines()
        assert error.startswith("gpuslate: error: unknown unit 'speculative' (no gpuslate.toml") and "--" not in error
        assert hint.startswith("gpuslate: hint: declare it as [units.speculative] in gpuslate.toml") and \
            "gpuslate up speculative --port 30000 -- " in hint, hint
    assert units("down", "old").returncode == 0  # swap refused before stopping it
