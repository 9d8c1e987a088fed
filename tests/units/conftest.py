"""Fixtures for the unit tests: a simulated host, private state and lock folders, free ports,
the CLI with the unit commands, and a teardown that kills whatever the test's units left."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import SRC, kill_leftovers, unit_records
from unitkit import run_units


@pytest.fixture
def units_host(sim_host: SimHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimHost]:
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    # in-process up() starts units with this process's environment
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", SRC + (os.pathsep + inherited if inherited else ""))
    monkeypatch.chdir(tmp_path)
    yield sim_host
    from gpuslate.units.unit import load_units

    kill_leftovers(sim_host, load_units(unit_records()))


@pytest.fixture
def units() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_units
