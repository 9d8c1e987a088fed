"""Signal exactly the process we mean, never a successor that reused its PID.

With a pidfd (Linux 5.3+) there is no race at all: the pidfd is opened first,
then the start time is checked through /proc; if it matches, the pidfd refers
to that very process for as long as it is open, whatever happens to the PID.
Without pidfds the identity is checked right before ``kill(2)`` (psutil's
guard), which leaves a window of microseconds.
"""

from __future__ import annotations

import os
import signal as _signal

from .procfs import ProcessId, read_stat

#: outcomes of one signal, as written to the audit log
DELIVERED = "delivered"
NOT_RUNNING = "not_running"
PID_REUSED = "pid_reused"
PERMISSION_DENIED = "permission_denied"

_HAVE_PIDFD = hasattr(os, "pidfd_open") and hasattr(_signal, "pidfd_send_signal")


def _check(ident: ProcessId) -> str | None:
    st = read_stat(ident.pid)
    if st is None:
        return NOT_RUNNING
    if st.start_ticks != ident.start_ticks:
        return PID_REUSED
    if st.has_exited:
        return NOT_RUNNING  # exited; only its exit status remains
    return None


def send_signal(ident: ProcessId, sig: int) -> str:
    """Send ``sig`` to the process ``ident`` names; return the outcome (never raises for
    the ordinary cases: gone, reused, not permitted)."""
    global _HAVE_PIDFD
    if _HAVE_PIDFD:
        try:
            fd = os.pidfd_open(ident.pid)
        except ProcessLookupError:
            return NOT_RUNNING
        except PermissionError:
            return PERMISSION_DENIED
        except OSError:  # ENOSYS (old kernel, some sandboxes): fall back for good
            _HAVE_PIDFD = False
        else:
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
