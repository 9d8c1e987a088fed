"""Exit codes: the one place where errors and results become process exit statuses.

Commands never pick a number themselves: an error goes through
:func:`exit_status_for`, a finished result through :func:`exit_status_of` (by its status enum
member's :class:`~gpuslate.outcome.Outcome`, said where the enum is defined: every result has one,
and one dict here maps outcomes to codes), and the JSON error document's ``type`` through
:func:`error_type_for`. README.md documents the table.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING

from .. import errors
from ..outcome import Outcome, Parted, PartedStatus, StatusEnum
from .render.output import OutputLost

if TYPE_CHECKING:
    from ..outcome import HasStatus
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
    OUTPUT_LOST = 141  # stdout closed or its reader gone (128 + SIGPIPE): see cli/render/output.py
    TERMINATED = 143  # SIGTERM, where a command finishes like an interrupt (bench, experiment, demo)


_BY_ERROR: tuple[tuple[type[BaseException], ExitStatus], ...] = (
    (errors.UsageError, ExitStatus.USAGE),
    (errors.BackendUnavailable, ExitStatus.BACKEND_UNAVAILABLE),
    (errors.NotDoneError, ExitStatus.TIMEOUT),
    (errors.PermissionDenied, ExitStatus.PERMISSION_DENIED),
    (errors.ServerFailed, ExitStatus.SERVER_FAILED),
    (errors.PartialFailure, ExitStatus.PARTIAL),
    (errors.Interrupted, ExitStatus.INTERRUPTED),
    (OutputLost, ExitStatus.OUTPUT_LOST),
    (KeyboardInterrupt, ExitStatus.INTERRUPTED),
    # the driver refused a checkpoint call outside a park's own handling (its driver_code says which)
    (errors.CheckpointError, ExitStatus.SERVER_FAILED),
    (errors.GpuQueryError, ExitStatus.INTERNAL_ERROR),
)

#: a result's outcome (said by its status enum member, where the enum is defined: gpuslate/outcome.py)
#: -> its exit code; e.g. ``leaked`` is NOT_DONE for ``clear`` (4) and DONE for ``sim leak`` (0)
_BY_OUTCOME: dict[Outcome, ExitStatus] = {
    Outcome.DONE: ExitStatus.OK, Outcome.NOT_DONE: ExitStatus.TIMEOUT, Outcome.DENIED: ExitStatus.PERMISSION_DENIED,
    Outcome.FAILED: ExitStatus.SERVER_FAILED, Outcome.PARTIAL: ExitStatus.PARTIAL,
    Outcome.NOT_DRAINED: ExitStatus.NOT_DRAINED,
    # bench: Ctrl-C's code; the command gives SIGTERM's (143) when that was the signal
    Outcome.INTERRUPTED: ExitStatus.INTERRUPTED,
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


def exit_status_for_result(status: StatusEnum) -> ExitStatus:
    """The exit code of a result by its status enum member: by the member's outcome."""
    if not isinstance(status, StatusEnum):
        raise AssertionError(f"no exit code for result status {status!r}: not a StatusEnum member")
    return _BY_OUTCOME[status.outcome]


def exit_status_of(result: HasStatus) -> ExitStatus:
    """A command result's exit code: by its status; a failed result made of parts (its status a
    :class:`~gpuslate.outcome.PartedStatus`) as a fleet of hosts (:func:`fleet_exit_code`) over the
    parts that decide it: a swap's or a restart's failed part (stopping OLD, starting NEW) with its
    own status, a batch's units that ran."""
    status = exit_status_for_result(result.status)
    if status == ExitStatus.OK or not isinstance(result.status, PartedStatus):
        return status
    if not isinstance(result, Parted):  # a PartedStatus is a Parted result's (tests/cli/test_exits.py)
        raise AssertionError(f"{type(result).__name__}: a PartedStatus result without parts")
    parts = result.deciding_parts()
    return ExitStatus(fleet_exit_code([exit_status_of(p) for p in parts])) if parts else status


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
