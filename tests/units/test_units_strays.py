"""Renamed escapees of a unit without a cgroup (issue 24): workers that double-fork, call
``setsid`` and rename themselves, holding a GPU the unit was not given or only its port.

* Renamed as SGLang and vLLM do (py-setproctitle), or by ``prctl(PR_SET_NAME)``, ``/proc/self/comm``
  or ``exec -a``, they keep the unit's marker (``up`` sets ``SPT_NOENV=1``): ``down`` finds and ends
  them, verifies what they held, and the next ``up`` binds the port.
* Where the environment is lost anyway (a title written over it, a process wiping it, ``env -i``),
  ``down`` and ``ps`` never say "released" or "stopped": they name what holds GPU memory or the port
  and say it is not ruled out; ``up`` names the unit that left the port busy; ``down --clear`` ends
  them; a program started after the unit stopped is nobody's stray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import escapees
from gpuslate.proc.procfs import read_stat
from helpers import GiB, is_gone, unit_records, wait_for
from test_units_lifecycle import gpus_clean, ps
from unitkit import free_port


@pytest.fixture
def out(tmp_path: Path):
    """The escapees' ready files; whatever of them is left is SIGKILLed at the end (a port holder
    holds no simulated memory, so the units' teardown would not find it)."""
    d = tmp_path / "escapees"
    d.mkdir()
    yield d
    for pid in escapees.ready_pids(d).values():
        st = read_stat(pid)
        if st is not None and not st.has_exited:
            os.kill(pid, signal.SIGKILL)


def _up(units, units_host, out: Path, port: int, *specs, gpus: str = "0"):
    r = units("up", "web", "--gpus", gpus, "--port", str(port), "--ready-log", "serving", "--containment", "session",
              "--json", "--", *escapees.command(out, units_host.root, *specs))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), escapees.ready_pids(out)


def _environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def test_renamed_escapees_keep_the_marker_and_down_ends_them(units_host, units, out):
    """The issue's two cases, fixed: an escapee renamed with setproctitle holding a GPU outside
    the unit's --gpus, and one holding only the unit's port; and the other renaming mechanisms."""
    port = free_port()
    doc, pids = _up(units, units_host, out, port, ("spt", "setproctitle", 1, None),
                    ("porter", "setproctitle", None, port), ("prctl", "prctl", 2, None), ("comm", "comm", 3, None),
                    ("argv0", "exec-a", 4, None))
    assert doc["env"]["SPT_NOENV"] == "1"
    assert open(f"/proc/{pids['spt']}/comm").read().strip() == "sglang::schedul"
    for pid in pids.values():  # renamed, in a session and group of their own, and still marked
        st = read_stat(pid)
        assert st.sid not in (doc["sid"], pid) and st.pgid == st.sid and st.ppid != doc["pid"]
        assert b"GPUSLATE_UNIT_ID=" + doc["instance"].encode() in _environ(pid)
    unit = ps(units)["web"]
    assert set(pids.values()) <= set(unit["processes"]) and unit["strays"] == []

    r = units("down", "web", "--json", "--timeout", "20")
    assert r.returncode == 0, r.stderr
    down = json.loads(r.stdout)
    assert down["verification"] == "released" and down["memory_released"] and down["strays"] == []
    assert down["verified_gpus"] == [0, 1, 2, 3, 4]  # what they held, read before they were signaled
    assert all(is_gone(pid) for pid in pids.values()) and gpus_clean(units_host)
    assert ps(units)["web"]["state"] == "stopped"
    # the port is free again: the next up binds it
    r = units("up", "web", "--gpus", "0", "--port", str(port), "--containment", "session", "--",
              sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port))
    assert r.returncode == 0, r.stderr
    assert units("down", "web").returncode == 0


