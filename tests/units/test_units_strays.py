"""A unit without a cgroup whose child forks late, leaves the session and renames itself
(setproctitle overwrites the GPUSLATE_UNIT marker) is not found in the unit, yet `ps` never calls
the unit `stopped` while that process holds its GPUs: `orphaned`, naming it; `down` says so
(exit 4) and `down --clear` ends it with `clear`'s rules."""

from __future__ import annotations

import json
import sys

from helpers import GiB, is_gone, unit_records, wait_for
from test_units_lifecycle import gpus_clean, ps

LATE_FORK = (
    "import os, sys, time\n"
    "print('serving', flush=True)\n"
    "time.sleep(0.3)\n"  # late: after the unit was found ready and its members recorded
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execv(sys.executable, [sys.executable, '-m', 'gpuslate', 'sim', 'hold', '--gpus', '1',\n"
    "                                  '--memory', '3GiB', '--title', 'escaped-helper'])\n"
    "    os._exit(0)\n"
    "time.sleep(600)\n"
)


def test_late_renamed_escapee_is_named_and_cleared(units_host, units):
    r = units("up", "web", "--gpus", "0-1", "--ready-log", "serving", "--containment", "session", "--json", "--",
              sys.executable, "-c", LATE_FORK)
    assert r.returncode == 0, r.stderr
    main = json.loads(r.stdout)["pid"]

    def escapee():
        return next((h.record.pid for h in units_host.held() if h.alive and h.record.gpu == 1), None)

    pid = wait_for(escapee, timeout=20)
    wait_for(lambda: open(f"/proc/{pid}/comm").read().strip() == "escaped-helper")
    assert b"GPUSLATE_UNIT=web" not in open(f"/proc/{pid}/environ", "rb").read()  # the marker is gone

    r = units("down", "web", "--json", "--timeout", "20")
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout)
    assert [s["pid"] for s in doc["strays"]] == [pid] and not doc["memory_released"]
    assert "--clear" in r.stderr and str(pid) in r.stderr
    assert is_gone(main) and not is_gone(pid)  # the unit's own processes stopped; the stray left alone
    assert doc["timings"]["total_s"] < 10  # said at once, not after polling to the timeout

    unit = ps(units)["web"]
    assert unit["state"] == "orphaned" and [s["pid"] for s in unit["strays"]] == [pid]
    assert unit["strays"][0]["name"] == "escaped-helper" and unit["gpu_memory"] == 3 * GiB
    table = units("ps")
    assert "orphaned" in table.stdout and f"pid {pid} (escaped-helper)" in table.stdout

    r = units("down", "web", "--clear", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cleared"]["ok"] and pid in [t["pid"] for t in doc["cleared"]["targets"]]
    assert doc["memory_released"] and is_gone(pid) and gpus_clean(units_host, [0, 1])
    assert ps(units)["web"]["state"] == "stopped" and unit_records().load("web").phase == "stopped"


def test_a_later_job_on_the_same_gpus_is_not_the_stopped_units(units_host, units, hold):
    r = units("up", "web", "--gpus", "2", "--ready-log", "serving", "--containment", "session", "--",
              sys.executable, "-c", "print('serving', flush=True); import time; time.sleep(600)")
    assert r.returncode == 0, r.stderr
    assert units("down", "web").returncode == 0
    h = hold("--gpus", "2", "--memory", "1GiB")  # started after the unit was stopped: someone else's
    unit = ps(units)["web"]
    assert unit["state"] == "stopped" and unit["strays"] == [] and h.pid not in unit["processes"], unit
