"""State paths another user can redirect (issue 15, class F), with a real second user.

Root clears a simulated host that belongs to alice, a throwaway user: whatever
alice plants in her folder (a symlink as the state folder, as the lock folder,
a FIFO as the lock file), root's ``clear`` refuses with one line and exit 5,
writes nothing where the link points and signals nothing.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, gpuslate_env, is_gone
from userkit import as_user, user_python

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


@pytest.fixture
def alices_host(alice, shared_base: Path) -> SimHost:
    """A simulated host in a folder of alice's, as ``gpuslate sim init`` run by her leaves it."""
    host = SimHost.init(shared_base / "sim", gpus=2, memory=16 * GiB, release_delay=0.1)
    for d in (host.root, *host.root.rglob("*")):
        os.chown(d, alice.pw_uid, alice.pw_gid, follow_symlinks=False)
    return host


@pytest.fixture
def root_only(shared_base: Path) -> Path:
    """A folder only root may write (what alice would like root to write into)."""
    d = shared_base / "root-only"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def root_holder(alices_host: SimHost) -> Iterator[int]:
    """A holder of GPU 0 that root started: what root's ``clear`` would signal."""
    p = subprocess.Popen([sys.executable, "-m", "gpuslate", "--sim", str(alices_host.root), "sim", "hold",
                          "--gpus", "0", "--memory", "1GiB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=gpuslate_env(), start_new_session=True)
    ready, _, _ = select.select([p.stdout], [], [], 20)
    line = p.stdout.readline() if ready else ""
    assert line, p.stderr.read() if p.poll() is not None else "holder not ready"
    pid = json.loads(line)["pid"]
    yield pid
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def root_clear(host: SimHost, **env: str) -> subprocess.CompletedProcess[str]:
    full = gpuslate_env({"GPUSLATE_SIM": str(host.root), **env})
    for k in ("GPUSLATE_STATE_DIR", "GPUSLATE_LOCK_DIR"):
        if k not in env:
            full.pop(k, None)
    return subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--gpus", "0", "--yes", "--timeout", "5"],
                          capture_output=True, text=True, env=full, timeout=60)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if not line.startswith("gpuslate: hint:")]
    assert len(lines) == 1 and lines[0].startswith("gpuslate: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_state_symlinked_by_alice_to_a_root_only_folder_is_refused(alice, alices_host, root_only, root_holder,
                                                                   shared_base):
    locks = shared_base / "root-locks"  # the lock is not what this test is about
    as_user(alice, ["ln", "-s", str(root_only), str(alices_host.root / "state")])
    r = root_clear(alices_host, GPUSLATE_LOCK_DIR=str(locks))
    assert r.returncode == 5, (r.stdout, r.stderr)
    line = one_error_line(r)
    # the walk checks the unresolved path: alice's folder above the link is what is at fault
    assert f"{alices_host.root} is owned by uid {alice.pw_uid}, not by you (uid 0) or root" in line
    assert list(root_only.iterdir()) == []  # nothing written where the link points
    assert not is_gone(root_holder)  # nothing signaled


def test_state_in_a_folder_alice_owns_is_refused_before_anything_is_written(alice, alices_host, root_holder,
                                                                           shared_base):
    # without a link too: alice could swap root's state folder at any time (she owns the folder above)
    r = root_clear(alices_host, GPUSLATE_LOCK_DIR=str(shared_base / "root-locks"))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert f"owned by uid {alice.pw_uid}" in one_error_line(r)
    assert not (alices_host.root / "state").exists()
    assert not is_gone(root_holder)
    # a state folder of root's own is the way: the same clear then works
    r = root_clear(alices_host, GPUSLATE_LOCK_DIR=str(shared_base / "root-locks"),
                   GPUSLATE_STATE_DIR=str(shared_base / "root-state"))
    assert r.returncode == 0, r.stderr
    assert is_gone(root_holder)


def test_lock_folder_symlinked_by_alice_is_refused(alice, alices_host, root_only, root_holder, shared_base):
    as_user(alice, ["ln", "-s", str(root_only), str(alices_host.root / "locks")])
    r = root_clear(alices_host, GPUSLATE_STATE_DIR=str(shared_base / "root-state"))
    assert r.returncode == 5, (r.stdout, r.stderr)
    line = one_error_line(r)
    assert f"{alices_host.root / 'locks'} is a symbolic link owned by uid {alice.pw_uid}" in line
    assert list(root_only.iterdir()) == []  # no host.lock, no host.lock.holder
    assert not is_gone(root_holder)


