"""A throwaway second user for the state-path attacks, and a folder every user can reach.

Needs root (to create the user and act as it); skipped otherwise, like tests/clearing/test_clear_users.py.
"""

from __future__ import annotations

import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import per_worker, throwaway_user

USER = per_worker("gpuslate-state-t")


@pytest.fixture(scope="module")
def alice() -> Iterator[pwd.struct_passwd]:
    """A second user, created for the module and removed afterwards (one an earlier run left behind too)."""
    with throwaway_user(USER) as user:
        yield user


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A root-owned folder (0755) in the temporary folder: every user can reach what is in it."""
    base = Path(tempfile.mkdtemp(prefix="gpuslate-state-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)
