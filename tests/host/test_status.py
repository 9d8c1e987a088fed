"""`gpuslate status` on a simulated host held by real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import gpuslate
from gpuslate.gpu.nvml import nvml_library_present
from gpuslate.gpu.simhost import SimBackend
from gpuslate.host.snapshot import take_snapshot
from gpuslate.proc.procfs import read_stat
from helpers import GiB, gpuslate_env, is_gone, wait_for


def gpu(snap, index):
    return next(g for g in snap.gpus if g.index == index)


def test_memory_accounting_per_gpu_and_process(sim_host, hold):
    a = hold("--gpus", "0,1", "--memory", "40GiB")
    b = hold("--gpus", "1", "--memory", "10GiB")
    snap = gpuslate.status()
    assert [g.index for g in snap.gpus] == list(range(8))
    g0, g1, g2 = gpu(snap, 0), gpu(snap, 1), gpu(snap, 2)
    assert g0.memory.used == 40 * GiB and g1.memory.used == 50 * GiB and g2.memory.used == 0
    assert g1.memory.free == 96 * GiB - 50 * GiB
    by_pid = {p.pid: p for p in g1.processes}
    assert by_pid[a.pid].used_memory == 40 * GiB and by_pid[b.pid].used_memory == 10 * GiB
    assert by_pid[a.pid].kind == "compute" and by_pid[a.pid].visible
    assert by_pid[a.pid].user and by_pid[a.pid].start_ticks > 0
    assert not g2.processes and g2.reading.pstate == "P8"


def test_worker_tree_attributed_to_launcher(sim_host, hold):
    h = hold("--gpus", "0-7", "--memory", "8GiB", "--workers", "8")
    assert len(h.workers) == 8
    snap = gpuslate.status()
    seen = set()
    for g in snap.gpus:
        compute = [p for p in g.processes if p.kind == "compute"]
        assert len(compute) == 1, g
        p = compute[0]
        assert p.pid in h.workers and p.used_memory == 8 * GiB
        assert p.ppid == h.pid and p.root_pid == h.pid
        seen.add(p.pid)
    assert seen == set(h.workers)
    # the launcher holds nothing itself
    assert all(p.pid != h.pid for g in snap.gpus for p in g.processes)


def test_orphaned_workers_still_found_and_attributed(sim_host, hold):
    h = hold("--gpus", "0-3", "--memory", "4GiB", "--workers", "4", "--orphan-workers")
    snap = gpuslate.status([0, 1, 2, 3])
    procs = [p for g in snap.gpus for p in g.processes if p.kind == "compute"]
    assert {p.pid for p in procs} == set(h.workers)
    for p in procs:
        assert p.ppid != h.pid  # reparented away from the launcher
        assert p.pgid == h.pgid
        assert p.root_pid == h.pid  # still attributed through the process group


def test_handle_only_holders(sim_host, hold):
    mon = hold("--gpus", "0-7", "--memory", "0", "--title", "dcgm-exporter")
    srv = hold("--gpus", "0", "--memory", "20GiB")
    snap = gpuslate.status()
    g0 = gpu(snap, 0)
    kinds = {p.pid: p for p in g0.processes}
    assert kinds[mon.pid].kind == "handle" and kinds[mon.pid].used_memory is None
    assert kinds[srv.pid].kind == "compute"
    assert g0.memory.used == 20 * GiB  # a handle holds no memory
    for g in snap.gpus:
        assert mon.pid in {p.pid for p in g.processes if p.kind == "handle"}
    assert kinds[mon.pid].command == "dcgm-exporter"


def test_process_titles(sim_host, hold):
    h = hold("--gpus", "0,1", "--memory", "1GiB", "--workers", "2", "--title", "sglang::scheduler_TP{rank}")
    snap = gpuslate.status([0, 1])
    cmds = sorted(p.command for g in snap.gpus for p in g.processes)
    assert cmds == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert all(p.name.startswith("sglang::schedul") for g in snap.gpus for p in g.processes)
    assert h.pid not in [p.pid for g in snap.gpus for p in g.processes]


def test_gpu_filter(sim_host, hold, cli):
    hold("--gpus", "1", "--memory", "1GiB")
    r = cli("status", "--gpus", "0,2-3", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [g["index"] for g in doc["gpus"]] == [0, 2, 3]
    r = cli("status", "--gpus", "8")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["gpuslate: error: GPU 8 does not exist: this host has 8 GPUs (0-7)"]


def test_json_schema(sim_host, hold, cli):
    jsonschema = pytest.importorskip("jsonschema")
    from pathlib import Path

    h = hold("--gpus", "0-1", "--memory", "3GiB", "--workers", "2")
    hold("--gpus", "2", "--memory", "0")
    sim_host.leak(5, GiB)
    r = cli("status", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    schema = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "status.v1.json").read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=_format_checker(jsonschema))
    validator.validate(doc)
    # the checker really checks: a document a format-blind validator would pass fails here
    for bad in ({**doc, "taken_at": "yesterday"},
                {**doc, "gpus": [{**doc["gpus"][0], "processes": [{**p0, "started": "2026-13-45T99:00:00Z"}
                                                                  for p0 in doc["gpus"][0]["processes"]]}]}):
        with pytest.raises(jsonschema.ValidationError, match="date-time"):
            validator.validate(bad)
    assert doc["schema"] == "gpuslate.status.v1" and doc["backend"] == "sim"
    p = doc["gpus"][0]["processes"][0]
    assert p["root_pid"] == h.pid and p["kind"] == "compute" and p["used_memory"] == 3 * GiB
    assert p["started"].endswith("Z") and doc["taken_at"].endswith("Z")
    assert doc["gpus"][5]["memory"]["used"] == GiB and doc["gpus"][5]["processes"] == []


def _format_checker(jsonschema):
    """jsonschema checks "date-time" only with an optional package installed; without it
    every string passes. Check RFC 3339 here, so the test cannot pass a wrong time."""
    import datetime
    import re

    checker = jsonschema.FormatChecker()

    @checker.checks("date-time", raises=ValueError)
    def date_time(value: object) -> bool:
        if not isinstance(value, str):
            return True
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", value, re.ASCII):
            raise ValueError(f"{value!r} is not an RFC 3339 date-time")
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))  # month 13 fails here
        return True

    return checker


def test_leak_without_process(sim_host, cli):
    r = cli("sim", "leak", "--gpu", "3", "--memory", "2GiB")
    assert r.returncode == 0, r.stderr
    snap = gpuslate.status([3])
    assert snap.gpus[0].memory.used == 2 * GiB and snap.gpus[0].processes == []
    # said, with the remedy, in the table and the document: the fact the exporter reports as leaked
    (w,) = snap.warnings
    assert w.startswith("GPU 3: 2.0 GiB held by no process: a leaked or driver-held context") and \
        "remedy: on a simulated host it stays until the next 'gpuslate sim init'" in w
    r = cli("status")
    assert "No processes hold the selected GPUs." in r.stdout and f"warning: {w}" in r.stdout
    assert json.loads(cli("status", "--json").stdout)["warnings"] == [w]
    assert gpuslate.status([2]).warnings == []  # the other GPUs hold nothing
    # the leak stays until the host is initialised again
    assert gpuslate.status([3]).gpus[0].memory.used == 2 * GiB
    r = cli("sim", "init", str(sim_host.root), "--gpus", "8", "--memory", "96GiB")
    assert r.returncode == 0, r.stderr
    assert gpuslate.status([3]).gpus[0].memory.used == 0


def test_release_delay(tmp_path, hold):
    from gpuslate.gpu.simhost.host import SimHost

    host = SimHost.init(tmp_path / "slow", gpus=2, memory=96 * GiB, release_delay=1.0)
    h = hold("--gpus", "0", "--memory", "40GiB", host=host)
    backend = SimBackend(host.root)
    os.kill(h.pid, signal.SIGKILL)
    h.proc.wait(5)
    dead = time.monotonic()
    snap = take_snapshot(backend, [0])
    # never instantly: the memory is still held, by a process that is gone
    assert snap.gpus[0].memory.used == 40 * GiB
    assert [(p.pid, p.visible) for p in snap.gpus[0].processes] == [(h.pid, False)]
    wait_for(lambda: take_snapshot(backend, [0]).gpus[0].memory.used == 0, timeout=10)
    assert time.monotonic() - dead >= 0.9


def test_zombie_memory_released(sim_host, hold):
    h = hold("--gpus", "0", "--memory", "4GiB", "--workers", "1", "--no-reap")
    w = h.workers[0]
    os.kill(w, signal.SIGKILL)
    wait_for(lambda: is_gone(w))
    assert read_stat(w).state == "Z"  # the launcher does not reap it
    wait_for(lambda: gpuslate.status([0]).gpus[0].memory.used == 0, timeout=5)


def test_root_pid_climbs_when_group_leader_is_gone(sim_host):
    """A launched B launched holder C, all in A's group; A exits: C's launcher is B."""
    code = (
        "import subprocess,sys,os;"
        "b=subprocess.Popen([sys.executable,'-c',"
        "'import subprocess,sys;c=subprocess.Popen([sys.executable,\"-m\",\"gpuslate\",\"sim\",\"hold\","
        "\"--gpus\",\"0\",\"--memory\",\"1GiB\"],stdout=sys.stdout);c.wait()'],"
        "stdout=sys.stdout);print(b.pid,flush=True);os._exit(0)"
    )
    a = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=gpuslate_env(), start_new_session=True)
    try:
        b_pid = int(a.stdout.readline())
        ready = json.loads(a.stdout.readline())
        a.wait(5)
        snap = gpuslate.status([0])
        (p,) = snap.gpus[0].processes
        assert p.pid == ready["pid"] and p.pgid == a.pid
        assert p.root_pid == b_pid
    finally:
        os.killpg(a.pid, signal.SIGKILL)


def test_text_output_lists_every_gpu_and_tree(sim_host, hold, cli):
    h = hold("--gpus", "0-7", "--memory", "2GiB", "--workers", "8", "--title", "sglang::scheduler_TP{rank}")
    r = cli("status", env={"COLUMNS": "160"})
    assert r.returncode == 0, r.stderr
    for i in range(8):
        assert f"sglang::scheduler_TP{i}" in r.stdout
    assert "launcher" in r.stdout and str(h.pid) in r.stdout


def test_watch_json_lines(sim_host, hold):
    proc = subprocess.Popen([sys.executable, "-m", "gpuslate", "status", "--json", "--watch", "0.05"],
                            stdout=subprocess.PIPE, text=True, env=gpuslate_env())
    try:
        docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert all(d["schema"] == "gpuslate.status.v1" for d in docs)
        assert docs[0]["taken_at"] < docs[2]["taken_at"]
    finally:
        proc.send_signal(signal.SIGINT)
        # read what it wrote meanwhile: a watch blocked on a full pipe cannot exit (its last flush)
        proc.communicate(timeout=60)
        assert proc.returncode == 0


@pytest.mark.skipif(nvml_library_present(), reason="an NVIDIA driver is installed on this machine")
def test_no_driver_and_no_sim(cli, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUSLATE_SIM"}
    r = subprocess.run([sys.executable, "-m", "gpuslate", "status"], capture_output=True, text=True,
                       env={**gpuslate_env(), "GPUSLATE_SIM": ""} | {"PATH": env.get("PATH", "")})
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("gpuslate: error: no NVIDIA driver available")
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "gpuslate", "status", "--json"], capture_output=True, text=True,
                       env={**gpuslate_env(), "GPUSLATE_SIM": ""})
    assert r.returncode == 3
    assert json.loads(r.stdout)["error"]["type"] == "backend_unavailable"


def test_sim_dir_that_is_not_a_host(cli, tmp_path):
    r = cli("--sim", str(tmp_path / "nope"), "status")
    assert r.returncode == 3
    assert "no simulated host at" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["status", "--gpus", "1-0"], "GPU range"),
    (["status", "--gpus", "x"], "invalid GPU list"),
    (["status", "--watch", "-1"], "greater than 0"),
    (["sim", "hold", "--gpus", "0", "--memory", "40XB"], "invalid size"),
    (["sim", "hold", "--gpus", "9", "--memory", "1GiB"], "GPU 9 does not exist"),
    (["sim", "leak", "--gpu", "3", "--memory", "lots"], "invalid size"),
    (["sim", "init", "/tmp/x", "--memory=-3GiB"], "invalid size"),
    (["sim", "init", "/tmp/x", "--gpus", "0"], "must be 1 to 64"),
    (["sim", "init", "/tmp/x", "--count", "65"], "must be 1 to 64"),
    (["nosuchcommand"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(sim_host, cli, args, needle):
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("gpuslate: error:"), lines


def test_a_holder_whose_main_thread_exited_is_shown_holding(sim_host, hold, cli):
    """/proc says Z for its leader and its fd table is empty: it holds all the same (issue 24)."""
    h = hold("--gpus", "1", "--memory", "3GiB", "--main-thread-exits")
    wait_for(lambda: read_stat(h.pid).leader_exited)
    procs = gpu(gpuslate.status([1]), 1).processes
    assert [(p.pid, p.used_memory, p.visible) for p in procs] == [(h.pid, 3 * GiB, True)]
    assert procs[0].state != "Z" and procs[0].command.endswith("--main-thread-exits")
    r = cli("status", "--gpus", "1")
    assert r.returncode == 0 and str(h.pid) in r.stdout and "No processes hold" not in r.stdout


def test_cpu_time_host_memory_and_elapsed_as_ps_reads_them(sim_host, cli):
    """What nvitop and gpustat users look for, per process: CPU time (so CPU share over its life,
    as ps computes %CPU), resident host memory and the time it has run; checked against procps'
    ps, which reads /proc on its own. The holder works on the CPU for a while before it rests."""
    code = ("import os, sys, time; f = open(sys.argv[1]); t = time.process_time()\n"
            "while time.process_time() - t < 0.5: pass\n"
            "buf = bytearray(64 << 20); print('ready', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(sim_host.device_path(3))], stdout=subprocess.PIPE,
                            text=True, env=gpuslate_env())
    try:
        assert proc.stdout.readline().strip() == "ready"
        r = cli("status", "--json", "--gpus", "3")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        (p,) = [p for p in doc["gpus"][0]["processes"] if p["pid"] == proc.pid]
        ps = subprocess.run(["ps", "-o", "rss=,cputimes=,etimes=", "-p", str(proc.pid)], capture_output=True,
                            text=True, check=True).stdout.split()
        rss_kib, cpu_s, elapsed_s = (int(x) for x in ps)
        assert abs(p["host_memory"] / 1024 - rss_kib) < 0.05 * rss_kib and p["host_memory"] > 64 << 20
        assert p["cpu_time_s"] >= 0.5 and abs(p["cpu_time_s"] - cpu_s) <= 1
        snap = gpuslate.status([3])
        (held,) = [h for h in snap.gpus[0].processes if h.pid == proc.pid]
        life = held.elapsed_s(snap.taken_at)
        assert life is not None and abs(life - elapsed_s) <= 2
        assert held.cpu_pct(snap.taken_at) == pytest.approx(100 * held.cpu_time_s / life)
    finally:
        proc.kill()
        proc.wait()
