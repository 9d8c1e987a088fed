"""One real Slurm cluster (munged, slurmctld, two slurmd) for tests/slurm, started once.

Without root or the Debian packages the tests skip, except in CI (``CI=true``:
``.ci/run`` installs slurmctld, slurmd, slurm-client and munge), where they fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import SlurmCluster, missing


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    why = missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"cannot start the Slurm test cluster: {why}")
        pytest.skip(f"cannot start the Slurm test cluster: {why}")
    root = Path(tempfile.mkdtemp(prefix="gpuslate-slurm-", dir="/tmp"))
    c = SlurmCluster(root, ("n1", "n2"), gpus={"n1": 4, "n2": 2})
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
