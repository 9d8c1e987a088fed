"""Exit codes: the one place where errors and results become process exit statuses.

Commands never pick a number themselves: an error goes through
:func:`exit_status_for`, a finished result through :func:`exit_status_for_result`
(by its status enum: every result has one), and the JSON error document's ``type`` through
:func:`error_type_for`. README.md documents the table.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from functools import cache
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from ..remote.fleet import HostOutcome
    from ..slate.clear import ClearResult
    from ..slate.wait import WaitResult
    from ..slurm.hooks import HookResult
    from ..units.lifecycle import DownResult, UpResult
    from ..units.listing import PsResult
    from ..units.swap import SwapResult as _Swap

    CommandResult = ClearResult | WaitResult | UpResult | DownResult | _Swap | PsResult | HookResult


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

#: every result's status -> its exit code, one table per status enum (keyed by the enums, never
#: strings: two enums may share a value, "timeout", and still mean their own code). The enums are
#: imported only when a result is looked up: ``--help`` and bad input never load the packages.
@cache
def _by_result() -> dict[type[Enum], dict[Any, ExitStatus]]:
    from ..slate.clear import ClearStatus  # lazy: startup
    from ..slate.wait import WaitStatus  # lazy: startup
    from ..slurm.hooks import HookStatus  # lazy: startup
    from ..units.lifecycle import DownStatus, UpStatus  # lazy: startup
    from ..units.listing import PsStatus  # lazy: startup
    from ..units.swap import SwapStatus  # lazy: startup

    ok, timeout, denied, failed = (ExitStatus.OK, ExitStatus.TIMEOUT, ExitStatus.PERMISSION_DENIED,
                                   ExitStatus.SERVER_FAILED)
    return {
        ClearStatus: {
            ClearStatus.CLEAN: ok, ClearStatus.DRY_RUN: ok, ClearStatus.TIMEOUT: timeout,
            ClearStatus.HELD_BY_OTHERS: timeout,  # every target gone, the GPUs held by what is not one
            ClearStatus.NOTHING_SELECTED: timeout,  # the selector chose nothing this caller may signal
            ClearStatus.REFUSED: timeout,  # a target the act-time gate refused still holds GPU memory
            ClearStatus.PERMISSION_DENIED: denied},
        WaitStatus: {WaitStatus.FREE: ok, WaitStatus.NOT_FREE: timeout},
        UpStatus: {UpStatus.READY: ok, UpStatus.TIMEOUT: timeout, UpStatus.EXITED: failed,
                   UpStatus.SMOKE_FAILED: failed},
        DownStatus: {DownStatus.STOPPED: ok, DownStatus.TIMEOUT: timeout, DownStatus.PERMISSION_DENIED: denied},
        SwapStatus: {SwapStatus.SWAPPED: ok, SwapStatus.DOWN_FAILED: timeout, SwapStatus.UP_FAILED: failed,
                     SwapStatus.ROLLED_BACK: failed, SwapStatus.ROLLBACK_FAILED: failed},
        PsStatus: {PsStatus.LISTED: ok},
        # slurm prolog/epilog: the GPUs not free in time; the node drained (or not asked to be: --no-drain)
        HookStatus: {HookStatus.CLEAN: ok, HookStatus.DRAINED: timeout, HookStatus.NOT_FREE: timeout,
                     HookStatus.DRAIN_FAILED: ExitStatus.NOT_DRAINED},
    }


def result_status_enums() -> list[type[Enum]]:
    """Every result status enum the table knows (a test checks each member has a code)."""
    return list(_by_result())


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


def exit_status_for_result(status: Enum) -> ExitStatus:
    """The exit code of a result by its status enum member."""
    try:
        return _by_result()[type(status)][status]
    except KeyError:
        raise AssertionError(f"no exit code for result status {status!r}") from None


def exit_status_of(result: CommandResult) -> ExitStatus:
    """A command result's exit code: by its status; a failed swap by the part that failed (stopping
    OLD, starting NEW), with that part's own status."""
    from ..units.swap import SwapResult, SwapStatus  # lazy: startup

    if isinstance(result, SwapResult):
        if result.status == SwapStatus.DOWN_FAILED:
            return exit_status_for_result(result.down.status)
        if result.up is not None and not result.up.ok:
            return exit_status_for_result(result.up.status)
    return exit_status_for_result(result.status)


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
