"""swap baseline -> speculative with phase timings; --rollback to a failing unit brings the old one back.
Units come from a gpuslate.toml, so `up NAME` and `swap OLD NEW` need no other arguments."""

from __future__ import annotations

import json

from gpuslate.units.readiness import http
from helpers import is_gone, unit_records
from unitkit import free_port, serve_cmd


def write_toml(path, port: int) -> None:
    def unit(name: str, *extra: str) -> str:
        cmd = json.dumps(serve_cmd(port, *extra, startup=0.3))
        return (f"[units.{name}]\ncommand = {cmd}\ngpus = \"0-7\"\nport = {port}\nengine = \"sglang\"\n"
                "start_timeout = 30\ngrace = 5\n\n")

    path.write_text(unit("baseline") + unit("speculative", "--mode", "speculative",
                                              "--spec-disable-threshold", "1")
                    + unit("broken", "--fail-startup"))


def server_info(port: int) -> dict:
    return json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])


def test_swap_baseline_to_speculative(units_host, units, tmp_path):
    port = free_port()
    write_toml(tmp_path / "gpuslate.toml", port)
    r = units("up", "baseline", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    old = server_info(port)
    assert old["mode"] == "baseline"
    r = units("swap", "baseline", "speculative", "--json", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.swap.v1" and doc["ok"] and doc["status"] == "swapped"
    phases = doc["phases"]
    for key in ("lock_wait_s", "stop_old_s", "verify_clean_s", "preflight_new_s", "launch_new_s", "ready_new_s"):
        assert phases[key] >= 0, key
    assert doc["total_s"] >= phases["stop_old_s"] + phases["ready_new_s"]
    for key in ("stop_old_s", "verify_clean_s"):  # one phase, one figure: in the phases and in the downtime
        assert doc["downtime"][key] == phases[key], key
    assert 0 <= doc["overhead_s"] < doc["total_s"]
    assert doc["down"]["memory_released"] and doc["up"]["status"] == "ready"
    new = server_info(port)
    assert new["mode"] == "speculative" and new["pid"] != old["pid"]
    assert all(is_gone(p) for p in (old["pid"], *old["worker_pids"]))
    assert unit_records().load("baseline").phase == "stopped" and unit_records().load("speculative").phase == "ready"
    table = units("swap", "speculative", "baseline", cwd=str(tmp_path))  # and back, human output
    assert table.returncode == 0, table.stderr
    assert "gpuslate overhead" in table.stdout and "baseline ready" in table.stdout


def test_swap_rollback_to_failing_unit(units_host, units, tmp_path):
    port = free_port()
    write_toml(tmp_path / "gpuslate.toml", port)
    r = units("up", "baseline", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    first = server_info(port)
    r = units("swap", "baseline", "broken", "--rollback", "--json", cwd=str(tmp_path))
    assert r.returncode == 6, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "rolled_back" and not doc["ok"]
    assert doc["up"]["status"] == "exited" and doc["up"]["teardown"]["memory_released"]
    assert doc["rollback"]["ok"] and doc["phases"]["rollback_s"] > 0
    assert "OutOfMemoryError" in r.stderr and "rolled back" in r.stderr
    again = server_info(port)
    assert again["status"] == "ready" and again["mode"] == "baseline" and again["pid"] != first["pid"]
    assert unit_records().load("baseline").phase == "ready" and unit_records().load("broken").phase == "failed"


def test_swap_without_rollback_leaves_gpus_clean(units_host, units, tmp_path):
    port = free_port()
    write_toml(tmp_path / "gpuslate.toml", port)
    assert units("up", "baseline", cwd=str(tmp_path)).returncode == 0
    r = units("swap", "baseline", "broken", cwd=str(tmp_path))
    assert r.returncode == 6
    assert not units_host.held()
    assert units("swap", "baseline", "nosuch", cwd=str(tmp_path)).returncode == 2  # nothing signaled
