"""Pre-flight and bad input: a port in use, GPUs held by someone else, a malformed gpuslate.toml,
two concurrent `up` on the same GPUs, and a unit that is already running."""

from __future__ import annotations

import getpass
import json
import os
import socket

from gpuslate.units.contain import choose_fence, discard_cgroup
from gpuslate.units.preflight import port_listener
from helpers import leader_exits, unit_records
from unitkit import free_port, popen_units, serve_cmd


def test_port_already_in_use(units_host, units):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = units("up", "p", "--gpus", "0", "--port", str(port), "--", *serve_cmd(port))
    assert r.returncode == 4
    assert f"port {port} is already in use by pid {os.getpid()}" in r.stderr
    assert unit_records().load("p") is None and not units_host.held()  # nothing was started


def test_a_holder_that_just_exited_is_said_so(tmp_path, units_host, units, hold, monkeypatch):
    """Its memory still being released (here for 30 s): named as exited, with its memory, never
    as '(?: ?, 5.0 GiB)'; a command is whole, never cut at 60 characters."""
    from gpuslate.gpu.simhost.host import SimHost

    slow = SimHost.init(tmp_path / "slow", gpus=2, memory=16 * 1024**3, release_delay=30)
    monkeypatch.setenv("GPUSLATE_SIM", str(slow.root))
    title = "python3 -m sglang.launch_server --model-path /models/meta-llama/Llama-3.1-8B --port 30000"
    gone = hold("--gpus", "0", "--memory", "5GiB", host=slow)
    stays = hold("--gpus", "1", "--memory", "1GiB", "--title", title, host=slow)
    gone.kill()
    gone.proc.wait(10)
    r = units("up", "u", "--gpus", "0-1", "--ready-log", "never", "--", "sleep", "60")
    assert r.returncode == 4
    line = r.stderr.splitlines()[0]
    assert f"pid {gone.pid} (exited, or not visible from this host's /proc, 5.0 GiB)" in line, line
    assert f"pid {stays.pid} ({getpass.getuser()}: {title}, 1.0 GiB)" in line, line
    assert "?" not in line


def test_gpus_held_by_someone_else(units_host, units, hold):
    h = hold("--gpus", "3", "--memory", "7GiB", "--title", "someone-elses-job")
    port = free_port()
    r = units("up", "g", "--gpus", "2-3", "--port", str(port), "--", *serve_cmd(port))
    assert r.returncode == 4
    line = r.stderr.splitlines()[0]
    assert "GPU 3 not free for unit g" in line and f"pid {h.pid}" in line and "someone-elses-job" in line
    assert "7.0 GiB" in line and unit_records().load("g") is None
    # --clear ends the holder first (it is this user's), then the unit starts
    r = units("up", "g", "--gpus", "2-3", "--port", str(port), "--clear", "--yes", "--json", "--", *serve_cmd(port))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cleared"]["ok"] and h.pid in [t["pid"] for t in doc["cleared"]["targets"]]
    assert units("down", "g").returncode == 0


def test_malformed_toml(units_host, units, tmp_path):
    (tmp_path / "gpuslate.toml").write_text('[units.a]\ncommand = ["x"]\nport = 30000\ngpus = "0-1\n')
    r = units("up", "a")
    assert r.returncode == 2
    assert "gpuslate.toml: malformed TOML" in r.stderr and "line 4" in r.stderr
    (tmp_path / "gpuslate.toml").write_text('# units\n\n[units.a]\ncommand = ["x"]\nport = "30000"\n')
    r = units("up", "a")
    assert r.returncode == 2 and "gpuslate.toml:5: port in [units.a] has the wrong type" in r.stderr
    (tmp_path / "other.toml").write_text('[units.a]\ncommand = ["x"]\nprot = 1\n')
    r = units("up", "a", "--config", str(tmp_path / "other.toml"))
    assert r.returncode == 2 and "other.toml:3: unknown key 'prot'" in r.stderr
    (tmp_path / "other.toml").write_text('[units.a]\ncommand = ["x"]\n')
    r = units("up", "nosuch", "--config", str(tmp_path / "other.toml"))
    assert r.returncode == 2 and "unknown unit 'nosuch'" in r.stderr
    assert units("up", "a", "--config", str(tmp_path / "missing.toml")).returncode == 2
    assert not units_host.held() and unit_records().load("a") is None


