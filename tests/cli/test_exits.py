"""The exit-code table is keyed by the results' status enums: every member of every one has a code,
and two enums sharing a value ("timeout", "permission_denied") are looked up as themselves."""

from __future__ import annotations

import pytest

from gpuslate.bench.report import DemoStatus, ExperimentStatus
from gpuslate.bench.result import BenchStatus
from gpuslate.cli.exits import ExitStatus, exit_status_for_result, result_status_enums
from gpuslate.gpu.sim.results import SimStatus
from gpuslate.remote.zipapp import InstallStatus
from gpuslate.slate.clear import ClearStatus
from gpuslate.slurm.hooks import HookStatus
from gpuslate.units.lifecycle import DownStatus, UpStatus
from gpuslate.units.swap import SwapStatus


def test_every_status_of_every_result_has_an_exit_code():
    enums = result_status_enums()
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
