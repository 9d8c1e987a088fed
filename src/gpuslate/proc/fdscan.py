"""Find the processes that hold GPU device files open.

This is what ``fuser /dev/nvidia*`` does, restricted to what gpuslate needs:
one pass over ``/proc/*/fd`` reading each link once. The simulated backend
puts its device files under ``SIMDIR/dev/nvidia*`` and is discovered by this
very same scan.

A process whose main thread has exited (``pthread_exit``) while another thread
keeps its files shows an empty ``/proc/PID/fd``: its files are in a live
thread's ``/proc/PID/task/TID/fd`` (:func:`fd_dir`). Only an empty table of a
process with more than one thread costs a second look, so kernel threads and
ordinary processes cost what they did.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .procfs import MAX_TASKS_READ, PROC, read_stat


class FdScan(NamedTuple):
    """Result of one scan: which pids hold which device files, and what we could not read."""

    holders: dict[int, set[str]]  # pid -> device paths it holds open
    unreadable: list[int]  # pids whose fd table we may not read (not ours, not root)


def thread_fd_dir(pid: int) -> str | None:
    """The fd folder of a live thread of ``pid`` whose leader thread has exited (its own
    table then reads empty); None for any other process: a kernel thread, a process with
    no open file, a true zombie. ``/proc/PID/task`` links 2 + the number of threads, so
    a process of one thread is told by one ``stat``."""
    try:
        if os.stat(f"{PROC}/{pid}/task").st_nlink <= 3:
            return None
    except OSError:
        return None
    st = read_stat(pid)
    return f"{st.image_dir}/fd/" if st is not None and st.live_task is not None else None


def fd_dir(pid: int) -> str:
    """The folder that lists ``pid``'s open files (see :func:`thread_fd_dir`); costs a read of
    its ``stat`` only where its own table is empty."""
    own = f"{PROC}/{pid}/fd/"
    try:
        if os.listdir(own):
            return own
    except OSError:
        return own
    return thread_fd_dir(pid) or own


def read_fd_targets(pid: int, *, threads: bool = False) -> frozenset[str] | None:
    """What a process's fds point to; ``None`` when its fd table may not be read,
    empty when it is gone. ``threads``: those of every thread too (at most
    :data:`~.procfs.MAX_TASKS_READ`): a thread that called ``unshare(CLONE_FILES)`` has a
    table of its own, which ``/proc/PID/fd`` does not show."""
    dirs = [fd_dir(pid)]
    if threads:
        try:
            tids = os.listdir(f"{PROC}/{pid}/task")[:MAX_TASKS_READ]
        except OSError:
            tids = []
        dirs += [f"{PROC}/{pid}/task/{t}/fd/" for t in tids]
    out: set[str] = set()
    for i, where in enumerate(dirs):
        try:
            fds = os.listdir(where)
        except PermissionError:
            if i == 0:
                return None
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                out.add(os.readlink(where + fd))
            except OSError:
                continue
    return frozenset(out)


def scan_device_holders(prefixes: tuple[str, ...], *, exclude_pids: frozenset[int] = frozenset()) -> FdScan:
    """Return every process holding an open fd whose target starts with one of ``prefixes``.

    Processes that vanish during the scan are skipped; processes whose fd
    table is not readable are listed in ``unreadable`` rather than silently
    dropped, so a caller can say the picture is incomplete.
    """
    holders: dict[int, set[str]] = {}
    unreadable: list[int] = []
    readlink = os.readlink
    listdir = os.listdir
    for name in listdir(PROC):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in exclude_pids:
            continue
        where = f"{PROC}/{name}/fd/"
        try:
            fds = listdir(where)
        except PermissionError:
            unreadable.append(pid)
            continue
        except OSError:  # exited, or a kernel thread without an fd table
            continue
        if not fds:  # no open file, a kernel thread, or a leader thread that exited
            where = thread_fd_dir(pid) or ""
            try:
                fds = listdir(where) if where else []
            except OSError:
                continue
        found: set[str] | None = None
        for fd in fds:
            try:
                target = readlink(where + fd)
            except OSError:
                continue
            if target.startswith(prefixes):
                if found is None:
                    found = holders[pid] = set()
                found.add(target)
    return FdScan(holders, unreadable)
