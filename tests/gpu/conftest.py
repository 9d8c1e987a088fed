from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuprocs import Started
from mpskit import CONTROL, Mps


@pytest.fixture
def started() -> Iterator[list[Started]]:
    procs: list[Started] = []
    yield procs
    for p in procs:
        p.stop()


@pytest.fixture
def mps_daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Mps]]:
    """Starts private MPS control daemons (``start("a")``: pipe and log folders under tmp_path/a), each
    quit at the end with its clients, also when the test fails; the real driver (no simulated host)
    and this test's own audit log (GPUSLATE_STATE_DIR)."""
    control = shutil.which(CONTROL)
    if control is None:
        pytest.skip(f"{CONTROL} is not installed")
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))  # this test's audit log
    daemons: list[Mps] = []

    def start(name: str) -> Mps:
        m = Mps(control, tmp_path / name)
        daemons.append(m)  # before it starts: quit finds what a failed start left
        m.start()
        return m

    try:
        yield start
    finally:
        for m in daemons:
            m.quit()


@pytest.fixture
def mps(mps_daemons: Callable[[str], Mps]) -> Mps:
    """One private MPS control daemon (see mps_daemons)."""
    return mps_daemons("mps")
