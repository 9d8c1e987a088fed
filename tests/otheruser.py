"""A second user and a simulated host every user can use, for the tests of what gpuslate does
across users (the fixtures ``other_user`` and ``shared_host``, registered in conftest.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import SRC, GiB, per_worker, throwaway_user

USER = per_worker("gpuslate-tester")
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second user for the module; removed afterwards (as is one an earlier run left behind)."""
    with throwaway_user(USER) as user:
        yield user


@pytest.fixture
def shared_host(other_user, monkeypatch) -> Iterator[SimHost]:
    """A simulated host every user can use (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="gpuslate-users-"))
    base.chmod(0o755)
    host = SimHost.init(base / "host", gpus=4, memory=96 * GiB, release_delay=0.1)
    for d in (host.root, host.alloc, base / "locks"):
        d.mkdir(exist_ok=True)
        d.chmod(0o1777)
    # state folders are private to their user (gpuslate refuses shared ones, like sshd's StrictModes)
    for d, owner in ((base / "state-root", 0), (base / "state-user", other_user.pw_uid)):
        d.mkdir(mode=0o700)
        os.chown(d, owner, -1)
    monkeypatch.setenv("GPUSLATE_SIM", str(host.root))
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(base / "locks"))
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(base / "state-root"))
    probe = run_as(other_user, ["-c", "import gpuslate"], capture_output=True)
    if probe.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"{USER} cannot run gpuslate from {SRC}: {probe.stderr.strip()[-200:]}")
    yield host
    shutil.rmtree(base, ignore_errors=True)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    env["PYTHONPATH"] = SRC
    env.update(extra or {})
    return env


def run_as(user: pwd.struct_passwd, args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    py = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    return subprocess.run([py, *args], user=user.pw_uid, group=user.pw_gid, extra_groups=[], text=True,
                          env=_env(kw.pop("env", None)), cwd="/", timeout=60, **kw)


def start_as(user: pwd.struct_passwd | None, host: SimHost, gpus: str) -> tuple[subprocess.Popen[str], int]:
    py = SYSTEM_PYTHON if user is not None and os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    kw = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
    p = subprocess.Popen([py, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", gpus,
                          "--memory", "5GiB"], stdout=subprocess.PIPE, text=True, env=_env(), cwd="/",
                         start_new_session=True, **kw)
    ready = json.loads(p.stdout.readline())
    return p, ready["pid"]


