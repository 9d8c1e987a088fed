"""The units' state folder is the host context's: one ``Host``, one state folder for every verb,
found without opening the backend, kept for the Host's life whatever the environment says later."""

from __future__ import annotations

from gpuslate import Host
from gpuslate.units import UnitSpec, UnitStore
from helpers import count_host_opens
from unitkit import free_port, serve_cmd


def test_the_state_folder_is_found_without_the_backend(units_host, monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSLATE_STATE_DIR")
    counts = count_host_opens(monkeypatch)
    with Host.open(str(units_host.root)) as host:
        assert UnitStore.of(host).units_dir() == units_host.root / "state" / "units"
        assert host.state_dir() == units_host.root / "state"
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "mine"))
    with Host.open() as host:  # the environment's, when it names one
        assert UnitStore.of(host).units_dir() == tmp_path / "mine" / "units"
    assert counts["backend"] == 0, counts  # `logs` reads a unit's log on a host without GPUs


def test_one_host_keeps_its_state_folder_for_every_verb(units_host, monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSLATE_STATE_DIR")
    port = free_port()
    spec = UnitSpec("web", command=serve_cmd(port, startup=0.1), gpus=[0], port=port)
    with Host.open() as host:
        assert host.up(spec).ok
        # the environment changes meanwhile: this Host's verbs still see the folder it started with
        monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "elsewhere"))
        assert host.ps().get("web").state == "ready"
        with Host.open() as other:  # a new Host follows the environment: no unit there
            assert other.ps().units == []
        assert host.down("web").ok
    record = UnitStore(units_host.root / "state").load("web")
    assert record is not None and record.phase == "stopped"
    assert UnitStore(tmp_path / "elsewhere").names() == []
