"""gpuslate --host against real sshd processes on loopback, each a separate simulated host."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from helpers import gpuslate_env, is_gone, wait_for
from sshd_hosts import free_port

pytestmark = [pytest.mark.ssh, pytest.mark.slow]  # real sshd processes and whole commands through them


def _doc(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def _by_host(doc: dict) -> dict[str, dict]:
    assert doc["schema"] == "gpuslate.fleet.v1"
    return {h["host"]: h for h in doc["hosts"]}


def _local(host, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "gpuslate", *args, "--json"], capture_output=True, text=True,
                       env=gpuslate_env(host.env), timeout=60)
    return json.loads(r.stdout)


def _stable(doc: dict) -> dict:
    """A status document without the moment it was taken."""
    return {k: v for k, v in doc.items() if k != "taken_at"}


def test_status_over_host_equals_local_document(lab, fleet, hold):
    h1 = lab.hosts["h1"]
    held = hold("--memory", "7GiB", "--gpus", "1,2", "--workers", "2", host=h1.sim)
    r = fleet("--host", "h1", "status", "--json")
    assert r.returncode == 0, r.stderr
    entry = _by_host(_doc(r))["h1"]
    assert entry["ok"] and entry["exit_code"] == 0 and entry["error"] is None
    local = _local(h1, "status")
    assert _stable(entry["result"]) == _stable(local)
    pids = {p["pid"] for g in entry["result"]["gpus"] for p in g["processes"]}
    assert set(held.workers) <= pids

    text = fleet("status", "-H", "h1")  # after the command too; rendered by the status table
    assert text.returncode == 0, text.stderr
    assert "── h1 ──" in text.stdout and "7.0 GiB/96.0 GiB" in text.stdout
    assert str(held.workers[0]) in text.stdout


def test_clear_across_hosts(lab, fleet, hold):
    held = [hold("--memory", "10GiB", "--workers", "2", host=lab.hosts[n].sim) for n in ("h1", "h2")]
    r = fleet("-H", "h1", "-H", "h2", "clear", "--yes", "--grace", "2", "--json")
    assert r.returncode == 0, r.stderr
    hosts = _by_host(_doc(r))
    for name, h in zip(("h1", "h2"), held):
        res = hosts[name]["result"]
        assert hosts[name]["ok"] and res["schema"] == "gpuslate.clear.v1" and res["status"] == "clean"
        assert {t["pid"] for t in res["targets"]} >= set(h.pids)
        wait_for(lambda h=h: all(is_gone(p) for p in h.pids))
    after = _by_host(_doc(fleet("-H", "h1", "-H", "h2", "status", "--json")))
    assert all(g["memory"]["used"] == 0 for e in after.values() for g in e["result"]["gpus"])


def test_clear_shows_every_plan_and_asks_once(lab, hold):
    """On a terminal: a dry run on every host, every plan shown, one question, then the clear."""
    import os
    import pty

    held = [hold("--memory", "3GiB", host=lab.hosts[n].sim) for n in ("h1", "h2")]
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpuslate", "-H", "h1", "-H", "h2", "clear", "--grace", "1"],
                             stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=lab.client_env(), start_new_session=True)
        os.write(master, b"y\n")
        out, err = p.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 0, err
    assert err.count("[y/N]") == 1 and "on 2 hosts?" in err
    assert "── h1 ──" in err and "── h2 ──" in err and len(re.findall(r"^Plan\b", err, re.M)) == 2
    assert out.count("Clean: GPUs 0-3 free") == 2
    for h in held:
        wait_for(lambda h=h: is_gone(h.pid))


def test_clear_answered_no_signals_nothing(lab, hold):
    import os
    import pty

    held = hold("--memory", "3GiB", host=lab.hosts["h1"].sim)
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpuslate", "-H", "h1", "clear"], stdin=slave,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=lab.client_env())
        os.write(master, b"n\n")
        _, err = p.communicate(timeout=60)
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 130 and "nothing was signaled" in err
    assert not is_gone(held.pid)


def test_failures_are_named_and_never_block_the_others(lab, fleet):
    t0 = time.monotonic()
    r = fleet("--connect-timeout", "2", "-H", "h1", "-H", "down", "-H", "refused", "-H", "hang", "-H", "rekeyed",
              "-H", "h2", "status", "--json")
    wall = time.monotonic() - t0
    assert r.returncode == 7, r.stderr  # some hosts failed, others did not
    hosts = _by_host(_doc(r))
    assert list(hosts) == ["h1", "down", "refused", "hang", "rekeyed", "h2"]  # the order asked for
    assert hosts["h1"]["ok"] and hosts["h2"]["ok"]
    assert hosts["h1"]["result"]["schema"] == "gpuslate.status.v1"
    assert hosts["down"]["error"]["type"] == "unreachable" and hosts["down"]["exit_code"] == 3
    assert hosts["refused"]["error"]["type"] == "auth_refused" and hosts["refused"]["exit_code"] == 5
    assert hosts["hang"]["error"]["type"] == "timed_out" and hosts["hang"]["exit_code"] == 4
    assert hosts["rekeyed"]["error"]["type"] == "host_key_changed" and hosts["rekeyed"]["exit_code"] == 5
    assert "changed" in hosts["rekeyed"]["error"]["message"]
    assert "Connection refused" in hosts["down"]["error"]["message"]
    # the hanging host costs its timeout once, in parallel with the others
    assert hosts["h1"]["elapsed_s"] < 2 and wall < 8
    text = fleet("--connect-timeout", "1", "-H", "h1", "-H", "hang", "status")
    assert text.returncode == 7
    assert "timed_out" in text.stdout and "1 ok, 1 failed" in text.stdout
    assert "gpuslate: error" not in text.stderr and "Traceback" not in text.stderr


def test_all_failed_alike_keeps_their_code(lab, fleet):
    r = fleet("-H", "down", "-H", f"127.0.0.1:{free_port()}", "status", "--json")
    assert r.returncode == 3
    assert {h["error"]["type"] for h in _doc(r)["hosts"]} == {"unreachable"}


def test_gpuslate_missing_falls_back_to_nvidia_smi_for_status(lab, fleet):
    r = fleet("-H", "bare", "status", "--json")
    assert r.returncode == 0, r.stderr
    entry = _by_host(_doc(r))["bare"]
    res = entry["result"]
    assert entry["ok"] and res["source"] == "nvidia-smi" and res["schema"] == "gpuslate.status.v1"
    assert [g["index"] for g in res["gpus"]] == [0, 1]
    assert res["gpus"][0]["memory"]["used"] == 1024 * 1024**2
    assert res["gpus"][0]["processes"][0]["pid"] == 4242 and res["gpus"][1]["processes"] == []
    assert any("gpuslate --host HOST install" in w for w in res["warnings"])
    text = fleet("-H", "bare", "status")
    assert "from nvidia-smi" in text.stdout and "4242" in text.stdout

    # anything but status: the named failure and the install command, nothing else tried
    r = fleet("-H", "bare", "-H", "h1", "clear", "--yes", "--json")
    hosts = _by_host(_doc(r))
    assert hosts["bare"]["error"]["type"] == "gpuslate_missing"
    assert "gpuslate --host HOST install" in hosts["bare"]["error"]["hint"] and hosts["h1"]["ok"]
    assert r.returncode == 7


HOSTILE = ["$(touch {m})", "`touch {m}`", "; touch {m}", "' ; touch {m} ; '", '"; touch {m}; "',
           "x\ntouch {m}", "| touch {m}", "&& touch {m}", "$'\\x3b' touch {m}"]


def test_no_injection_through_arguments(lab, fleet, tmp_path):
    marker = tmp_path / "injected"
    values = [t.format(m=marker) for t in HOSTILE]
    for value in values:  # each one arrives whole: the remote compiled it as one regex and signaled nothing
        r = fleet("-H", "h1", "clear", "--dry-run", "--json", "--match", value)
        assert _doc(r)["hosts"][0]["result"]["status"] == "dry_run", r.stderr
        assert not marker.exists(), value
    every = "".join(values)
    for args in (("logs", every), ("down", every), ("clear", "--dry-run", "--user", every), ("swap", every, "b"),
                 ("up", "u", "--ready-log", "x", "--config", f"/tmp/{every}", "--", "true", *values)):
        r = fleet("-H", "h1", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
        assert not marker.exists(), args


def test_environment_values_arrive_verbatim(lab, fleet, tmp_path):
    marker = tmp_path / "injected"
    value = f"$(touch {marker}); `touch {marker}` \"q\" 'q' \\ end"
    port = free_port()
    serve = [sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port), "--startup-seconds", "0",
             "--memory", "1GiB"]
    r = fleet("-H", "h1", "up", "envtest", "--gpus", "0", "--port", str(port), "--env", f"HOSTILE={value}",
              "--json", "--", *serve)
    try:
        entry = _by_host(_doc(r))["h1"]
        assert entry["ok"], entry
        assert entry["result"]["env"]["HOSTILE"] == value and not marker.exists()
    finally:
        fleet("-H", "h1", "down", "envtest")


def test_hostile_host_options_are_refused_before_any_ssh(lab, fleet, tmp_path):
    marker = tmp_path / "injected"
    for spec in (f"-oProxyCommand=touch {marker}", f"h1;touch {marker}", "h1 h2", "user@@h1", "[::1"):
        for args in (("--host", spec), (f"--host={spec}",)):
            r = fleet(*args, "status")
            assert r.returncode == 2 and ("invalid" in r.stderr or "needs a value" in r.stderr), (spec, r.stderr)
            assert r.stderr.count("\n") <= 2 and not marker.exists()
    assert "invalid host" in fleet(f"--host=-oProxyCommand=touch {marker}", "status").stderr
    r = fleet("-H", "h1", "clear", "--gpus", "x-y")  # bad local input: exit 2, no host contacted
    assert r.returncode == 2 and "h1" not in r.stdout


def test_up_swap_down_on_a_remote_host(lab, fleet):
    port = free_port()

    def serve(*extra: str) -> list[str]:
        return ["--", sys.executable, "-m", "gpuslate", "sim", "serve", "--port", str(port),
                "--startup-seconds", "0.1", "--memory", "2GiB", *extra]

    try:
        # 'next' is recorded by a first run, so that swap can start it again from its record
        r = fleet("-H", "h1", "up", "next", "--gpus", "0,1", "--port", str(port), "--json",
                  *serve("--mode", "speculative"))
        assert _doc(r)["hosts"][0]["ok"], r.stdout
        assert fleet("-H", "h1", "down", "next").returncode == 0
        r = fleet("-H", "h1", "up", "base", "--gpus", "0,1", "--port", str(port), *serve())
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Unit base ready" in r.stdout
        ps = _by_host(_doc(fleet("-H", "h1", "-H", "h2", "ps", "--json")))
        assert [u["name"] for u in ps["h1"]["result"]["units"] if u["state"] == "ready"] == ["base"]
        assert ps["h2"]["result"]["units"] == []
        r = fleet("-H", "h1", "swap", "base", "next", "--json")
        assert r.returncode == 0, r.stdout
        res = _by_host(_doc(r))["h1"]["result"]
        assert res["schema"] == "gpuslate.swap.v1" and res["ok"] and res["up"]["status"] == "ready"
        r = fleet("-H", "h1", "swap", "next", "base")  # and back, shown as a local swap shows it
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Unit base ready in" in r.stdout and "verify GPUs clean" in r.stdout and "total" in r.stdout
        r = fleet("-H", "h1", "swap", "base", "next")
        assert r.returncode == 0, r.stdout + r.stderr
        r = fleet("-H", "h1", "down", "next")  # shown with the lines a local 'down' prints
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"Unit next stopped \(ready before\): \d+ process(es)? \(SIGTERM \d+, SIGKILL \d+\) "
                         r"in [\d.]+ s; GPU memory on GPUs 0-1 released", r.stdout), r.stdout
        assert _doc(fleet("-H", "h1", "ps", "--json"))["hosts"][0]["result"]["units"][0]["state"] == "stopped"
    finally:
        for name in ("base", "next"):
            fleet("-H", "h1", "down", name)


def test_swap_runs_host_by_host_and_stops_at_the_first_failure(lab, fleet):
    r = fleet("-H", "down", "-H", "h1", "swap", "a", "b", "--json")
    hosts = _by_host(_doc(r))
    assert hosts["down"]["error"]["type"] == "unreachable"
    assert hosts["h1"]["error"]["type"] == "not_run" and hosts["h1"]["elapsed_s"] == 0
    assert r.returncode == 7
    r = fleet("-H", "down", "-H", "h1", "--keep-going", "swap", "a", "b", "--json")
    h1 = _by_host(_doc(r))["h1"]
    assert h1["error"]["type"] == "command_failed" and h1["exit_code"] == 2  # it ran: unknown unit 'a'
    assert "unknown unit" in h1["error"]["message"]


def test_inventory_and_group(lab, fleet, tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text("# the fleet\n[good]\nh1\nh2\n\n[bad]\ndown\n\n[all_gpus:children]\ngood\nbad\n")
    r = fleet("--hosts", str(inv), "--group", "good", "status", "--json")
    assert r.returncode == 0 and list(_by_host(_doc(r))) == ["h1", "h2"]
    r = fleet("--hosts", str(inv), "--group", "all_gpus", "status", "--json")
    assert r.returncode == 7 and list(_by_host(_doc(r))) == ["h1", "h2", "down"]
    r = fleet("--hosts", str(inv), "--group", "nope", "status")
    assert r.returncode == 2 and "no group 'nope'" in r.stderr
    r = fleet("--hosts", str(tmp_path / "missing.ini"), "status")
    assert r.returncode == 2 and "cannot read the inventory" in r.stderr


def test_parallel_bound_still_runs_every_host(lab, fleet):
    r = fleet("--parallel", "1", "-H", "h1", "-H", "h2", "-H", "h1", "ps", "--json")
    assert r.returncode == 0
    assert [h["host"] for h in _doc(r)["hosts"]] == ["h1", "h2"]  # duplicates run once
    assert fleet("--parallel", "0", "-H", "h1", "ps").returncode == 2


def test_progress_on_a_terminal(lab):
    """Hosts done / failed / pending on stderr when stderr is a terminal; nothing of it on stdout."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpuslate", "-H", "h1", "-H", "down", "ps", "--json"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=lab.client_env())
        out, _ = p.communicate(timeout=60)
        os.close(slave)
        slave = -1
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child's end is closed
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert p.returncode == 7
    text = err.decode()
    assert "hosts 2/2 done (1 failed), 0 pending" in text and "pending" not in out.decode()
    assert json.loads(out)["schema"] == "gpuslate.fleet.v1"


def test_wait_and_log_through_host(lab, fleet, hold):
    h = hold("--memory", "2GiB", "--gpus", "1", host=lab.hosts["h1"].sim)
    r = fleet("-H", "h1", "-H", "h2", "wait", "--free", "--timeout", "0.3")
    assert r.returncode == 7  # h1 is busy, h2 free
    assert "GPUs 0-3 free after" in r.stdout and "GPU 1 not free" in r.stdout
    assert fleet("-H", "h1", "clear", "--yes", "--grace", "1").returncode == 0
    wait_for(lambda: is_gone(h.pid))
    r = fleet("-H", "h1", "log", "--limit", "5")
    assert r.returncode == 0 and "SIGTERM" in r.stdout and str(h.pid) in r.stdout
    doc = _by_host(_doc(fleet("-H", "h1", "log", "--json")))["h1"]["result"]
    assert doc["schema"] == "gpuslate.log.v1" and any(e["target"]["pid"] == h.pid for e in doc["entries"])
