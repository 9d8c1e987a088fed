"""`clear` across users: another user's job is spared unless --all-users; a
target gpuslate may not signal is reported (exit 5) while the rest proceed.

Needs root (to create a second user and run processes as it); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from gpuslate.sim.host import SimHost
from helpers import GiB, SRC, is_gone, wait_for

USER = "gpuslate-tester"
SYSTEM_PYTHON = "/usr/bin/python3"


MARKER = "gpuslate test user, removed by the tests"


@pytest.fixture(scope="module")
def other_user() -> Iterator[pwd.struct_passwd]:
    """A second user for the module; removed afterwards (as is one an earlier run left behind)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    try:
        existing = pwd.getpwnam(USER)
    except KeyError:
        existing = None
    if existing is not None and existing.pw_gecos != MARKER:
        yield existing  # someone's own user of that name: use it, never remove it
        return
    if existing is None:
        if not shutil.which("useradd"):
            pytest.skip("useradd is not available to create a second user")
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--comment", MARKER, USER],
                       check=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], check=False, capture_output=True)
        with pytest.raises(KeyError):
            pwd.getpwnam(USER)


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
    kw = dict(user=user.pw_uid, group=user.pw_gid, extra_groups=[]) if user else {}
    p = subprocess.Popen([py, "-m", "gpuslate", "--sim", str(host.root), "sim", "hold", "--gpus", gpus,
                          "--memory", "5GiB"], stdout=subprocess.PIPE, text=True, env=_env(), cwd="/",
                         start_new_session=True, **kw)
    ready = json.loads(p.stdout.readline())
    return p, ready["pid"]


def test_other_users_job_spared_without_all_users(shared_host, other_user, cli):
    p, pid = start_as(other_user, shared_host, "1")
    try:
        t0 = time.monotonic()
        r = cli("clear", "--gpus", "1", "--timeout", "60", "--json")
        assert r.returncode == 4, r.stderr
        assert time.monotonic() - t0 < 2.5  # only a job clear may not end holds the GPU: said at once
        doc = json.loads(r.stdout)
        assert doc["status"] == "held_by_others"
        assert doc["targets"] == []
        (s,) = doc["spared"]
        assert s["pid"] == pid and s["user"] == USER and "another user's" in s["reason"]
        (problem,) = doc["diagnosis"][0]["problems"]
        assert problem["pid"] == pid and problem["user"] == USER and "--all-users" in problem["remedy"]
        assert not is_gone(pid)
        r = cli("clear", "--gpus", "1", "--all-users", "--json")
        assert r.returncode == 0, r.stdout
        assert [t["pid"] for t in json.loads(r.stdout)["targets"]] == [pid]
        assert is_gone(pid)
    finally:
        p.kill()
        p.wait()


def test_permission_denied_reported_rest_proceed(shared_host, other_user):
    root_p, root_pid = start_as(None, shared_host, "0")
    user_p, user_pid = start_as(other_user, shared_host, "2")
    base = shared_host.root.parent
    try:
        r = run_as(other_user, ["-m", "gpuslate", "clear", "--all-users", "--timeout", "1", "--json"],
                   capture_output=True,
                   env={"GPUSLATE_SIM": str(shared_host.root), "GPUSLATE_LOCK_DIR": str(base / "locks"),
                        "GPUSLATE_STATE_DIR": str(base / "state-user")})
        assert r.returncode == 5, (r.stdout, r.stderr)
        doc = json.loads(r.stdout)
        by_pid = {t["pid"]: t for t in doc["targets"]}
        assert by_pid[root_pid]["permission_denied"] and by_pid[root_pid]["signals"][0]["outcome"] == "permission_denied"
        assert by_pid[user_pid]["ended_by"] == "SIGTERM"
        wait_for(lambda: is_gone(user_pid))
        assert not is_gone(root_pid)
        gpu0 = next(d for d in doc["diagnosis"] if d["gpu"] == 0)
        assert "not permitted" in gpu0["problems"][0]["reason"]
    finally:
        for p in (root_p, user_p):
            p.kill()
            p.wait()
