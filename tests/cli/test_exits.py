"""Exit codes come from each result status member's Outcome (gpuslate/outcome.py): every member of
every status enum has one by construction, each outcome has a code, and two enums sharing a value
("timeout", "leaked") keep their own meanings."""

from __future__ import annotations

import pytest

from gpuslate.bench.report import DemoStatus, ExperimentStatus
from gpuslate.bench.result import BenchStatus
from gpuslate.clearing.clear import ClearStatus
from gpuslate.cli.exits import ExitStatus, exit_status_for_result, exit_status_of
from gpuslate.gpu.simhost.results import SimStatus
from gpuslate.outcome import Outcome, Parted, PartedStatus, StatusEnum, status_enums
from gpuslate.remote.zipapp import InstallStatus
from gpuslate.slurm.hooks import HookStatus
from gpuslate.units.batch import BatchStatus
from gpuslate.units.lifecycle import DownStatus, UpStatus
from gpuslate.units.restart import RestartStatus
from gpuslate.units.swap import SwapStatus


def test_every_status_of_every_result_has_an_exit_code():
    enums = all_status_enums()
    assert {ClearStatus, UpStatus, DownStatus, SwapStatus, HookStatus, BenchStatus, ExperimentStatus, SimStatus,
            InstallStatus, DemoStatus} <= set(enums)
    for enum in enums:
        for member in enum:
            assert isinstance(exit_status_for_result(member), ExitStatus)


def test_looked_up_by_enum_not_by_string():
    assert exit_status_for_result(UpStatus.TIMEOUT) == ExitStatus.TIMEOUT
    assert exit_status_for_result(UpStatus.EXITED) == ExitStatus.SERVER_FAILED
    assert exit_status_for_result(HookStatus.DRAIN_FAILED) == ExitStatus.NOT_DRAINED
    assert [exit_status_for_result(s) for s in BenchStatus] == [0, 7, 6, 130]  # complete, partial, failed, interrupted
    assert [exit_status_for_result(s) for s in ExperimentStatus] == [0, 0, 7, 6]  # reported, complete, partial, failed
    with pytest.raises(AssertionError, match="no exit code"):
        exit_status_for_result("timeout")  # type: ignore[arg-type]
    assert exit_status_for_result(ClearStatus.LEAKED) == ExitStatus.TIMEOUT
    assert exit_status_for_result(SimStatus.LEAKED) == ExitStatus.OK  # the same value, its own meaning


#: every module that defines a result's status enum (status_enums() lists those imported)
STATUS_MODULES = ("gpuslate.clearing.clear", "gpuslate.clearing.wait", "gpuslate.units.lifecycle",
                  "gpuslate.units.swap", "gpuslate.units.listing", "gpuslate.slurm.hooks",
                  "gpuslate.gpu.simhost.results",
                  "gpuslate.remote.zipapp", "gpuslate.bench.result", "gpuslate.bench.report",
                  "gpuslate.units.logfile", "gpuslate.units.restart", "gpuslate.units.remove",
                  "gpuslate.units.batch", "gpuslate.host.auditlist", "gpuslate.host.snapshot")


def all_status_enums() -> list[type[StatusEnum]]:
    import importlib

    for name in STATUS_MODULES:
        importlib.import_module(name)
    return status_enums()


def test_every_command_document_has_a_status_enum_found():
    """Each row's result type has a status (a field or a property) typed as one of the StatusEnums listed."""
    from gpuslate.cli.commands import documents, load

    names = {e.__name__ for e in all_status_enums()}
    for name, doc in documents().items():
        cls = load(doc.result)
        status = getattr(cls, "status", None)
        hint = status.fget.__annotations__["return"] if isinstance(status, property) else next(
            c.__annotations__["status"] for c in cls.__mro__ if "status" in getattr(c, "__annotations__", {}))
        assert getattr(hint, "__forward_arg__", hint) in names, (name, hint)


def test_members_keep_their_string_values():
    """Values, lookup by value and JSON are what they were before members carried an outcome."""
    import json

    for enum in all_status_enums():
        for member in enum:
            assert enum(member.value) is member and member == member.value and isinstance(member.value, str)
            assert json.dumps(member) == json.dumps(member.value) and isinstance(member.outcome, Outcome)
    assert ClearStatus("clean") is ClearStatus.CLEAN and str(ClearStatus.CLEAN) == "ClearStatus.CLEAN"


def test_a_member_without_an_outcome_cannot_be_defined():
    with pytest.raises(TypeError):
        class Bad(StatusEnum):  # type: ignore[misc]
            ONE = "one"  # no outcome: a str has no second item
    with pytest.raises(TypeError, match="must be an Outcome"):
        class Worse(StatusEnum):
            ONE = "one", 0


