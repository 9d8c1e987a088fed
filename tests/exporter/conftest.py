"""Fixtures for the exporter tests: a simulated host (tests/conftest.py) and the exporter on it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from exportkit import Exporter


@pytest.fixture
def exporter(sim_host, tmp_path, monkeypatch) -> Iterator[Callable[..., Exporter]]:
    """Start exporters on the test's simulated host; each is stopped (SIGTERM) and must exit 0."""
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    started: list[Exporter] = []

    def start(*args: str) -> Exporter:
        e = Exporter(*args)
        started.append(e)
        return e

    yield start
    codes = [e.stop() for e in started]
    assert codes == [0] * len(codes), [e.proc.stderr.read() for e in started]  # type: ignore[union-attr]
