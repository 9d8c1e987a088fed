"""up / ps / logs / down of the simulated server on a simulated host, through the CLI:
ready, crashed during startup, start timeout, and orphaned workers."""

from __future__ import annotations

import json
import os
import re
import signal

from gpuslate.clearing.wait import is_free
from gpuslate.gpu.simhost import SimBackend
from gpuslate.proc.procfs import read_stat
from gpuslate.units.readiness import http
from helpers import GiB, is_gone, unit_records, wait_for
from unitkit import free_port, popen_units, serve_cmd


def gpus_clean(host, gpus=range(8)) -> bool:
    return all(is_free(r, 0) for r in SimBackend(host.root).read(list(gpus), full=False))


def ps(units) -> dict:
    r = units("ps", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.ps.v1"
    return {u["name"]: u for u in doc["units"]}


def test_up_ps_logs_down_eight_workers(units_host, units):
    port = free_port()
    r = units("up", "srv", "--gpus", "0-7", "--port", str(port), "--engine", "sglang", "--json", "--",
              *serve_cmd(port, memory="6GiB"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpuslate.up.v1" and doc["ok"] and doc["status"] == "ready"
    assert doc["gpus"] == list(range(8)) and doc["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert doc["time_to_ready_s"] > 0 and doc["readiness"]["kind"] == "sglang"
    pid = doc["pid"]
    # the unit outlived the `up` process that started it, in a session of its own
    st = read_stat(pid)
    assert st is not None and st.sid == pid and st.pgid == pid
    info = json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])
    assert info["status"] == "ready" and len(info["worker_pids"]) == 8

    unit = ps(units)["srv"]
    assert unit["state"] == "ready" and unit["pid"] == pid and unit["port"] == port
    assert unit["gpu_memory"] == 8 * 6 * GiB and set(info["worker_pids"]) <= set(unit["processes"])
    assert unit["time_to_ready_s"] == doc["time_to_ready_s"] and unit["uptime_s"] > 0
    table = units("ps")
    assert "srv" in table.stdout and "ready" in table.stdout and "48.0 GiB" in table.stdout

    logs = units("logs", "srv", "--tail", "1")
    assert logs.returncode == 0 and logs.stdout.strip().endswith("The server is fired up and ready to roll!")
    assert "starting simulated server" in units("logs", "srv").stdout

    follower = popen_units("logs", "srv", "--follow")
    r = units("down", "srv", "--json")
    assert r.returncode == 0, r.stderr
    down = json.loads(r.stdout)
    assert down["schema"] == "gpuslate.down.v1" and down["ok"] and down["memory_released"]
    assert down["previous_state"] == "ready" and down["timings"]["stop_s"] >= 0
    stopped = {p["pid"] for p in down["processes"] + down["swept"]}
    assert {pid, *info["worker_pids"]} <= stopped
    assert all(is_gone(p) for p in (pid, *info["worker_pids"])) and gpus_clean(units_host)
    assert ps(units)["srv"]["state"] == "stopped"
    out, _ = follower.communicate(timeout=10)  # --follow ends once the unit is gone
    assert follower.returncode == 0 and "ready to roll" in out and "received SIGTERM, stopping" in out


def test_crash_during_startup(units_host, units):
    port = free_port()
    r = units("up", "bad", "--gpus", "0-3", "--port", str(port), "--engine", "sglang", "--",
              *serve_cmd(port, "--fail-startup", startup=0.5))
    assert r.returncode == 6, r.stderr
    assert "OutOfMemoryError" in r.stderr and "exited before it was ready (exit code 1)" in r.stderr
    assert "GPUs verified clean" in r.stderr
    rec = unit_records().load("bad")
    assert rec is not None and rec.phase == "failed" and rec.exit_code == 1
    assert is_gone(rec.pid) and gpus_clean(units_host)
    assert not units_host.held()
    unit = ps(units)["bad"]
    assert unit["state"] == "failed" and unit["processes"] == [] and "exit code 1" in unit["failure"]


def test_start_timeout_leaves_nothing(units_host, units):
    port = free_port()
    r = units("up", "slow", "--gpus", "0,1", "--port", str(port), "--engine", "vllm", "--start-timeout", "0.8",
              "--json", "--", *serve_cmd(port, startup=60))
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout)
    # the failure says what the probe saw last (a 503 while it loads; on a loaded machine, the server
    # may not have answered in the time that was left)
    assert doc["status"] == "timeout" and not doc["ok"]
    assert re.fullmatch(r"not ready after [\d.]+ s \(vllm: http://127\.0\.0\.1:\d+/health: .+\)", doc["failure"]), \
        doc["failure"]
    assert doc["teardown"]["memory_released"] and doc["log_tail"]
    assert is_gone(doc["pid"]) and gpus_clean(units_host) and not units_host.held()


def test_launcher_killed_orphans_then_down_cleans(units_host, units):
    port = free_port()
    r = units("up", "orph", "--gpus", "0-7", "--port", str(port), "--json", "--", *serve_cmd(port))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    workers = json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])["worker_pids"]
    os.kill(doc["pid"], signal.SIGKILL)  # the launcher dies; its workers keep their GPU memory
    wait_for(lambda: is_gone(doc["pid"]))
    unit = ps(units)["orph"]
    assert unit["state"] == "orphaned" and unit["gpu_memory"] == 8 * 4 * GiB
    assert set(unit["processes"]) == set(workers)
    assert "orphaned" in units("ps").stdout
    r = units("down", "orph", "--json")
    assert r.returncode == 0, r.stderr
    down = json.loads(r.stdout)
    assert down["previous_state"] == "orphaned" and down["memory_released"]
    assert all(is_gone(w) for w in workers) and gpus_clean(units_host)
    assert ps(units)["orph"]["state"] == "stopped"


def test_down_says_a_leak_on_its_gpus_at_once(units_host, units):
    """Memory held by no process on the unit's GPU after it stopped: `down` says so within 2 s of
    the stop (exit 4, the remedy), not after its stop timeout."""
    hold = ["python3", "-m", "gpuslate", "sim", "hold", "--gpus", "0", "--memory", "1GiB"]
    r = units("up", "holder", "--gpus", "2", "--ready-log", '"ready": true', "--json", "--", *hold)
    assert r.returncode == 0, r.stderr
    units_host.leak(2, GiB)
    r = units("down", "holder", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 4 and not doc["memory_released"], doc
    assert doc["timings"]["verify_s"] < 2.0
    assert "held by no process (a leak" in r.stderr and "remedy: on a simulated host" in r.stderr
