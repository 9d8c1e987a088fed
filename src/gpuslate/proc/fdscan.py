"""Find the processes that hold GPU device files open.

This is what ``fuser /dev/nvidia*`` does, restricted to what gpuslate needs:
one pass over ``/proc/*/fd`` reading each link once. The simulated backend
puts its device files under ``SIMDIR/dev/nvidia*`` and is discovered by this
very same scan.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from .procfs import PROC


class FdScan(NamedTuple):
    """Result of one scan: which pids hold which device files, and what we could not read."""

    holders: dict[int, set[str]]  # pid -> device paths it holds open
    unreadable: list[int]  # pids whose fd table we may not read (not ours, not root)


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
        fd_dir = f"{PROC}/{name}/fd/"
        try:
            fds = listdir(fd_dir)
        except PermissionError:
            unreadable.append(pid)
            continue
        except OSError:  # exited, or a kernel thread without an fd table
            continue
        found: set[str] | None = None
        for fd in fds:
            try:
                target = readlink(fd_dir + fd)
            except OSError:
                continue
            if target.startswith(prefixes):
                if found is None:
                    found = holders[pid] = set()
                found.add(target)
    return FdScan(holders, unreadable)
