from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuprocs import Started


@pytest.fixture
def started() -> Iterator[list[Started]]:
    procs: list[Started] = []
    yield procs
    for p in procs:
        p.stop()
