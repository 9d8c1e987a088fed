"""Exit codes: the one place where errors and results become process exit statuses.

Commands never pick a number themselves: an error goes through
:func:`exit_status_for`, a finished result through :func:`exit_status_for_result`
(by its status enum: every result has one), and the JSON error document's ``type`` through
:func:`error_type_for`. README.md documents the table.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum, IntEnum
from functools import cache
from typing import TYPE_CHECKING, Any

from .. import errors
from .render.output import OutputLost

if TYPE_CHECKING:
    from ..remote.fleet import HostOutcome
    from ..slate.clear import ClearResult
    from ..slate.wait import WaitResult
    from ..slurm.hooks import HookResult
    from ..units.batch import BatchResult
    from ..units.lifecycle import DownResult, UpResult
    from ..units.listing import PsResult
    from ..units.remove import RmResult
    from ..units.restart import RestartResult
    from ..units.swap import SwapResult as _Swap

    CommandResult = (ClearResult | WaitResult | UpResult | DownResult | _Swap | PsResult | HookResult | RestartResult
                     | RmResult | BatchResult)


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
    (errors.GpuQueryError, ExitStatus.INTERNAL_ERROR),
)

#: every result's status -> its exit code, one table per status enum (keyed by the enums, never
#: strings: two enums may share a value, "timeout", and still mean their own code). A table is built
#: when a status of its enum is looked up, from the module that defines the enum -- already loaded,
#: since a result of it exists -- so that `clear` does not import units/ or slurm/ for its exit code,
#: nor ``--help`` anything.
_OK, _TIMEOUT, _DENIED, _FAILED = (ExitStatus.OK, ExitStatus.TIMEOUT, ExitStatus.PERMISSION_DENIED,
                                   ExitStatus.SERVER_FAILED)


def _clear_codes() -> dict[Any, ExitStatus]:
    from ..slate.clear import ClearStatus  # lazy: startup (see above)

    return {ClearStatus.CLEAN: _OK, ClearStatus.DRY_RUN: _OK, ClearStatus.TIMEOUT: _TIMEOUT,
            ClearStatus.HELD_BY_OTHERS: _TIMEOUT,  # every target gone, the GPUs held by what is not one
            ClearStatus.LEAKED: _TIMEOUT,  # every target gone, memory held by no process stays
            ClearStatus.NOTHING_SELECTED: _TIMEOUT,  # the selector chose nothing this caller may signal
            ClearStatus.REFUSED: _TIMEOUT,  # a target the act-time gate refused still holds GPU memory
            ClearStatus.PERMISSION_DENIED: _DENIED}


def _wait_codes() -> dict[Any, ExitStatus]:
    from ..slate.wait import WaitStatus  # lazy: startup (see above)

    return {WaitStatus.FREE: _OK, WaitStatus.NOT_FREE: _TIMEOUT, WaitStatus.LEAKED: _TIMEOUT}


def _up_codes() -> dict[Any, ExitStatus]:
    from ..units.lifecycle import UpStatus  # lazy: startup (see above)

    return {UpStatus.READY: _OK, UpStatus.TIMEOUT: _TIMEOUT, UpStatus.EXITED: _FAILED,
            UpStatus.SMOKE_FAILED: _FAILED}


def _down_codes() -> dict[Any, ExitStatus]:
    from ..units.lifecycle import DownStatus  # lazy: startup (see above)

    return {DownStatus.STOPPED: _OK, DownStatus.TIMEOUT: _TIMEOUT, DownStatus.PERMISSION_DENIED: _DENIED,
            DownStatus.NOT_RULED_OUT: _TIMEOUT}


def _swap_codes() -> dict[Any, ExitStatus]:
    from ..units.swap import SwapStatus  # lazy: startup (see above)

    return {SwapStatus.SWAPPED: _OK, SwapStatus.DOWN_FAILED: _TIMEOUT, SwapStatus.UP_FAILED: _FAILED,
            SwapStatus.ROLLED_BACK: _FAILED, SwapStatus.ROLLBACK_FAILED: _FAILED}


def _ps_codes() -> dict[Any, ExitStatus]:
    from ..units.listing import PsStatus  # lazy: startup (see above)

    return {PsStatus.LISTED: _OK}


def _hook_codes() -> dict[Any, ExitStatus]:
    from ..slurm.hooks import HookStatus  # lazy: startup (see above)

    # slurm prolog/epilog: the GPUs not free in time; the node drained (or not asked to be: --no-drain)
    return {HookStatus.CLEAN: _OK, HookStatus.DRAINED: _TIMEOUT, HookStatus.NOT_FREE: _TIMEOUT,
            HookStatus.DRAIN_FAILED: ExitStatus.NOT_DRAINED}


def _sim_codes() -> dict[Any, ExitStatus]:
    from ..gpu.sim.results import SimStatus  # lazy: startup (see above)

    return {SimStatus.CREATED: _OK, SimStatus.LEAKED: _OK}


def _install_codes() -> dict[Any, ExitStatus]:
    from ..remote.zipapp import InstallStatus  # lazy: startup (see above)

    return {InstallStatus.INSTALLED: _OK, InstallStatus.WRITTEN: _OK}


def _bench_codes() -> dict[Any, ExitStatus]:
    from ..bench.result import BenchStatus  # lazy: startup (see above)

    # interrupted: Ctrl-C's code; the command gives SIGTERM's (143) when that was the signal
    return {BenchStatus.COMPLETE: _OK, BenchStatus.PARTIAL: ExitStatus.PARTIAL, BenchStatus.FAILED: _FAILED,
            BenchStatus.INTERRUPTED: ExitStatus.INTERRUPTED}


def _experiment_codes() -> dict[Any, ExitStatus]:
    from ..bench.report import ExperimentStatus  # lazy: startup (see above)

    return {ExperimentStatus.REPORTED: _OK, ExperimentStatus.COMPLETE: _OK,
            ExperimentStatus.PARTIAL: ExitStatus.PARTIAL, ExperimentStatus.FAILED: _FAILED}


def _demo_codes() -> dict[Any, ExitStatus]:
    from ..bench.report import DemoStatus  # lazy: startup (see above)

    return {DemoStatus.CLEAN: _OK, DemoStatus.NOT_CLEAN: _TIMEOUT}


def _restart_codes() -> dict[Any, ExitStatus]:
    from ..units.restart import RestartStatus  # lazy: startup (see above)

    # a failed part's own code wins (exit_status_of): these are what the status alone says
    return {RestartStatus.RESTARTED: _OK, RestartStatus.DOWN_FAILED: _TIMEOUT, RestartStatus.UP_FAILED: _FAILED}


def _rm_codes() -> dict[Any, ExitStatus]:
    from ..units.remove import RmStatus  # lazy: startup (see above)

    return {RmStatus.REMOVED: _OK}


def _batch_codes() -> dict[Any, ExitStatus]:
    from ..units.batch import BatchStatus  # lazy: startup (see above)

    # several units, one failed: 7 when others did not (exit_status_of: the failed one's code when it
    # was the only one run, as fleet_exit_code reads hosts)
    return {BatchStatus.DONE: _OK, BatchStatus.FAILED: ExitStatus.PARTIAL}


def _logs_codes() -> dict[Any, ExitStatus]:
    from ..units.logfile import LogsStatus  # lazy: startup (see above)

    return {LogsStatus.SHOWN: _OK}


#: the status enum (by where it is defined) -> its table
_TABLES: dict[str, Callable[[], dict[Any, ExitStatus]]] = {
    "gpuslate.slate.clear.ClearStatus": _clear_codes,
    "gpuslate.slate.wait.WaitStatus": _wait_codes,
    "gpuslate.units.lifecycle.UpStatus": _up_codes,
    "gpuslate.units.lifecycle.DownStatus": _down_codes,
    "gpuslate.units.swap.SwapStatus": _swap_codes,
    "gpuslate.units.listing.PsStatus": _ps_codes,
    "gpuslate.slurm.hooks.HookStatus": _hook_codes,
    "gpuslate.gpu.sim.results.SimStatus": _sim_codes,
    "gpuslate.remote.zipapp.InstallStatus": _install_codes,
    "gpuslate.bench.result.BenchStatus": _bench_codes,
    "gpuslate.bench.report.ExperimentStatus": _experiment_codes,
    "gpuslate.bench.report.DemoStatus": _demo_codes,
    "gpuslate.units.logfile.LogsStatus": _logs_codes,
    "gpuslate.units.restart.RestartStatus": _restart_codes,
    "gpuslate.units.remove.RmStatus": _rm_codes,
    "gpuslate.units.batch.BatchStatus": _batch_codes,
}


@cache
def _table(enum: type[Enum]) -> dict[Any, ExitStatus]:
    build = _TABLES.get(f"{enum.__module__}.{enum.__qualname__}")
    table = build() if build is not None else {}
    if any(type(member) is not enum for member in table):  # the table's enum moved or was renamed
        raise AssertionError(f"the exit-code table for {enum.__qualname__} is keyed by another enum")
    return table


def result_status_enums() -> list[type[Enum]]:
    """Every result status enum the table knows (a test checks each member has a code); this loads them all."""
    return [type(next(iter(build()))) for build in _TABLES.values()]


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
        return _table(type(status))[status]
    except KeyError:
        raise AssertionError(f"no exit code for result status {status!r}") from None


def exit_status_of(result: CommandResult) -> ExitStatus:
    """A command result's exit code: by its status; a failed swap or restart by the part that failed
    (stopping OLD, starting NEW), with that part's own status; a batch of units as a fleet of hosts
    (:func:`fleet_exit_code` over the units that ran)."""
    swap = sys.modules.get("gpuslate.units.swap")  # a SwapResult exists only where its module is loaded
    restart = sys.modules.get("gpuslate.units.restart")
    batch = sys.modules.get("gpuslate.units.batch")
    if (swap is not None and isinstance(result, swap.SwapResult)) or (
            restart is not None and isinstance(result, restart.RestartResult)):
        if result.down is not None and not result.down.ok:
            return exit_status_for_result(result.down.status)
        if result.up is not None and not result.up.ok:
            return exit_status_for_result(result.up.status)
    if batch is not None and isinstance(result, batch.BatchResult) and not result.ok:
        return ExitStatus(fleet_exit_code([exit_status_of(r) for r in result.results]))
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
