"""Signal exactly the process we mean, never a successor that reused its PID.

With a pidfd (Linux 5.3+) there is no race at all: the pidfd is opened first,
then the start time is checked through /proc; if it matches, the pidfd refers
to that very process for as long as it is open, whatever happens to the PID.
Without pidfds the identity is checked right before ``kill(2)`` (psutil's
guard), which leaves a window of microseconds.
"""

from __future__ import annotations

import os
import select
import signal as _signal

from .procfs import ProcessId, read_stat

#: outcomes of one signal, as written to the audit log
DELIVERED = "delivered"
NOT_RUNNING = "not_running"
PID_REUSED = "pid_reused"
PERMISSION_DENIED = "permission_denied"

_HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(_signal, "pidfd_send_signal")


def _check(ident: ProcessId, *, zombie_is_gone: bool = True) -> str | None:
    """Why ``ident`` cannot be signaled or waited for (gone, reused), or None."""
    st = read_stat(ident.pid)
    if st is None:
        return NOT_RUNNING
    if st.start_ticks != ident.start_ticks:
        return PID_REUSED
    if zombie_is_gone and st.has_exited:
        return NOT_RUNNING  # exited; only its exit status remains
    return None


def _pidfd_open(pid: int) -> int | str | None:
    """A pidfd for ``pid`` (whoever has it now: check the identity after), or why not
    (NOT_RUNNING, PERMISSION_DENIED); None where pidfds are missing."""
    global _HAVE_PIDFD
    if not _HAVE_PIDFD:
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return NOT_RUNNING
    except PermissionError:
        return PERMISSION_DENIED
    except OSError:  # ENOSYS (old kernel, some sandboxes): fall back for good
        _HAVE_PIDFD = False
        return None


def send_signal(ident: ProcessId, sig: int) -> str:
    """Send ``sig`` to the process ``ident`` names; return the outcome (never raises for
    the ordinary cases: gone, reused, not permitted)."""
    fd = _pidfd_open(ident.pid)
    if isinstance(fd, str):
        return fd
    if fd is not None:
        try:
            problem = _check(ident)
            if problem:
                return problem
            _signal.pidfd_send_signal(fd, sig)
            return DELIVERED
        except ProcessLookupError:
            return NOT_RUNNING
        except PermissionError:
            return PERMISSION_DENIED
        finally:
            os.close(fd)
    problem = _check(ident)
    if problem:
        return problem
    try:
        os.kill(ident.pid, sig)
        return DELIVERED
    except ProcessLookupError:
        return NOT_RUNNING
    except PermissionError:
        return PERMISSION_DENIED


def is_gone(ident: ProcessId) -> bool:
    """True once the process has exited (a zombie has) or its PID now names another."""
    return _check(ident) is not None


def reap_if_child(pid: int) -> None:
    """Collect the exit status of our own child, so it does not stay a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class ExitWatch:
    """Sleeps until one of the watched processes exits, instead of polling.

    Each process is watched through a pidfd, opened and then checked against its
    start time like a signal (so it is the very process meant). A pidfd becomes
    readable when the whole process has exited: every thread, not only the
    leader, which can be a zombie while other threads still tear down GPU
    contexts. :meth:`exited` says so per process; ``None`` for a process that
    could not be watched (no pidfds here), which the caller then checks by
    polling /proc, as :meth:`wait` then sleeps only ``fallback`` seconds.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._fds: dict[int, int] = {}  # pid -> pidfd
        self._done: set[int] = set()
        self._unwatched: set[int] = set()
        self.complete = True  # every process added is watched by a pidfd

    def add(self, ident: ProcessId) -> None:
        pid = ident.pid
        if pid in self._fds or pid in self._done or pid in self._unwatched:
            return
        fd = _pidfd_open(pid)
        if fd is None or fd == PERMISSION_DENIED:  # not watchable here: the caller polls /proc
            self.complete = False
            return
        if isinstance(fd, str):  # already gone: nothing to wait for
            self._done.add(pid)
            return
        if _check(ident, zombie_is_gone=False):  # the pid names another process now
            os.close(fd)
            self._done.add(pid)
            return
        self._fds[pid] = fd
        self._poll.register(fd, select.POLLIN)

    def exited(self, pid: int) -> bool | None:
        if pid in self._done:
            return True
        return False if pid in self._fds else None

    def wait(self, timeout: float, fallback: float) -> None:
        """Return when a watched process exits, or after ``timeout`` seconds; at
        most ``fallback`` seconds when some process is not watched, and at once
        when no process is left to wait for."""
        if not self.complete:
            timeout = min(timeout, fallback)
        if not self._fds:  # nothing left to wake on: poll /proc again after the fallback delay
            if not self.complete and timeout > 0:
                select.select([], [], [], timeout)
            return
        ready = self._poll.poll(max(0.0, timeout) * 1000.0)
        if ready:
            by_fd = {fd: pid for pid, fd in self._fds.items()}
            for fd, events in ready:
                pid = by_fd[fd]
                self._poll.unregister(fd)
                os.close(self._fds.pop(pid))
                if events & select.POLLIN:
                    self._done.add(pid)
                else:  # a pidfd this kernel cannot poll (POLLNVAL, POLLERR): watch it through /proc
                    self._unwatched.add(pid)
                    self.complete = False

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
