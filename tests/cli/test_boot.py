"""The console script's early start of the driver: decided from raw arguments, never wrongly eager."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.cli import EARLY_COMMANDS, early_command
from gpuslate.cli import fleet as fleet_cli
from gpuslate.cli.main import _chosen_command


@pytest.mark.parametrize("argv, expected", [
    (["status"], "status"), (["status", "--json"], "status"), (["--json", "clear", "--pid", "7"], "clear"),
    (["wait", "--gpus", "0"], "wait"), (["up"], None), (["sim", "status"], None), ([], None),
    (["status", "--help"], None), (["-h", "status"], None), (["--sim", "/x", "status"], None),
    (["--sim=/x", "clear"], None), (["-H", "a", "status"], None), (["-Ha", "status"], None),
    (["status", "--host", "a"], None), (["status", "--hosts=h.ini"], None), (["clear", "--group", "g"], None),
    (["--version"], None), (["status", "--", "-h"], "status"),
])
def test_early_command(argv, expected, monkeypatch):
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    assert early_command(argv) == expected


def test_simulated_host_from_the_environment(monkeypatch):
    monkeypatch.setenv("GPUSLATE_SIM", "/tmp/x")
    assert early_command(["status"]) is None


WORDS = ["status", "clear", "wait", "up", "sim", "--json", "-h", "--help", "--sim", "/x", "-H", "host",
         "--host", "--hosts", "--group", "--gpus", "0", "--pid", "7", "--", "--parallel", "4", "-v"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=6))
def test_early_only_when_the_cli_runs_that_command_locally(argv):
    """Whenever the driver is started early, the CLI runs that very command on this
    host: not another command, not for other hosts, not a simulated host, not help."""
    cmd = early_command(argv)
    if cmd is None:
        return
    assert cmd in EARLY_COMMANDS
    try:
        fleet, rest = fleet_cli.split_fleet_options(list(argv))
    except Exception:  # the CLI rejects it: an early start cost time only
        return
    assert fleet is None
    assert _chosen_command(rest) == cmd
    options = rest[:rest.index("--")] if "--" in rest else rest  # after "--", "-h" is no option
    assert not {"-h", "--help", "--sim"} & set(options)
