"""Exit codes: the one place where errors become process exit statuses.

Later commands use the same table; README.md documents it.
"""

from __future__ import annotations

from enum import IntEnum

from .. import errors


class ExitStatus(IntEnum):
    OK = 0
    INTERNAL_ERROR = 1
    USAGE = 2
    BACKEND_UNAVAILABLE = 3
    TIMEOUT = 4
    PERMISSION_DENIED = 5
    SERVER_FAILED = 6
    PARTIAL = 7
    INTERRUPTED = 130


_BY_ERROR: tuple[tuple[type[BaseException], ExitStatus], ...] = (
    (errors.UsageError, ExitStatus.USAGE),
    (errors.BackendUnavailable, ExitStatus.BACKEND_UNAVAILABLE),
    (errors.NotDoneError, ExitStatus.TIMEOUT),
    (errors.PermissionDenied, ExitStatus.PERMISSION_DENIED),
    (errors.ServerFailed, ExitStatus.SERVER_FAILED),
    (errors.PartialFailure, ExitStatus.PARTIAL),
    (errors.Interrupted, ExitStatus.INTERRUPTED),
    (KeyboardInterrupt, ExitStatus.INTERRUPTED),
    (errors.GpuQueryError, ExitStatus.INTERNAL_ERROR),
)


def exit_status_for(exc: BaseException) -> ExitStatus:
    if isinstance(exc, errors.RemoteCommandFailed):
        # the remote gpuslate's own status, when it is one of ours
        try:
            return ExitStatus(exc.exit_code)
        except ValueError:
            return ExitStatus.INTERNAL_ERROR
    for cls, status in _BY_ERROR:
        if isinstance(exc, cls):
            return status
    return ExitStatus.INTERNAL_ERROR


def fleet_exit_code(codes: list[int]) -> int:
    """One exit status for a run on several hosts: 0 when all succeeded; 7 (partial)
    when some failed and others did not; when all failed, their common status if
    they agree, else 7."""
    failed = [c for c in codes if c != ExitStatus.OK]
    if not failed:
        return ExitStatus.OK
    if len(failed) < len(codes) or len(set(failed)) > 1:
        return ExitStatus.PARTIAL
    return failed[0]


def exit_status_for_clear(status: object) -> ExitStatus:
    """The exit status of a finished ``clear`` (its result, not an exception)."""
    from ..slate.clear import ClearStatus  # only `clear` pays for importing it

    return {
        ClearStatus.CLEAN: ExitStatus.OK, ClearStatus.DRY_RUN: ExitStatus.OK,
        ClearStatus.TIMEOUT: ExitStatus.TIMEOUT, ClearStatus.HELD_BY_OTHERS: ExitStatus.TIMEOUT,
        ClearStatus.PERMISSION_DENIED: ExitStatus.PERMISSION_DENIED,
    }[status]  # type: ignore[index]
