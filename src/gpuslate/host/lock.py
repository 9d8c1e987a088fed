"""The host lock: one ``clear``/``up``/``swap`` at a time on a host, whoever runs it.

It is an ``flock`` on a file in a folder every user of the host can write, so
the kernel releases it the moment a holder dies, however it dies. Next to the
lock file the holder keeps ``<lock>.holder`` (pid, user, purpose, since) so a
waiter can say whom it waits for; that file is only ever advice, the flock
alone decides. When another program holds the flock (no holder file), the
holder is found in ``/proc/locks`` by the lock file's device and inode.

The folder is shared by design, so it is opened as host/statedir.py opens a
``Trust.SHARED`` folder: walked one component at a time, never through a
symbolic link another user owns, and files in it only if they are regular
(never a FIFO that would hang us). The lock file is created 0644 and opened
read-only (``flock`` needs no more, so nobody needs to write it); the holder
file is 0644 and written only by its owner, through a descriptor of a file
with one link: another user can make us wait, never write elsewhere.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import GpuslateError, NotDoneError, PermissionDenied
from .statedir import StateDir, Trust, absolute_setting, open_dir

SYSTEM_LOCK_DIR = Path("/run/lock/gpuslate")
TEMP_LOCK_DIR_NAME = "gpuslate-locks"

_POLL_MIN = 0.02  # seconds between tries while waiting, growing to _POLL_MAX
_POLL_MAX = 0.05
_HOLDER_SETTLE = 0.2  # how long a waiter gives a new holder to write its .holder file


def default_lock_dir(sim_root: str | None) -> Path:
    """``$GPUSLATE_LOCK_DIR``; ``SIM_ROOT/locks`` for a simulated host; else
    ``/run/lock/gpuslate`` when usable, else ``<tmp>/gpuslate-locks``.

    Folders outside the simulated host are shared by every user, so they are
    created world-writable and sticky (0o1777), like ``/tmp``; a simulated
    host's is created 0755. An existing folder keeps its mode.
    """
    env = os.environ.get("GPUSLATE_LOCK_DIR")
    if env:
        path = absolute_setting("GPUSLATE_LOCK_DIR", env)
        _make_dir(path, shared=not _is_under(path, sim_root))
        return path
    if sim_root:
        path = Path(sim_root) / "locks"
        _make_dir(path, shared=False)
        return path
    try:
        _make_dir(SYSTEM_LOCK_DIR, shared=True)
        if os.access(SYSTEM_LOCK_DIR, os.W_OK | os.X_OK):
            return SYSTEM_LOCK_DIR
    except PermissionDenied:
        pass  # e.g. /run/lock is root-only on this distribution
    import tempfile  # lazy: startup; only for this fallback: it is slow to import

    path = Path(tempfile.gettempdir()) / TEMP_LOCK_DIR_NAME
    _make_dir(path, shared=True)
    return path


def _is_under(path: Path, root: str | None) -> bool:
    if not root:
        return False
    try:
        path.resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


def _make_dir(path: Path, *, shared: bool) -> None:
    """Create (or check) the lock folder by the walk of :func:`open_lock_dir`."""
    open_lock_dir(path, create=True, mode=0o1777 if shared else 0o755).close()


def open_lock_dir(path: Path, *, create: bool = False, mode: int = 0o755) -> StateDir:
    """The lock folder, walked under the ``Trust.SHARED`` rules and held open."""
    try:
        return open_dir(path, trust=Trust.SHARED, create=create, mode=mode, parents_mode=0o755,
                        what="lock directory")
    except FileNotFoundError as exc:
        raise PermissionDenied(f"cannot use {exc.strerror}",
                               hint="set GPUSLATE_LOCK_DIR to a directory every gpuslate user can write") from None


class HostLock:
    """An exclusive lock on one host, with who holds it for whoever waits."""

    def __init__(self, path: Path, *, purpose: str) -> None:
        self.path = Path(path)
        self.holder_path = self.path.with_name(self.path.name + ".holder")
        self.purpose = purpose
        self._fd: int | None = None
        self._dir: StateDir | None = None  # the lock's folder, held open while the lock is

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float | None = None, on_wait: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Take the lock, waiting up to ``timeout`` seconds (``None``: for ever).

        When another run holds it, ``on_wait`` is called once with the holder's
        ``{"pid", "user", "purpose", "since"}`` (values ``None`` when unknown;
        :func:`describe_holder` words it) before waiting. Raises
        :class:`NotDoneError` when the time runs out.
        """
        if self._fd is not None:
            raise GpuslateError(f"the host lock {self.path} is already held by this process")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        folder = open_lock_dir(self.path.parent)
        try:
            fd = _open_lock_file(folder, self.path.name)
        except BaseException:
            folder.close()
            raise
        self._dir = folder
        try:
            if not _try_lock(fd, self.path):
                info = self._wait_for_holder(fd, deadline)
                if info is not None:  # None: it came free while we looked for its holder
                    if on_wait is not None:
                        on_wait(info)
                    self._wait(fd, deadline)
            self._fd = fd
            self._write_holder()
        except BaseException:
            if self._fd is None:
                os.close(fd)
                self._close_dir()
            else:
                self.release()
            raise

    def release(self) -> None:
        """Let go of the lock (no-op when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # clear the advice first: once unlocked, the file is the next holder's
            if self._dir is not None:
                _truncate_holder(self._dir, self.holder_path.name)
        finally:
            os.close(fd)  # closing drops the flock
            self._close_dir()

    def _close_dir(self) -> None:
        folder, self._dir = self._dir, None
        if folder is not None:
            folder.close()

    def __enter__(self) -> HostLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- waiting ---------------------------------------------------------------

    def _wait_for_holder(self, fd: int, deadline: float | None) -> dict[str, Any] | None:
        """The live holder's info; ``None`` if the lock was acquired meanwhile.

        A new holder writes its file just after taking the lock, and a dead
        one leaves a stale file behind, so give a fresh holder a moment.
        """
        settle = time.monotonic() + _HOLDER_SETTLE
        while True:
            info = self._read_holder()
            if info["pid"] is not None:
                return info
            now = time.monotonic()
            if now >= settle or (deadline is not None and now >= deadline):
                return _kernel_holder(fd) or info
            time.sleep(_POLL_MIN)
            if _try_lock(fd, self.path):
                return None

    def _wait(self, fd: int, deadline: float | None) -> None:
        # Polling rather than a blocking flock: a blocking flock gets no timeout
        # without SIGALRM (not a library's to take) or a thread that cannot be
        # cancelled and might take the lock after we gave up.
        interval = _POLL_MIN
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._busy_error(fd)
                time.sleep(min(interval, left))
            else:
                time.sleep(interval)
            if _try_lock(fd, self.path):
                return
            interval = min(interval * 1.5, _POLL_MAX)

    def _busy_error(self, fd: int) -> NotDoneError:
        info = self._read_holder()
        if info["pid"] is None:
            info = _kernel_holder(fd) or info
        return NotDoneError(f"the host lock is still held by {describe_holder(info)}",
                            hint=f"lock file: {self.path}")

    # -- the holder file -------------------------------------------------------

    def _read_holder(self) -> dict[str, Any]:
        assert self._dir is not None
        return _read_holder_in(self._dir, self.holder_path.name)

    def _write_holder(self) -> None:
        from .._time import iso_time  # lazy: startup
        from ..proc.procfs import identity, user_name  # lazy: startup

        pid = os.getpid()
        ident = identity(pid)
        doc = {"pid": pid, "start_ticks": ident.start_ticks if ident else None,
               "user": user_name(os.getuid()), "purpose": self.purpose, "since": iso_time(time.time())}
        assert self._dir is not None
        try:
            fd = self._dir.open(self.holder_path.name, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:  # PermissionDenied too: another user's file, a FIFO, a link
            return  # only advice: never fail a run because of it
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(doc).encode())
        except OSError:
            pass
        finally:
            os.close(fd)


def describe_holder(info: dict[str, Any]) -> str:
    """Who holds the lock, in words, for "waiting for ..." and timeout messages."""
    if info.get("pid") is None:
        return "an unknown process (not found in the holder file or /proc/locks)"
    purpose = info.get("purpose") or "another gpuslate run"
    since = f", since {info['since']}" if info.get("since") else ""
    return f"{purpose} (pid {info['pid']}, user {info.get('user') or '?'}{since})"


def _kernel_holder(fd: int) -> dict[str, Any] | None:
    """The holder of the flock on ``fd``'s file as ``/proc/locks`` names it, or ``None``.

    For a program that is not gpuslate (no holder file) or a gpuslate whose file
    is gone. The line to match: ``N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF``
    (device numbers in hex); ``->`` lines are waiters, not holders.
    """
    from ..proc.procfs import read_info  # lazy: startup

    try:
        st = os.fstat(fd)
        with open("/proc/locks", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK":
            continue
        if fields[5] != dev:
            continue
        try:
            pid = int(fields[4])
        except ValueError:
            continue
        if pid <= 0:
            continue
        info = read_info(pid)
        name = info.name if info is not None else None
        return {"pid": pid, "user": info.user if info is not None else None,
                "purpose": f"process {name!r}" if name else "a process of another PID namespace", "since": None}
    return None


def read_holder(path: Path) -> dict[str, Any]:
    """What a ``.holder`` file says, if its process is still alive; else all ``None``."""
    try:
        folder = open_lock_dir(path.parent)
    except PermissionDenied:
        return dict(_UNKNOWN)
    with folder:
        return _read_holder_in(folder, path.name)


_UNKNOWN: dict[str, Any] = {"pid": None, "user": None, "purpose": None, "since": None}


def _read_holder_in(folder: StateDir, name: str) -> dict[str, Any]:
    try:  # never through a symlink, never a FIFO: in a shared folder anyone could plant one
        doc = json.loads(folder.read(name, 64 * 1024) or b"")
    except (OSError, ValueError):
        return dict(_UNKNOWN)
    if (not isinstance(doc, dict) or not isinstance(doc.get("pid"), int)
            or not _alive(doc["pid"], doc.get("start_ticks"))):
        return dict(_UNKNOWN)
    return {k: doc.get(k) for k in _UNKNOWN}


def _alive(pid: int, start_ticks: object) -> bool:
    from ..proc.procfs import read_stat  # lazy: startup

    if pid <= 0:
        return False
    st = read_stat(pid)
    if st is None:
        # another pid namespace (a container sharing the lock folder): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if st.has_exited:
        return False
    # the same pid with another start time is a different process
    return not isinstance(start_ticks, int) or st.start_ticks == start_ticks


def _try_lock(fd: int, path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise PermissionDenied(f"cannot lock {path}: {exc.strerror or exc}") from None
    return True


def _open_lock_file(folder: StateDir, name: str) -> int:
    """The lock file, read-only (``flock`` needs no more), created 0644 when missing.

    Never ``O_CREAT`` on an existing file: in a sticky world-writable folder,
    ``fs.protected_regular`` refuses that for files another user owns.
    """
    try:
        return folder.open(name, os.O_RDONLY | os.O_CREAT, 0o644)
    except PermissionDenied as exc:
        raise PermissionDenied(f"cannot open the host lock {folder.path / name}: {exc}",
                               hint="set GPUSLATE_LOCK_DIR to a directory every gpuslate user can write") from None
    except OSError as exc:
        raise PermissionDenied(f"cannot open the host lock {folder.path / name}: {exc.strerror or exc}",
                               hint="set GPUSLATE_LOCK_DIR to a directory every gpuslate user can write") from None


def _truncate_holder(folder: StateDir, name: str) -> None:
    try:
        fd = folder.open(name, os.O_WRONLY)
    except OSError:
        return
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)
