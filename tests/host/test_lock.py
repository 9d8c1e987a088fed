"""The host lock, between real processes: waiting, holder info, dead holders, permissions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuslate.errors import GpuslateError, NotDoneError
from gpuslate.host import lock as lockmod
from gpuslate.host.lock import HostLock, default_lock_dir, read_holder

SRC = str(Path(__file__).resolve().parents[2] / "src")

# Holds the lock until killed; with RAW, a bare flock that writes no .holder file.
HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    from pathlib import Path
    from gpuslate.host.lock import HostLock
    path, purpose, raw = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "raw"
    if raw:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
    else:
        lk = HostLock(path, purpose=purpose)
        lk.acquire(timeout=30)
    print("locked", flush=True)
    if sys.argv[4:] == ["release-on-stdin"]:
        sys.stdin.readline()
        lk.release()
        sys.stdin.readline()  # stay alive: the lock was released, not dropped by exiting
        sys.exit(0)
    time.sleep(600)
""")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def spawn_holder() -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def spawn(path: Path, purpose: str = "clear --gpus 0-7", *, raw: bool = False,
              release_on_stdin: bool = False) -> subprocess.Popen[str]:
        args = [sys.executable, "-c", HOLDER, str(path), purpose, "raw" if raw else "api"]
        if release_on_stdin:
            args.append("release-on-stdin")
        p = subprocess.Popen(args, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == "locked\n"
        return p

    yield spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()  # reaps it and closes its pipes


@pytest.fixture
def lock_path(tmp_path: Path) -> Path:
    return tmp_path / "host.lock"


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# -- acquire / release -----------------------------------------------------------


def test_acquire_release_and_holder_file(lock_path: Path) -> None:
    lk = HostLock(lock_path, purpose="up --gpus 0-3")
    lk.acquire(timeout=0)
    assert lk.held
    info = read_holder(lk.holder_path)
    assert info["pid"] == os.getpid() and info["purpose"] == "up --gpus 0-3"
    assert info["user"] and info["since"].endswith("Z")
    with pytest.raises(GpuslateError, match="already held by this process"):
        lk.acquire(timeout=0)
    lk.release()
    assert not lk.held
    assert lk.holder_path.read_bytes() == b""  # no stale advice after a clean release
    lk.release()  # a second release is harmless
    with HostLock(lock_path, purpose="swap") as again:
        assert again.held
    assert not again.held


def test_waiter_sees_holder_then_gets_lock_when_holder_is_killed(lock_path: Path, spawn_holder: Any) -> None:
    holder = spawn_holder(lock_path, "clear --gpus 0-7")
    seen: list[dict[str, Any]] = []
    killed_at: list[float] = []

    def on_wait(info: dict[str, Any]) -> None:
        seen.append(info)
        # the waiter is now waiting: the holder dies the hard way
        os.kill(holder.pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    lk = HostLock(lock_path, purpose="swap")
    lk.acquire(timeout=30, on_wait=on_wait)
    waited = time.monotonic() - killed_at[0]
    try:
        assert len(seen) == 1
        assert seen[0]["pid"] == holder.pid and seen[0]["purpose"] == "clear --gpus 0-7"
        assert seen[0]["user"] and seen[0]["since"]
        assert waited < 2.0, f"took {waited:.2f} s to take a dead holder's lock"
        assert read_holder(lk.holder_path)["pid"] == os.getpid()
    finally:
        lk.release()


def test_waiter_gets_lock_when_holder_releases(lock_path: Path, spawn_holder: Any) -> None:
    holder = spawn_holder(lock_path, "up", release_on_stdin=True)
    seen: list[dict[str, Any]] = []

    def on_wait(info: dict[str, Any]) -> None:
        seen.append(info)
        holder.stdin.write("release\n")
        holder.stdin.flush()

    lk = HostLock(lock_path, purpose="clear")
    lk.acquire(timeout=30, on_wait=on_wait)
    try:
        assert [(s["pid"], s["purpose"]) for s in seen] == [(holder.pid, "up")]
        assert holder.poll() is None  # it let go while alive
        assert read_holder(lk.holder_path)["purpose"] == "clear"
    finally:
        lk.release()


def test_timeout_names_the_holder(lock_path: Path, spawn_holder: Any) -> None:
    holder = spawn_holder(lock_path, "clear --gpus 0-7")
    calls: list[dict[str, Any]] = []
    lk = HostLock(lock_path, purpose="swap")
    start = time.monotonic()
    with pytest.raises(NotDoneError) as ei:
        lk.acquire(timeout=0.4, on_wait=calls.append)
    elapsed = time.monotonic() - start
    assert 0.4 <= elapsed < 3
    msg = str(ei.value)
    assert msg.startswith("the host lock is still held by clear --gpus 0-7 (pid ")
    assert f"pid {holder.pid}, user " in msg and ", since " in msg and "\n" not in msg
    assert len(calls) == 1 and calls[0]["pid"] == holder.pid
    assert not lk.held
    assert holder.poll() is None  # still holding: the waiter gave up, nothing else
    # timeout=0 means one try
    with pytest.raises(NotDoneError):
        lk.acquire(timeout=0)


def test_waiting_does_not_spin(lock_path: Path, spawn_holder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    spawn_holder(lock_path)
    tries = [0]
    real_flock = lockmod.fcntl.flock

    def counting_flock(fd: int, op: int) -> None:
        tries[0] += 1
        real_flock(fd, op)

    monkeypatch.setattr(lockmod.fcntl, "flock", counting_flock)
    cpu = time.process_time()
    with pytest.raises(NotDoneError):
        HostLock(lock_path, purpose="swap").acquire(timeout=1.0)
    assert time.process_time() - cpu < 0.25
    assert tries[0] <= 1.0 / 0.02 + 2, f"{tries[0]} lock attempts in 1 s"


def test_stale_holder_file_of_a_dead_process_is_ignored(lock_path: Path, spawn_holder: Any) -> None:
    holder_path = lock_path.with_name(lock_path.name + ".holder")
    holder_path.write_text(json.dumps({"pid": _dead_pid(), "user": "ghost", "purpose": "old run",
                                       "since": "2020-01-01T00:00:00.000Z"}))
    # nobody holds the flock: the stale file must not make anyone wait
    calls: list[dict[str, Any]] = []
    lk = HostLock(lock_path, purpose="clear")
    lk.acquire(timeout=0, on_wait=calls.append)
    assert calls == []
    lk.release()

    # held by a process that left no info: the stale file must not be blamed
    holder_path.write_text(json.dumps({"pid": _dead_pid(), "user": "ghost", "purpose": "old run",
                                       "since": "2020-01-01T00:00:00.000Z"}))
    raw = spawn_holder(lock_path, raw=True)
    with pytest.raises(NotDoneError) as ei:
        lk.acquire(timeout=0.3, on_wait=calls.append)
    # another program holds the flock: found through /proc/locks by the file's inode
    import pwd

    assert [c["pid"] for c in calls] == [raw.pid]
    assert calls[0]["user"] == pwd.getpwuid(os.getuid()).pw_name
    assert "ghost" not in str(ei.value) and "old run" not in str(ei.value)
    assert f"(pid {raw.pid}, user " in str(ei.value) and "None" not in str(ei.value)


def test_holder_not_in_proc_locks_is_reported_unknown(lock_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      spawn_holder: Any) -> None:
    # e.g. a holder in another mount namespace whose /proc/locks line we cannot match
    spawn_holder(lock_path, raw=True)
    monkeypatch.setattr(lockmod, "_kernel_holder", lambda fd: None)
    calls: list[dict[str, Any]] = []
    with pytest.raises(NotDoneError) as ei:
        HostLock(lock_path, purpose="clear").acquire(timeout=0.2, on_wait=calls.append)
    assert calls[0]["pid"] is None
    assert "unknown process" in str(ei.value) and "None" not in str(ei.value)
    assert "unknown process" in lockmod.describe_holder(calls[0])


def test_holder_file_of_a_reused_pid_is_ignored(lock_path: Path) -> None:
    holder_path = lock_path.with_name(lock_path.name + ".holder")
    # our own pid, but with another start time: a different process
    holder_path.write_text(json.dumps({"pid": os.getpid(), "start_ticks": 1, "user": "ghost",
                                       "purpose": "old run", "since": "x"}))
    assert read_holder(holder_path)["pid"] is None


def test_children_do_not_inherit_the_lock(lock_path: Path) -> None:
    # a server started by `up` must not keep the host locked after gpuslate exits
    lk = HostLock(lock_path, purpose="up")
    lk.acquire(timeout=0)
    assert lk._fd is not None and not os.get_inheritable(lk._fd)
    child = subprocess.Popen(["sleep", "60"], close_fds=False)
    try:
        # the child has no descriptor of the lock file (with one, the flock would outlive us); an
        # inherited one would be there from the fork on, while the files the dynamic loader opens
        # and closes as `sleep` starts may go between the listing and the readlink
        held = []
        for fd in os.listdir(f"/proc/{child.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):
                held.append(os.readlink(f"/proc/{child.pid}/fd/{fd}"))
        assert str(lock_path) not in held
        lk.release()
        other = HostLock(lock_path, purpose="clear")
        other.acquire(timeout=0)  # raises NotDoneError if the child kept the lock
        assert other.held
        other.release()
    finally:
        child.kill()
        child.wait()


# -- permissions and folders -----------------------------------------------------


def test_lock_files_are_readable_by_all_writable_by_none_but_their_owner(lock_path: Path) -> None:
    # others take the flock on a read-only descriptor and read the holder file; none may write them
    old = os.umask(0o077)
    try:
        with HostLock(lock_path, purpose="clear") as lk:
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(lock_path.stat().st_mode) == 0o644
    assert stat.S_IMODE(lk.holder_path.stat().st_mode) == 0o644


def test_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "host.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(GpuslateError, match="symbolic link"):
        HostLock(tmp_path / "host.lock", purpose="clear").acquire(timeout=0)


def test_lock_dir_from_env_is_shared_and_sticky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "locks"))
    old = os.umask(0o077)
    try:
        d = default_lock_dir(None)
    finally:
        os.umask(old)
    assert d == tmp_path / "locks"
    assert stat.S_IMODE(d.stat().st_mode) == 0o1777
    # the env var wins over a simulated host too
    assert default_lock_dir(str(tmp_path / "sim")) == d


def test_lock_dir_of_a_simulated_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLATE_LOCK_DIR", raising=False)
    monkeypatch.setattr(lockmod, "SYSTEM_LOCK_DIR", tmp_path / "must-not-be-used")
    sim = tmp_path / "sim"
    sim.mkdir()
    d = default_lock_dir(str(sim))
    assert d == sim / "locks" and d.is_dir()
    assert not stat.S_IMODE(d.stat().st_mode) & stat.S_ISVTX  # private to the simulated host
    assert not (tmp_path / "must-not-be-used").exists()


def test_lock_dir_system_then_temp_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLATE_LOCK_DIR", raising=False)
    (tmp_path / "run-lock").mkdir()
    monkeypatch.setattr(lockmod, "SYSTEM_LOCK_DIR", tmp_path / "run-lock" / "gpuslate")
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    d = default_lock_dir(None)
    assert d == tmp_path / "run-lock" / "gpuslate"
    assert stat.S_IMODE(d.stat().st_mode) == 0o1777

    # /run/lock not usable (here: a file where the folder should be): the temp folder
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setattr(lockmod, "SYSTEM_LOCK_DIR", tmp_path / "not-a-dir" / "gpuslate")
    (tmp_path / "tmp").mkdir()
    d = default_lock_dir(None)
    assert d == tmp_path / "tmp" / "gpuslate-locks"
    assert stat.S_IMODE(d.stat().st_mode) == 0o1777


def test_existing_lock_dir_keeps_its_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "locks"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(d))
    assert default_lock_dir(None) == d
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_clear_waits_for_the_lock_within_its_timeout(tmp_path: Path, spawn_holder: Any) -> None:
    """`clear --timeout` counts the wait for the host lock; a program that is not
    gpuslate holding the lock is named from /proc/locks, never as 'pid None'."""
    from gpuslate.gpu.simhost.host import SimHost

    host = SimHost.init(tmp_path / "sim", gpus=2, memory=8 << 30)
    raw = spawn_holder(default_lock_dir(str(host.root)) / "host.lock", raw=True)
    env = dict(_env(), GPUSLATE_SIM=str(host.root), GPUSLATE_STATE_DIR=str(tmp_path / "state"))
    env.pop("GPUSLATE_LOCK_DIR", None)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpuslate", "clear", "--yes", "--timeout", "0.5"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert 0.5 <= time.monotonic() - start < 10
    assert r.returncode == 4, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpuslate: waiting for the host lock (at most 0.5 s): held by process ")
    assert f"(pid {raw.pid}, user " in lines[0], lines
    assert lines[1].startswith("gpuslate: error: the host lock is still held by ") and f"pid {raw.pid}" in lines[1]
    assert "None" not in r.stderr


def test_holder_file_symlink_is_not_followed(lock_path: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"pid": os.getpid(), "user": "planted", "purpose": "x", "since": "y"}))
    lock_path.with_name(lock_path.name + ".holder").symlink_to(elsewhere)
    assert read_holder(lock_path.with_name(lock_path.name + ".holder"))["pid"] is None