def test_the_codes_are_those_documented():
    """Every member's code, as the per-enum tables had them (README.md, Exit codes)."""
    from gpuslate.bench.report import DemoStatus
    from gpuslate.units.batch import BatchStatus
    from gpuslate.units.restart import RestartStatus

    expected = {
        'AuditStatus': {'LISTED': 0},
        'BatchStatus': {'DONE': 0, 'FAILED': 7},
        'BenchStatus': {'COMPLETE': 0, 'FAILED': 6, 'INTERRUPTED': 130, 'PARTIAL': 7},
        'ConfigStatus': {'VALID': 0},
        'ClearStatus': {'CLEAN': 0, 'DRY_RUN': 0, 'HELD_BY_OTHERS': 4, 'LEAKED': 4, 'NOTHING_SELECTED': 4,
                        'PERMISSION_DENIED': 5, 'REFUSED': 4, 'TIMEOUT': 4},
        'DemoStatus': {'CLEAN': 0, 'NOT_CLEAN': 4},
        'DownStatus': {'NOT_RULED_OUT': 4, 'PERMISSION_DENIED': 5, 'STOPPED': 0, 'TIMEOUT': 4},
        'ExperimentStatus': {'COMPLETE': 0, 'FAILED': 6, 'PARTIAL': 7, 'REPORTED': 0},
        'HookStatus': {'CLEAN': 0, 'DRAINED': 4, 'DRAIN_FAILED': 8, 'NOT_FREE': 4},
        'InstallStatus': {'INSTALLED': 0, 'WRITTEN': 0},
        'LogsStatus': {'SHOWN': 0},
        'PsStatus': {'LISTED': 0},
        'RestartStatus': {'DOWN_FAILED': 4, 'RESTARTED': 0, 'UP_FAILED': 6},
        'RmStatus': {'REMOVED': 0},
        'SimStatus': {'CREATED': 0, 'LEAKED': 0},
        'SwapStatus': {'DOWN_FAILED': 4, 'ROLLBACK_FAILED': 6, 'ROLLED_BACK': 6, 'SWAPPED': 0, 'UP_FAILED': 6,
                       'PARK_FAILED': 4, 'RESUME_FAILED': 6},
        'ParkStatus': {'PARKED': 0, 'ALREADY_PARKED': 0, 'REFUSED': 4, 'NOT_FREED': 4, 'FAILED': 6, 'DIED': 6,
                       'BROKEN': 6},
        'ResumeStatus': {'RESUMED': 0, 'NOT_PARKED': 0, 'NO_ROOM': 4, 'NOT_BACK': 4, 'NOT_READY': 4, 'FAILED': 6,
                         'WRONG_ANSWER': 6, 'DIED': 6},
        'UpStatus': {'EXITED': 6, 'READY': 0, 'SMOKE_FAILED': 6, 'TIMEOUT': 4},
        'WaitStatus': {'FREE': 0, 'LEAKED': 4, 'NOT_FREE': 4},
        'SnapshotStatus': {'SHOWN': 0},
    }
    codes = {e.__name__: {m.name: int(exit_status_for_result(m)) for m in e} for e in all_status_enums()}
    assert codes == expected
    assert {SwapStatus, RestartStatus, BatchStatus} == {e for e in all_status_enums() if issubclass(e, PartedStatus)}
    # a PartedStatus is the status of a result that names its deciding parts (exits.exit_status_of asks it)
    from gpuslate.units.batch import BatchResult
    from gpuslate.units.restart import RestartResult
    from gpuslate.units.swap import SwapResult

    for result in (SwapResult, RestartResult, BatchResult):
        assert issubclass(result, Parted), result
    assert DemoStatus.NOT_CLEAN.outcome is Outcome.NOT_DONE


class _Result:
    def __init__(self, status) -> None:
        self.status = status


class _Parted(Parted):
    __slots__ = ("parts", "status")

    def __init__(self, status, parts) -> None:
        self.status, self.parts = status, parts

    def deciding_parts(self):
        return self.parts


def test_a_failed_parted_result_takes_its_deciding_parts_codes() -> None:
    # swap: the failed part's own code (5 for a denied stop, 4 for a start that timed out), not the status's
    assert exit_status_of(_Parted(SwapStatus.DOWN_FAILED, [_Result(DownStatus.PERMISSION_DENIED)])) == 5
    assert exit_status_of(_Parted(SwapStatus.UP_FAILED, [_Result(UpStatus.TIMEOUT)])) == 4
    assert exit_status_of(_Parted(RestartStatus.UP_FAILED, [])) == 6  # no part named: the status's own
    # a batch as a fleet: one of two failed is partial (7); the only one that ran, its own code
    assert exit_status_of(_Parted(BatchStatus.FAILED, [_Result(UpStatus.READY), _Result(UpStatus.EXITED)])) == 7
    assert exit_status_of(_Parted(BatchStatus.FAILED, [_Result(UpStatus.TIMEOUT)])) == 4
    assert exit_status_of(_Parted(SwapStatus.SWAPPED, [_Result(UpStatus.EXITED)])) == 0  # done: parts not asked
    with pytest.raises(AssertionError, match="without parts"):
        exit_status_of(_Result(SwapStatus.UP_FAILED))
