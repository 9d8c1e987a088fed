"""A library caller's ``Host.open(sim=DIR)`` starts units on that simulated host, as ``--sim DIR`` does.

Without it, a server started by ``host.up(spec)`` from a process whose environment names no simulated
host (``GPUSLATE_SIM`` unset) held its memory nowhere: ``status`` showed the unit's GPUs free.
"""

from __future__ import annotations

import sys

from gpuslate import Host, UnitSpec
from gpuslate.units.launch import unit_env
from gpuslate.units.lifecycle import UpStatus
from helpers import GiB
from unitkit import free_port


def test_a_library_host_starts_units_on_its_simulated_host(units_host, monkeypatch):
    monkeypatch.delenv("GPUSLATE_SIM")
    port = free_port()
    spec = UnitSpec("lib", command=[sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                                    "--startup-seconds", "0.1", "--memory", "2GiB"], gpus=[1], port=port)
    with Host.open(str(units_host.root)) as host:
        up = host.up(spec)
        try:
            assert up.status is UpStatus.READY, up.to_json()
            gpu = host.status([1]).gpus[0]
            assert gpu.reading.memory.used == 2 * GiB and up.record.pid in {p.root_pid for p in gpu.processes}
        finally:
            assert host.down("lib").ok
        assert host.status([1]).gpus[0].reading.memory.used == 0


def test_the_variable_is_added_only_where_the_environment_names_another_host(tmp_path, monkeypatch):
    spec = UnitSpec("u", command=["serve"])
    monkeypatch.setenv("GPUSLATE_SIM", str(tmp_path / "." / "sim"))
    assert "GPUSLATE_SIM" not in unit_env(spec, "i", "s", str(tmp_path / "sim"))  # the same folder
    assert unit_env(spec, "i", "s", str(tmp_path / "other"))["GPUSLATE_SIM"] == str(tmp_path / "other")
    assert "GPUSLATE_SIM" not in unit_env(spec, "i", "s", None)  # a real host: nothing added
    spec = UnitSpec("u", command=["serve"], env={"GPUSLATE_SIM": "/elsewhere"})
    assert unit_env(spec, "i", "s", str(tmp_path / "other"))["GPUSLATE_SIM"] == str(tmp_path / "other")
