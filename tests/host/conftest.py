"""A throwaway second user for the state-path attacks, and a folder every user can reach.

Needs root (to create the user and act as it); skipped otherwise, like tests/test_clear_users.py.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

USER = "gpuslate-state-t"
MARKER = "gpuslate state-path test user, removed by the tests"


@pytest.fixture(scope="module")
def alice() -> Iterator[pwd.struct_passwd]:
    """A second user, created for the module and removed afterwards (one an earlier run left behind too)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    try:
        existing = pwd.getpwnam(USER)
    except KeyError:
        existing = None
    if existing is not None and existing.pw_gecos != MARKER:
        pytest.skip(f"a user {USER} exists that these tests did not create")
    if existing is None:
        if not shutil.which("useradd"):
            # CI installs what the tests need: there, a missing useradd fails rather than hides these tests
            (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(
                "useradd is not available to create a second user")
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--comment", MARKER, USER],
                       check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        with pytest.raises(KeyError):
            pwd.getpwnam(USER)


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A root-owned folder (0755) in the temporary folder: every user can reach what is in it."""
    base = Path(tempfile.mkdtemp(prefix="gpuslate-state-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)
