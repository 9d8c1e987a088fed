"""Fixtures for the unit tests: a simulated host, private state and lock folders, free ports,
the CLI with the unit commands, and a teardown that kills whatever the test's units left."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from gpuslate.proc.procfs import ProcessId
from gpuslate.proc.signals import send_signal
from gpuslate.proc.tree import ProcTable
from gpuslate.sim.host import SimHost
from helpers import SRC
from unitkit import run_units


@pytest.fixture
def units_host(sim_host: SimHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimHost]:
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    # in-process up() starts units with this process's environment
    monkeypatch.setenv("PYTHONPATH", SRC + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    monkeypatch.chdir(tmp_path)
    yield sim_host
    _kill_leftovers(sim_host)


def _kill_leftovers(host: SimHost) -> None:
    """SIGKILL every process of this test's units and every live holder on its simulated host
    (all started by this test), each by exact identity."""
    from gpuslate.units.unit import load_units

    idents: set[ProcessId] = set()
    table = ProcTable()
    units = load_units()
    for unit in units:
        idents.update(st.ident for st in unit.members(table))
    for held in host.held():
        r = held.record
        if held.alive and r.pid is not None and r.pid != os.getpid():
            idents.add(ProcessId(r.pid, r.start_ticks))
    for ident in idents:
        send_signal(ident, signal.SIGKILL)
    for unit in units:  # the host's cgroup tree is shared: leave nothing in it
        unit.fence.release(wait=10.0)  # init may take seconds to reap the killed processes


@pytest.fixture
def units() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_units