def test_shared_lock_folder_planted_as_a_symlink_in_a_sticky_folder_is_refused(alice, alices_host, root_only,
                                                                               root_holder, shared_base):
    sticky = shared_base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp
    as_user(alice, ["ln", "-s", str(root_only), str(sticky / "gpuslate-locks")])
    r = root_clear(alices_host, GPUSLATE_STATE_DIR=str(shared_base / "root-state"),
                   GPUSLATE_LOCK_DIR=str(sticky / "gpuslate-locks"))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "is a symbolic link owned by uid" in one_error_line(r)
    assert list(root_only.iterdir()) == []
    assert not is_gone(root_holder)


def test_fifo_planted_as_the_lock_file_does_not_hang(alice, alices_host, root_holder, shared_base):
    sticky = shared_base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    as_user(alice, ["mkdir", "-m", "1777", str(sticky / "locks")])
    as_user(alice, ["mkfifo", "-m", "666", str(sticky / "locks" / "host.lock")])
    r = root_clear(alices_host, GPUSLATE_STATE_DIR=str(shared_base / "root-state"),
                   GPUSLATE_LOCK_DIR=str(sticky / "locks"))  # run's own timeout: it must not hang
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "host.lock: refusing lock file" in one_error_line(r) and "a FIFO, not a regular file" in r.stderr
    assert not is_gone(root_holder)


def test_shared_lock_files_are_0644_and_still_every_users_lock(alice, shared_base):
    """Root creates the lock and its holder file 0644 (never 0666); alice still takes the lock
    (a flock on a read-only descriptor) and cannot write root's holder file, nor make root write hers."""
    from gpuslate.host.lock import HostLock, default_lock_dir, read_holder

    sticky = shared_base / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    env = {"GPUSLATE_LOCK_DIR": str(sticky / "gpuslate-locks")}
    old = os.environ.get("GPUSLATE_LOCK_DIR")
    os.environ.update(env)
    try:
        locks = default_lock_dir(None)
    finally:
        if old is None:
            del os.environ["GPUSLATE_LOCK_DIR"]
        else:
            os.environ["GPUSLATE_LOCK_DIR"] = old
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777
    with HostLock(locks / "host.lock", purpose="clear") as lk:
        assert read_holder(lk.holder_path)["pid"] == os.getpid()
    for p in (locks / "host.lock", locks / "host.lock.holder"):
        st = p.stat()
        assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0, p
    script = ("import sys; from pathlib import Path; from gpuslate.host.lock import HostLock\n"
              "lk = HostLock(Path(sys.argv[1]), purpose='alice'); lk.acquire(timeout=5); print('locked'); lk.release()")
    r = as_user(alice, [user_python(), "-c", script, str(locks / "host.lock")])
    assert r.stdout == "locked\n"
    assert (locks / "host.lock.holder").read_bytes() == b""  # root's file: alice wrote nothing into it

    # alice's own holder file, hard-linked to a file of hers elsewhere: root never writes through it
    (locks / "host.lock.holder").unlink()
    theirs = sticky / "alices-notes"
    as_user(alice, ["sh", "-c", f"echo mine > {theirs} && ln {theirs} {locks / 'host.lock.holder'}"])
    with HostLock(locks / "host.lock", purpose="clear"):
        pass
    assert theirs.read_text() == "mine\n"


SWAPPER = """
import os, sys, time
base, target, stop = sys.argv[1], sys.argv[2], sys.argv[3]
locks, aside = os.path.join(base, "locks"), os.path.join(base, "locks.aside")
print("swapping", flush=True)
while not os.path.exists(stop):
    os.rename(locks, aside)           # her real folder goes aside ...
    os.symlink(target, locks)         # ... a link to the root-only folder takes its place
    os.unlink(locks)
    os.rename(aside, locks)
"""


def test_lock_folder_swapped_for_a_link_while_root_walks_it(alice, alices_host, root_only):
    """A race, not a still picture: alice swaps SIMDIR/locks for a link to a root-only folder in a
    tight loop while root takes and releases the host lock 300 times. Every attempt either works in
    her real folder or is refused; none ever writes where the link points."""
    from gpuslate.errors import PermissionDenied
    from gpuslate.host.lock import HostLock

    locks = alices_host.root / "locks"
    as_user(alice, ["mkdir", "-m", "755", str(locks)])
    stop = alices_host.root / "stop"
    p = subprocess.Popen([user_python(), "-c", SWAPPER, str(alices_host.root), str(root_only), str(stop)],
                         user=alice.pw_uid, group=alice.pw_gid, extra_groups=[], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "swapping\n"
        outcomes = {"locked": 0, "refused": 0}
        for _ in range(300):
            try:
                with HostLock(locks / "host.lock", purpose="clear"):
                    outcomes["locked"] += 1
            except PermissionDenied:
                outcomes["refused"] += 1
        assert list(root_only.iterdir()) == [], outcomes
    finally:
        as_user(alice, ["touch", str(stop)])
        p.wait(10)