def test_escapees_whose_environment_is_gone_are_named_never_released(units_host, units, out):
    """Environment written over (setproctitle without SPT_NOENV), wiped by the process, or empty
    (env -i): not found in the unit, so down says what they hold and that they are not ruled out
    (exit 4, never "released"), ps says orphaned, up names the unit that left its port busy, and
    down --clear ends them all."""
    port = free_port()
    _, pids = _up(units, units_host, out, port, ("clobber", "setproctitle-clobber", 1, None),
                  ("wipe", "wipe", 2, None), ("empty", "env-i", None, port))
    for pid in pids.values():  # the markers are gone: written over (in part: clobber), or never there
        assert b"GPUSLATE_UNIT" not in _environ(pid)

    r = units("down", "web", "--json", "--timeout", "20")
    assert r.returncode == 4, r.stderr
    down = json.loads(r.stdout)
    assert down["verification"] == "not_ruled_out" and down["memory_released"] is False and not down["ok"]
    by = {s["pid"]: s for s in down["strays"]}
    assert set(by) == set(pids.values())
    assert by[pids["clobber"]]["reason"] == "other_gpu" and by[pids["clobber"]]["gpus"] == [1]
    assert by[pids["wipe"]]["reason"] == "other_gpu" and by[pids["wipe"]]["used_memory"] == GiB
    assert by[pids["empty"]]["reason"] == "unit_port" and by[pids["empty"]]["port"] == port
    assert {1, 2} <= set(down["verified_gpus"])  # the GPUs they hold are verified too: not free
    assert down["timings"]["total_s"] < 10  # said at once, not after polling to the timeout
    text = units("down", "web")
    assert text.returncode == 4 and "released" not in text.stdout and "NOT verified" in text.stdout
    assert f"pid {pids['empty']} (" in text.stdout and f"listens on the unit's port {port}" in text.stdout
    assert "--clear" in text.stderr and not any(is_gone(p) for p in pids.values())

    unit = ps(units)["web"]
    assert unit["state"] == "orphaned" and {s["pid"] for s in unit["strays"]} == set(pids.values())
    assert unit["gpu_memory"] == 2 * GiB
    r = units("up", "web", "--gpus", "0", "--port", str(port), "--containment", "session", "--",
              sys.executable, "-c", "import time; time.sleep(60)")
    assert r.returncode == 4, r.stderr
    assert f"port {port} is already in use" in r.stderr and "left by unit web" in r.stderr
    assert "gpuslate down web --clear" in r.stderr

    r = units("down", "web", "--clear", "--json", "--timeout", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    down = json.loads(r.stdout)
    assert down["ok"] and down["verification"] == "released" and down["cleared"]["ok"]
    wait_for(lambda: all(is_gone(p) for p in pids.values()), timeout=10)
    assert gpus_clean(units_host) and ps(units)["web"]["state"] == "stopped"
    assert unit_records().load("web").phase == "stopped"


def test_a_program_started_after_the_unit_stopped_is_nobodys_stray(units_host, units, hold, out):
    port = free_port()
    _up(units, units_host, out, port, gpus="2")
    assert units("down", "web").returncode == 0
    later = hold("--gpus", "2", "--memory", "1GiB")  # started after the stop, on the unit's GPU
    unit = ps(units)["web"]
    assert unit["state"] == "stopped" and unit["strays"] == [] and later.pid not in unit["processes"], unit


def test_a_renamed_program_started_by_hand_in_a_shell_is_not_a_stray(units_host, units, out):
    """A server the caller started by hand while the unit ran (a vLLM in a shell: its engine core
    renamed itself without SPT_NOENV, on another GPU) has an environment that is written over, but
    its session's leader, the shell, is the caller's with an intact environment and no marker of
    the unit: it is ruled out, and down says released."""
    _up(units, units_host, out, free_port())
    hold = (f"{sys.executable} -m gpuslate --sim {units_host.root} sim hold --gpus 5 --memory 1GiB "
            "--title VLLM::EngineCore")
    env = {k: v for k, v in os.environ.items() if k not in ("SPT_NOENV", "GPUSLATE_SIM")}
    shell = subprocess.Popen(["sh", "-c", f"{hold} & wait"], stdout=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        pid = json.loads(shell.stdout.readline())["pid"]
        assert read_stat(pid).sid == shell.pid and b"GPUSLATE_UNIT" not in _environ(pid)
        r = units("down", "web", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["strays"] == [] and not is_gone(pid)
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
