"""Identity by number (issue 15, C): a unit's PID, session id and group id are numbers the kernel
reuses once the unit is gone. A crashed unit's PID handed to another user's program that calls
`setsid` and forks must not make `ps` call the unit `orphaned`, and `down` must never signal it.

The PID is reused for real: the scenario runs as PID 1 of a private PID namespace
(`unshare --fork --pid --mount-proc`, as in a container), where root can choose the next PID by
writing /proc/sys/kernel/ns_last_pid (tests/units/pidreuse.py). Needs root and unshare; in CI
(CI=true) their absence is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import gpuslate_env

DRIVER = str(Path(__file__).with_name("pidreuse.py"))


def need_namespaces() -> None:
    missing = ("root" if os.geteuid() != 0 else None) or \
              next((t for t in ("unshare", "setpriv") if shutil.which(t) is None), None) or \
              (None if os.access("/usr/bin/python3", os.X_OK) else "/usr/bin/python3")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"needs {missing} to reuse a PID in a private PID namespace")
        pytest.skip(f"needs {missing} to reuse a PID in a private PID namespace")


def reuse(mode: str) -> dict:
    need_namespaces()
    r = subprocess.run(["unshare", "--fork", "--pid", "--mount-proc", sys.executable, DRIVER, mode],
                       capture_output=True, text=True, env=gpuslate_env(), timeout=180)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["record", "torn", "leader"])
def test_a_reused_pid_and_its_session_are_not_the_unit(units_host, mode):
    got = reuse(mode)
    web = next(u for u in got["ps"]["units"] if u["name"] == "web")
    assert got["stranger"] not in web["processes"], web
    assert web["processes"] == [] and web["state"] == ("corrupt" if mode == "torn" else "exited"), web
    down = got["down"]
    assert down is not None, got["down_err"]
    signaled = [p["pid"] for p in down["processes"] + down["swept"]]
    assert got["stranger"] not in signaled and got["main"] not in signaled, down
    assert got["stranger_alive"], "down signaled the stranger that reused the unit's session id"
    assert got["leader_alive"] == (mode == "leader")
    if mode == "torn":  # nothing found, no GPU known: not verified, and said so, never "released"
        assert down["memory_released"] is None and "no GPU" in down["unverified"], down
    else:
        assert got["down_rc"] == 0 and down["memory_released"] is True and down["verified_gpus"] == [0]
