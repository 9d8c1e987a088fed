"""A corrupt unit record (torn, fields missing, wrong types) is reported by `ps` as `corrupt`, is
fatal to no other unit, blocks a second `up` of that name, and `down` still stops what the unit
runs (found by its cgroup, its GPUSLATE_UNIT marker, its port)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from gpuslate.units.readiness import http
from helpers import gpuslate_env, is_gone, unit_records, wait_for
from test_units_lifecycle import gpus_clean, ps
from unitkit import free_port, serve_cmd


def corrupt(path, how: str) -> str:
    doc = json.loads(path.read_text())
    if how == "truncated":
        path.write_text(path.read_text()[:40])  # torn by a crash: not even the pid survives
        return "not valid JSON"
    if how == "missing":
        del doc["pid"], doc["sid"]
        path.write_text(json.dumps(doc))
        return "field 'pid' is missing"
    doc["gpus"] = "0-1"  # wrong type
    path.write_text(json.dumps(doc))
    return "field 'gpus' is invalid"


def no_traceback(r) -> None:
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("containment,how", [("auto", "truncated"), ("session", "truncated"),
                                             ("session", "missing"), ("auto", "wrongtype")])
def test_corrupt_record_is_reported_contained_and_still_stopped(units_host, units, containment, how):
    port, other = free_port(), free_port()
    r = units("up", "a", "--gpus", "0-1", "--port", str(port), "--containment", containment, "--json", "--",
              *serve_cmd(port))
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    workers = json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])["worker_pids"]
    reason = corrupt(unit_records().record_path("a"), how)

    # an unrelated unit starts, swaps and is listed as usual
    r = units("up", "b", "--gpus", "2", "--port", str(other), "--", *serve_cmd(other))
    assert r.returncode == 0, r.stderr
    r = units("swap", "b", "b")
    assert r.returncode == 0, r.stderr
    listed = ps(units)
    assert listed["b"]["state"] == "ready"
    bad = listed["a"]
    assert bad["state"] == "corrupt" and reason in bad["corrupt_reason"]
    assert bad["record_file"] == str(unit_records().record_path("a"))
    assert {a["pid"], *workers} <= set(bad["processes"])  # found all the same
    table = units("ps")
    no_traceback(table)
    assert "corrupt" in table.stdout and "gpuslate down a" in table.stdout

    # a second `up a` refuses: the corrupt record may describe this very server
    spare = free_port()
    r = units("up", "a", "--gpus", "3", "--port", str(spare), "--", *serve_cmd(spare))
    no_traceback(r)
    assert r.returncode == 2 and "corrupt record" in r.stderr and "gpuslate down a" in r.stderr
    assert not any(h.record.gpu == 3 for h in units_host.held())  # nothing was started
    r = units("swap", "b", "a")
    no_traceback(r)
    assert r.returncode == 2 and "corrupt record" in r.stderr and ps(units)["b"]["state"] == "ready"

    # down stops everything of it, verifies its GPUs, and sets the record aside
    r = units("down", "a", "--json")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["corrupt"] and doc["record_set_aside"] and doc["previous_state"] == "corrupt"
    wait_for(lambda: all(is_gone(p) for p in (a["pid"], *workers)))
    wait_for(lambda: gpus_clean(units_host, [0, 1]))
    assert not unit_records().record_path("a").exists()
    assert "a" not in ps(units) and ps(units)["b"]["state"] == "ready"
    r = units("up", "a", "--gpus", "3", "--port", str(spare), "--", *serve_cmd(spare))
    assert r.returncode == 0, r.stderr
    assert units("down", "a").returncode == 0 and units("down", "b").returncode == 0


RENAMED = ("import os, runpy, sys\n"
           "os.environ.pop('SPT_NOENV')\n"  # a server whose title writes over its environment anyway
           "import setproctitle\n"
           "setproctitle.setproctitle('renamed-server')\n"  # overwrites the GPUSLATE_UNIT marker
           "sys.argv = ['gpuslate', *sys.argv[1:]]\n"
           "runpy.run_module('gpuslate', run_name='__main__')\n")


def test_renamed_server_of_a_corrupt_record_is_found_by_its_port(units_host, units):
    port = free_port()
    cmd = [sys.executable, "-c", RENAMED, *serve_cmd(port)[3:]]  # `sim serve ...` run renamed, in-process
    r = units("up", "r", "--gpus", "4-5", "--port", str(port), "--containment", "session", "--json", "--", *cmd)
    assert r.returncode == 0, r.stderr
    main = json.loads(r.stdout)["pid"]
    workers = json.loads(http("GET", f"http://127.0.0.1:{port}/get_server_info")[1])["worker_pids"]
    assert b"GPUSLATE_UNIT=r" not in open(f"/proc/{main}/environ", "rb").read()
    corrupt(unit_records().record_path("r"), "missing")  # no pid, no sid: the port and the GPUs still read
    assert set(ps(units)["r"]["processes"]) == {main, *workers}
    r = units("down", "r", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory_released"]  # its GPUs, as the record still shows them, verified
    wait_for(lambda: all(is_gone(p) for p in (main, *workers)))
    assert gpus_clean(units_host, [4, 5])


# -- names and files that are not unit records (issue 15, class F) ----------------

BAD_NAMES = ["../../app/settings", "../x", "a/b", "..", ".", "-x", "a" * 65, "a\x1b]0;pwned\x07b", "a b", "é", "",
             ".hidden", "a\tb"]


def test_a_path_as_unit_name_is_refused_by_every_command_and_signals_nothing(units_host, units, tmp_path):
    """`down ../../app/settings` once read app/settings.json as a corrupt record, ended what listened on
    the port it named and renamed the file away. Every command refuses the name: exit 2, one line."""
    port = free_port()
    server = subprocess.Popen(serve_cmd(port, startup=0.0), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=gpuslate_env(), start_new_session=True)
    try:
        wait_for(lambda: answers(port), timeout=20)
        settings = tmp_path / "app" / "settings.json"
        settings.parent.mkdir()
        settings.write_text(json.dumps({"port": port, "pid": server.pid, "gpus": [0]}))
        (tmp_path / "state" / "units").mkdir(parents=True, exist_ok=True)
        name = "../../app/settings"  # from state/units: tmp_path/app/settings.json
        for args in (["down", name], ["down", name, "--clear"], ["logs", name], ["swap", name, "b"],
                     ["swap", "b", name], ["up", name, "--port", str(free_port()), "--", "true"]):
            r = units(*args)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert r.stderr.count("\n") == 1 and "invalid unit name '../../app/settings'" in r.stderr, r.stderr
        assert server.poll() is None  # nothing signaled
        assert json.loads(settings.read_text())["port"] == port and os.listdir(settings.parent) == ["settings.json"]
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def answers(port: int) -> bool:
    try:
        return http("GET", f"http://127.0.0.1:{port}/get_server_info")[0] == 200
    except OSError:
        return False


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_unit_names_are_usage_errors(units_host, units, name):
    for args in (["down", "--", name], ["logs", "--", name], ["swap", "--", name, "b"], ["swap", "--", "b", name]):
        r = units(*args)
        assert r.returncode == 2, (args, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and "invalid unit name" in line and "\x1b" not in line and "\x07" not in line
    r = units("up", name, "--port", str(free_port()), "--", "true")
    assert r.returncode == 2 and "\x1b" not in r.stderr, r.stderr
    assert not units_host.held()


@pytest.mark.parametrize("name", [*BAD_NAMES, "a\0b", "a/../b", "a\nb"])
def test_library_refuses_bad_unit_names_before_touching_anything(units_host, name):
    from gpuslate import Host
    from gpuslate.errors import UsageError
    from gpuslate.units import resolve

    records = unit_records()
    for call in (lambda: records.read(name), lambda: records.record_path(name), lambda: records.log_path(name),
                 lambda: Host.open().down(name), lambda: resolve(name, command=["true"])):
        with pytest.raises(UsageError, match="invalid unit name"):
            call()


@pytest.mark.parametrize("cmd", [["ps"], ["down", "web"], ["logs", "web"], ["up", "web", "--port", "1", "--", "true"]])
def test_fifo_as_a_unit_record_is_refused_not_waited_on(units_host, units, tmp_path, cmd):
    units_dir = tmp_path / "state" / "units"
    units_dir.mkdir(parents=True, exist_ok=True)
    os.mkfifo(units_dir / "web.json")
    try:
        r = units(*cmd, timeout=30)  # a blocking open of the FIFO would wait here for ever
        no_traceback(r)
        assert r.returncode == 5, (r.stdout, r.stderr)
        assert "web.json: it is a FIFO, not a regular file" in r.stderr.splitlines()[0]
        assert stat.S_ISFIFO(os.lstat(units_dir / "web.json").st_mode)  # not renamed away either
    finally:
        os.unlink(units_dir / "web.json")  # the fixture's teardown lists the units


def test_files_no_unit_can_have_are_not_listed(units_host, units, tmp_path):
    units_dir = tmp_path / "state" / "units"
    units_dir.mkdir(parents=True, exist_ok=True)
    for junk in ("-x.json", "a b.json", ".web.json.123.tmp", "notes.txt"):
        (units_dir / junk).write_text("{}")
    r = units("ps", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["units"] == []


def test_down_of_a_torn_record_verifies_what_its_processes_held(units_host, units):
    """The torn record lost the unit's GPUs: `down` reads what the processes it found hold before
    it signals them, and verifies those GPUs released (the simulated driver frees memory 0.2 s after
    the process exits: a claim made without polling would be false)."""
    port = free_port()
    r = units("up", "t", "--gpus", "2-3", "--port", str(port), "--containment", "session", "--json", "--",
              *serve_cmd(port, memory="3GiB"))
    assert r.returncode == 0, r.stderr
    corrupt(unit_records().record_path("t"), "truncated")
    assert "gpus" not in unit_records().read("t").salvage
    r = units("down", "t")
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert gpus_clean(units_host, [2, 3])  # at once: down returned only once it was so
    assert "GPU memory on GPUs 2-3 released" in r.stdout, r.stdout


def test_down_never_calls_an_unverified_nothing_released(units_host, units):
    """A torn record of which nothing runs and that names no GPU: nothing to verify, and `down`
    says so instead of "released"."""
    path = unit_records().record_path("gone")
    path.write_text('{"schema": "gpuslate.unit.v1", "name": "gone", "spec": {')
    r = units("down", "gone", "--json")
    no_traceback(r)
    doc = json.loads(r.stdout)
    assert doc["memory_released"] is None and doc["verified_gpus"] == [] and "no GPU" in doc["unverified"]
    assert r.returncode == 0 and doc["record_set_aside"]  # nothing of it ran: the record goes aside
    path.write_text('{"schema": "gpuslate.unit.v1", "name": "gone", "spec": {')
    r = units("down", "gone")
    assert "not verified" in r.stdout and "released" not in r.stdout.replace("not verified", ""), r.stdout


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_log_that_is_no_regular_file_is_refused_not_followed(units_host, units, tmp_path, kind):
    """A unit's log is a state file: `logs` never waits on a FIFO planted as NAME.log, and never
    reads (nor `up` writes) through a symbolic link."""
    logs_dir = unit_records().log_path("web").parent  # state/units/logs
    target = tmp_path / "elsewhere.txt"
    target.write_text("not a log\n")
    unit_records().record_path("web").write_text('{"schema": "gpuslate.unit.v1", "name": "web", "spec": {')  # torn
    log = logs_dir / "web.log"
    if kind == "fifo":
        os.mkfifo(log)
    else:
        log.symlink_to(target)
    try:
        r = units("logs", "web", timeout=30)  # a blocking open of a FIFO would wait here for ever
        no_traceback(r)
        assert r.returncode == 5, (r.stdout, r.stderr)
        assert ("FIFO" if kind == "fifo" else "link") in r.stderr.splitlines()[0], r.stderr
        assert "not a log" not in r.stdout
    finally:
        log.unlink()
        unit_records().record_path("web").unlink()
    assert target.read_text() == "not a log\n"
