"""Acting as a second user in the state-path tests."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys

from helpers import SRC

SYSTEM_PYTHON = "/usr/bin/python3"


def as_user(user: pwd.struct_passwd, args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    """Run ``args`` as ``user`` (its own uid and group, no others); fails the test if it fails."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": SRC}
    r = subprocess.run(args, user=user.pw_uid, group=user.pw_gid, extra_groups=[], text=True, env=env, cwd="/",
                       capture_output=True, timeout=60, **kw)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def user_python() -> str:
    """A Python another user can run (the test's own may live in a folder only root reaches)."""
    return SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
