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
from helpers import GiB, is_gone, run_cli, unit_records, wait_for
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


def test_escapees_whose_environment_is_gone_are_named_never_signaled(units_host, units, out, tmp_path):
    """Environment written over (setproctitle without SPT_NOENV), wiped by the process, or empty
    (env -i), before any scan could record them: nothing ties them to the unit, so nothing signals
    them, `down --clear` included (issue 32: it did, on circumstantial evidence). The one on the
    unit's port keeps down NOT verified (exit 4) with the command that ends it, ps says orphaned and
    up names the unit that left the port busy; those on other GPUs are warnings, and once the port is
    free down says released."""
    port = free_port()
    _, pids = _up(units, units_host, out, port, ("clobber", "setproctitle-clobber", 1, None),
                  ("wipe", "wipe", 2, None), ("empty", "env-i", None, port))
    for pid in pids.values():  # the markers are gone: written over (in part: clobber), or never there
        assert b"GPUSLATE_UNIT" not in _environ(pid)

    for extra in ((), ("--clear",)):
        r = units("down", "web", "--json", "--timeout", "20", *extra)
        assert r.returncode == 4, r.stderr
        down = json.loads(r.stdout)
        assert down["verification"] == "not_ruled_out" and down["memory_released"] is False and not down["ok"]
        assert down["cleared"] is None
        by = {s["pid"]: s for s in down["strays"]}
        assert set(by) == set(pids.values())
        assert by[pids["clobber"]]["reason"] == "other_gpu" and by[pids["clobber"]]["gpus"] == [1]
        assert by[pids["wipe"]]["reason"] == "other_gpu" and by[pids["wipe"]]["used_memory"] == GiB
        assert by[pids["empty"]]["reason"] == "unit_port" and by[pids["empty"]]["port"] == port
        assert down["verified_gpus"] == [0]  # what the unit held; the other GPUs are not its own
        assert [w for w in down["warnings"] if f"pid {pids['clobber']} (" in w and
                f"'gpuslate clear --pid {pids['clobber']}' ends it" in w]
        assert down["timings"]["total_s"] < 10  # said at once, not after polling to the timeout
        assert not any(is_gone(p) for p in pids.values())
    assert not audited(units_host, pids.values())  # never signaled, --clear or not
    text = units("down", "web")
    assert text.returncode == 4 and "NOT verified" in text.stdout and "released" not in text.stdout.split(";")[0]
    assert f"pid {pids['empty']} (" in text.stdout and f"listens on the unit's port {port}" in text.stdout
    assert f"'kill {pids['empty']}' ends it" in text.stdout + text.stderr

    unit = ps(units)["web"]
    assert unit["state"] == "orphaned" and {s["pid"] for s in unit["strays"]} == set(pids.values())
    r = units("up", "web", "--gpus", "0", "--port", str(port), "--containment", "session", "--",
              sys.executable, "-c", "import time; time.sleep(60)")
    assert r.returncode == 4, r.stderr
    assert f"port {port} is already in use" in r.stderr and "left by unit web" in r.stderr
    assert f"'kill {pids['empty']}' ends it" in r.stderr

    os.kill(pids["empty"], signal.SIGTERM)  # what the port's stray was named with
    wait_for(lambda: is_gone(pids["empty"]))
    r = units("down", "web", "--json", "--timeout", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    down = json.loads(r.stdout)
    assert down["ok"] and down["verification"] == "released" and len(down["warnings"]) == 2
    assert not is_gone(pids["clobber"]) and not is_gone(pids["wipe"])
    assert ps(units)["web"]["state"] == "stopped" and unit_records().load("web").phase == "stopped"


def audited(host, pids) -> list[dict]:
    """The audit log's entries (of this simulated host's state) that name one of ``pids``."""
    from gpuslate.host.audit import AuditLog

    log = host.root / "state" / "audit.jsonl"
    if not log.exists():
        return []
    return [e for e in AuditLog(log, backend="sim").read() if e.get("target", {}).get("pid") in set(pids)]


def test_a_worker_recorded_by_a_scan_stays_the_units_after_setsid_and_a_rename(units_host, units, out):
    """Issue 32: what a scan found in the unit (ps, down, readiness) is recorded by identity, so a
    worker that later calls setsid and wipes its environment (no marker, no session, no parent of the
    unit's left) is still proven the unit's: down ends it and says released; no stray. The worker
    starts after readiness: only ps's scan saw it."""
    port = free_port()
    doc, _ = _up(units, units_host, out, port, ("after", "wipe-late", 3, None))
    late = escapees.spawn_now(out, "after")
    assert late in ps(units)["web"]["processes"]  # found (its session, its marker), and recorded
    escapees.escape_now(out, "after")
    st = read_stat(late)
    assert st.sid == late and st.pgid == late and st.ppid != doc["pid"]  # its own session, no parent of the unit's
    assert b"GPUSLATE_UNIT" not in _environ(late)
    unit = ps(units)["web"]
    assert late in unit["processes"] and unit["strays"] == []
    r = units("down", "web", "--json", "--timeout", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    down = json.loads(r.stdout)
    assert down["verification"] == "released" and down["strays"] == [] and 3 in down["verified_gpus"]
    wait_for(lambda: is_gone(late))


def test_a_program_started_by_hand_on_the_units_gpu_is_named_never_signaled(units_host, units, out, hold):
    """Issue 32: a program the caller started by hand from a live shell while the unit ran, sharing
    the unit's GPU (no marker, its session led by that shell): `down --clear` SIGTERMed it. Now down is
    NOT verified (the next up would collide), names `gpuslate clear --pid N`, and signals nothing;
    that command ends it, and down then says released."""
    _up(units, units_host, out, free_port(), gpus="0")
    env = {k: v for k, v in os.environ.items() if k not in ("SPT_NOENV", "GPUSLATE_SIM")}
    hold_cmd = f"{sys.executable} -m gpuslate --sim {units_host.root} sim hold --gpus 0 --memory 1GiB"
    shell = subprocess.Popen(["sh", "-c", f"{hold_cmd} & wait"], stdout=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    try:
        pid = json.loads(shell.stdout.readline())["pid"]
        for extra in ((), ("--clear",)):
            r = units("down", "web", "--json", "--timeout", "10", *extra)
            assert r.returncode == 4, r.stdout + r.stderr
            down = json.loads(r.stdout)
            assert down["verification"] == "not_ruled_out" and [s["pid"] for s in down["strays"]] == [pid]
            assert down["strays"][0]["reason"] == "unit_gpu" and f"gpuslate clear --pid {pid}" in down["unverified"]
            assert not is_gone(pid)
        assert not audited(units_host, [pid])
        r = units("down", "web")
        assert r.returncode == 4 and f"'gpuslate clear --pid {pid}' ends it" in r.stderr, r.stderr
        r = run_cli("--sim", str(units_host.root), "clear", "--pid", str(pid), "--json", "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(lambda: is_gone(pid))
        assert units("down", "web").returncode == 0
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def test_a_program_with_a_dotted_variable_started_meanwhile_on_another_gpu_is_nobodys_stray(units_host, units,
                                                                                             out):
    """Issue 32: environ.intact took only C-identifier names, so a program started (setsid) during the
    unit's life with `app.config=1` in its environment counted as renamed: down exited 4 and
    down --clear SIGTERMed it. Its environment is intact and has no marker of the unit: ruled out."""
    _up(units, units_host, out, free_port())
    env = {"app.config": "1", **{k: v for k, v in os.environ.items() if k not in ("SPT_NOENV", "GPUSLATE_SIM")}}
    p = subprocess.Popen([sys.executable, "-m", "gpuslate", "--sim", str(units_host.root), "sim", "hold",
                          "--gpus", "6", "--memory", "1GiB"], stdout=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        pid = json.loads(p.stdout.readline())["pid"]
        assert b"\0app.config=1\0" in b"\0" + _environ(pid)
        r = units("down", "web", "--clear", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        down = json.loads(r.stdout)
        assert down["strays"] == [] and down["warnings"] == [] and not is_gone(pid)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_renamed_worker_of_another_running_unit_is_that_units_never_this_ones(units_host, units, out, tmp_path):
    """Issue 32: a worker of unit b whose environment was written over sat on a GPU of its own; `down
    web --clear` killed it while ps showed b ready. One that b's scans recorded (it renamed after b's
    readiness) is b's: web's down neither names nor signals it, and b's down ends it. One that renamed
    before any scan is proven nobody's: web's down names it as a warning, says released, and leaves it."""
    out_b = tmp_path / "escapees-b"
    out_b.mkdir()
    _up(units, units_host, out, free_port(), gpus="0")  # unit web
    r = units("up", "b", "--gpus", "1", "--port", str(free_port()), "--ready-log", "serving", "--containment",
              "session", "--json", "--", *escapees.command(out_b, units_host.root, ("w", "setproctitle-clobber-late",
                                                                                    4, None),
                                                         ("early", "setproctitle-clobber", 5, None)))
    assert r.returncode == 0, r.stderr
    worker, early = escapees.ready_pids(out_b)["w"], escapees.ready_pids(out_b)["early"]
    try:
        escapees.escape_now(out_b, "w")
        assert b"GPUSLATE_UNIT" not in _environ(worker) and b"GPUSLATE_UNIT" not in _environ(early)
        for extra in ((), ("--clear",)):
            r = units("down", "web", "--json", *extra)
            assert r.returncode == 0, r.stdout + r.stderr
            down = json.loads(r.stdout)
            assert [s["pid"] for s in down["strays"]] == [early] and down["strays"][0]["reason"] == "other_gpu"
            assert len(down["warnings"]) == 1 and f"'gpuslate clear --pid {early}' ends it" in down["warnings"][0]
            assert not is_gone(worker) and not is_gone(early)
        assert not audited(units_host, [worker, early])
        b = ps(units)["b"]
        assert b["state"] == "ready" and worker in b["processes"] and early not in b["processes"]
        r = units("down", "b", "--json", "--timeout", "20")
        assert r.returncode == 0, r.stdout + r.stderr
        wait_for(lambda: is_gone(worker))
        assert not is_gone(early)
    finally:
        for pid in (worker, early):
            if not is_gone(pid):
                os.kill(pid, signal.SIGKILL)


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
