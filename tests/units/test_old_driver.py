"""A driver without NVML's v2 memory API (before R510): its reserved memory is 'used'.

``gpuslate sim init --memory-api v1`` makes a simulated host report like such a
driver (645 MiB used on an idle GPU, as an H200 does). The default --max-used
must be right from the start, so that ``clear``, ``wait`` and ``up`` count an
idle GPU as free instead of timing out.
"""

from __future__ import annotations

import json

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, is_gone
from unitkit import free_port, serve_cmd

MiB = 1024**2


def v1_host(units_host: SimHost, units) -> SimHost:
    r = units("sim", "init", str(units_host.root), "--memory-api", "v1", "--memory", "96GiB", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["memory_api"] == "v1" and doc["reserved"] == 645 * MiB
    return SimHost(units_host.root)


def test_idle_gpu_reads_as_used_and_counts_as_free(units_host, units):
    v1_host(units_host, units)
    doc = json.loads(units("status", "--json").stdout)
    assert all(g["memory"]["used"] == 645 * MiB and g["memory"]["reserved"] == 0 for g in doc["gpus"])
    r = units("wait", "--free", "--timeout", "2", "--json")
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["max_used"] == GiB


def test_clear_and_wait_on_a_v1_driver(units_host, units, hold):
    v1_host(units_host, units)
    h = hold("--gpus", "0-1", "--memory", "5GiB", "--workers", "2")
    r = units("wait", "--free", "--gpus", "0", "--timeout", "0.2", "--json")
    assert r.returncode == 4
    r = units("clear", "--gpus", "0-1", "--yes", "--json", "--timeout", "10")
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert doc["status"] == "clean" and doc["max_used"] == GiB
    assert [g["used"] for g in doc["after"]] == [645 * MiB, 645 * MiB]
    assert all(is_gone(p) for p in h.pids)


def test_up_and_down_on_a_v1_driver(units_host, units):
    v1_host(units_host, units)
    port = free_port()
    r = units("up", "old", "--gpus", "0-1", "--port", str(port), "--engine", "sglang", "--json", "--",
              *serve_cmd(port, memory="2GiB"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "ready"
    r = units("down", "old", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory_released"]