def test_holder_file_hard_linked_to_a_file_elsewhere_is_never_written(lock_path: Path, tmp_path: Path) -> None:
    # without fs.protected_hardlinks, anyone may link a file of root's into a shared lock folder
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.link(victim, lock_path.with_name(lock_path.name + ".holder"))
    with HostLock(lock_path, purpose="clear") as lk:
        assert lk.held
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_lock_or_holder_file_that_is_not_a_regular_file_never_hangs(lock_path: Path, kind: str) -> None:
    def plant(path: Path) -> None:
        os.mkfifo(path) if kind == "fifo" else path.mkdir()

    holder = lock_path.with_name(lock_path.name + ".holder")
    plant(holder)  # the holder file is only advice: the lock is still taken, the advice skipped
    with HostLock(lock_path, purpose="clear") as lk:
        assert lk.held and read_holder(holder)["pid"] is None
    lock_path.unlink()
    plant(lock_path)  # the lock file itself: refused, never waited on
    with pytest.raises(GpuslateError, match=f"host.lock: it is a {'FIFO' if kind == 'fifo' else 'directory'}"):
        HostLock(lock_path, purpose="clear").acquire(timeout=0)


def test_a_link_loop_on_the_way_is_refused_not_followed_for_ever(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    monkeypatch.setenv("GPUSLATE_LOCK_DIR", str(tmp_path / "a" / "locks"))
    with pytest.raises(GpuslateError, match="too many symbolic links"):
        default_lock_dir(None)
