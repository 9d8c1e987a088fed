"""Exit codes: the one place where errors and results become process exit statuses.

Commands never pick a number themselves: an error goes through
:func:`exit_status_for`, a finished result through :func:`exit_status_for_result`
(by its status), and the JSON error document's ``type`` through
:func:`error_type_for`. README.md documents the table.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from .. import errors

if TYPE_CHECKING:
    from ..remote.fleet import HostOutcome


class ExitStatus(IntEnum):
    OK = 0
    INTERNAL_ERROR = 1
    USAGE = 2
    BACKEND_UNAVAILABLE = 3
    TIMEOUT = 4
    PERMISSION_DENIED = 5
    SERVER_FAILED = 6
    PARTIAL = 7
    NOT_DRAINED = 8  # slurm prolog/epilog: the GPUs are not free and scontrol could not drain the node
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM, where a command finishes like an interrupt (bench, experiment, demo)


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

#: the status of every result a command reports (clear, wait, up, down, swap) -> its exit code
_BY_RESULT: dict[str, ExitStatus] = {
    # done
    "clean": ExitStatus.OK, "dry_run": ExitStatus.OK, "free": ExitStatus.OK, "ready": ExitStatus.OK,
    "stopped": ExitStatus.OK, "swapped": ExitStatus.OK,
    # not done in time (GPUs not free, server not ready, unit not stopped)
    "timeout": ExitStatus.TIMEOUT, "not_free": ExitStatus.TIMEOUT, "down_failed": ExitStatus.TIMEOUT,
    "held_by_others": ExitStatus.TIMEOUT,  # clear: every target gone, the GPUs held by what is not one
    "nothing_selected": ExitStatus.TIMEOUT,  # clear: the selector chose nothing this caller may signal
    "refused": ExitStatus.TIMEOUT,  # clear: a target the act-time gate refused still holds GPU memory
    "permission_denied": ExitStatus.PERMISSION_DENIED,
    # a managed server failed
    "exited": ExitStatus.SERVER_FAILED, "smoke_failed": ExitStatus.SERVER_FAILED, "failed": ExitStatus.SERVER_FAILED,
    "up_failed": ExitStatus.SERVER_FAILED, "rolled_back": ExitStatus.SERVER_FAILED,
    "rollback_failed": ExitStatus.SERVER_FAILED,
    "partial": ExitStatus.PARTIAL,
    # slurm prolog/epilog: the GPUs not free in time; the node drained (or not asked to be: --no-drain)
    "drained": ExitStatus.TIMEOUT,
    "drain_failed": ExitStatus.NOT_DRAINED,
    "interrupted": ExitStatus.INTERRUPTED,
}


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


def exit_status_for_result(status: str) -> ExitStatus:
    """The exit code of a result by its status (a ``str`` enum member or its value)."""
    try:
        return _BY_RESULT[str(getattr(status, "value", status))]
    except KeyError:
        raise AssertionError(f"no exit code for result status {status!r}") from None


def error_type_for(exc: BaseException) -> str:
    """``error.type`` of the JSON error document: the error's code; an interrupt is ``interrupted``."""
    if isinstance(exc, errors.GpuslateError):
        return exc.code
    if isinstance(exc, KeyboardInterrupt):
        return errors.Interrupted.code
    return "internal"


_COMMON_HELP: dict[int, str] = {
    ExitStatus.OK: "ok", ExitStatus.USAGE: "bad input (nothing was done)",
    ExitStatus.BACKEND_UNAVAILABLE: "no GPU backend (no NVIDIA driver, no simulated host)",
    ExitStatus.INTERRUPTED: "interrupted",
}


def exit_epilog(specific: dict[int, str] | None = None, *, backend: bool = True) -> str:
    """The "exit status" paragraph of a command's help: the common codes and its own."""
    table = dict(_COMMON_HELP)
    if not backend:
        del table[ExitStatus.BACKEND_UNAVAILABLE]
    table.update(specific or {})
    return "exit status: " + "; ".join(f"{int(code)} {text}" for code, text in sorted(table.items())) + \
        " (see README.md, Exit codes)."


def exit_code_of(outcome: HostOutcome) -> int:
    """A host's exit status in a fleet run: 0, or its failure's (the remote's own for a command
    that failed there)."""
    return 0 if outcome.error is None else int(exit_status_for(outcome.error))