def test_two_concurrent_ups_on_the_same_gpus(units_host, units):
    ports = [free_port(), free_port()]
    procs = [popen_units("up", f"c{i}", "--gpus", "0-3", "--port", str(p), "--engine", "sglang", "--",
                         *serve_cmd(p, startup=1.0)) for i, p in enumerate(ports)]
    outs = [p.communicate(timeout=60) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 4], outs
    win, lose = (0, 1) if codes[0] == 0 else (1, 0)
    err = outs[lose][1]
    assert f"waiting for the host lock (at most 900 s): held by up c{win}" in err  # serialized, said so
    assert f"of unit c{win}" in err and f"not free for unit c{lose}" in err
    assert unit_records().load(f"c{lose}") is None  # the loser started nothing
    assert units("ps").stdout.count("ready") == 1
    assert units("down", f"c{win}").returncode == 0


def test_already_running_and_restart_from_last_spec(units_host, units):
    port = free_port()
    assert units("up", "same", "--gpus", "5", "--port", str(port), "--", *serve_cmd(port)).returncode == 0
    r = units("up", "same")
    assert r.returncode == 2 and "already running" in r.stderr
    assert units("down", "same").returncode == 0
    r = units("up", "same", "--json")  # no config, no command: the spec it last ran with
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpus"] == [5]
    assert units("down", "same").returncode == 0
    assert units("down", "nosuch").returncode == 2
    r = units("up", "x", "--gpus", "0", "--ready-log", "ok", "--", "/no/such/binary")
    assert r.returncode == 2 and "command not found" in r.stderr


def test_fence_falls_back_with_a_reason():
    fence, note = choose_fence("t", "session")
    assert fence.kind == "session" and fence.preexec is None
    fence, note = choose_fence("t")
    assert fence.kind in ("cgroup", "scope", "session")
    if fence.kind == "session":
        assert note  # why no cgroup was used is recorded
    elif fence.cgroup:
        discard_cgroup(fence.cgroup)


def test_a_new_command_does_not_inherit_the_last_runs_readiness(units_host, units):
    import sys

    r = units("up", "same", "--gpus", "5", "--ready-log", "custom-ready", "--", sys.executable, "-c",
              "print('custom-ready', flush=True); import time; time.sleep(600)")
    assert r.returncode == 0, r.stderr
    assert units("down", "same").returncode == 0
    port = free_port()
    # the old --ready-log would never match this server's log: the new command is judged on its own
    r = units("up", "same", "--gpus", "5", "--port", str(port), "--start-timeout", "20", "--json", "--",
              *serve_cmd(port))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["readiness"]["kind"] == "tcp" and doc["command"] == serve_cmd(port)
    assert units("down", "same").returncode == 0
    r = units("up", "same", "--json")  # no command: the spec it last ran with, the new one
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["readiness"]["kind"] == "tcp"
    assert units("down", "same").returncode == 0


def test_a_port_held_by_a_process_whose_main_thread_exited_is_named(units_host, units):
    """Its socket is in a thread's fd table only (issue 24): still the pid that holds the port."""
    setup = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); report = s.getsockname()[1]"
    with leader_exits(setup) as p:
        port = p.report
        assert port_listener(port) == p.pid
        r = units("up", "t", "--gpus", "0", "--port", str(port), "--", *serve_cmd(port))
    assert r.returncode == 4 and f"port {port} is already in use by pid {p.pid}" in r.stderr


def test_wait_names_the_unit_holding_the_gpus_as_up_does(units_host, units):
    """``wait`` on a unit's GPUs: its remedy is ``gpuslate down NAME`` (as ``up``'s pre-flight
    says), never ``gpuslate clear``; another process keeps the general remedy."""
    port = free_port()
    assert units("up", "web", "--gpus", "3", "--port", str(port), "--", *serve_cmd(port)).returncode == 0
    r = units("up", "other", "--gpus", "3", "--port", str(free_port()), "--", *serve_cmd(port))
    assert r.returncode == 4 and "stop it first: gpuslate down web" in r.stderr
    r = units("wait", "--free", "--gpus", "3", "--timeout", "0.1")
    assert r.returncode == 4, r.stderr
    assert "for unit web" in r.stdout and "remedy: stop the unit: gpuslate down web" in r.stdout, r.stdout
    assert "gpuslate clear" not in r.stdout
    assert units("down", "web").returncode == 0
