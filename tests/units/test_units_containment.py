"""Every descendant of a unit belongs to it, even one that double-forked into a
session of its own and renamed itself: `down` ends it too."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from gpuslate.units.contain import CGROUP_ROOT, _cgroup_v2, choose_fence, creating_cgroups, discard_cgroup
from helpers import is_gone, wait_for
from unitkit import free_port, serve_cmd

ESCAPE = (
    "import os, sys, time\n"
    "if os.fork(): sys.exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "if sys.argv[2] == 'rename':\n"
    "    try:\n        import setproctitle; setproctitle.setproctitle('escaped-helper')\n"
    "    except ImportError: pass\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(600)\n"
)


@pytest.mark.parametrize("containment", ["auto", "session"])
def test_escaped_descendant_is_stopped_with_the_unit(units_host, units, tmp_path, containment):
    port = free_port()
    pidfile = tmp_path / "escaped.pid"
    # Without a cgroup the escapee is found by the environment it inherited,
    # which a renamed process (setproctitle) overwrites: see docs/units.md, Limits.
    rename = "rename" if containment == "auto" and _cgroup_v2() else "keep"
    script = (f"{shlex.quote(sys.executable)} -c {shlex.quote(ESCAPE)} {pidfile} {rename} && "
              f"exec {shlex.join(serve_cmd(port))}")
    r = units("up", "web", "--gpus", "0-1", "--port", str(port), "--engine", "sglang", "--json",
              "--containment", containment, "--",
              "bash", "-c", script)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    escaped = int(pidfile.read_text())
    assert not is_gone(escaped)
    if containment == "session":
        assert doc["containment"] == "session"
    elif doc["containment"] == "cgroup":
        assert (CGROUP_ROOT / doc["cgroup"].lstrip("/") / "cgroup.procs").read_text().split().count(str(escaped))
    else:
        assert doc["containment_note"]  # says why no cgroup was used
    r = units("down", "web", "--json")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: is_gone(escaped), timeout=10)
    stopped = {p["pid"] for p in json.loads(r.stdout)["processes"] + json.loads(r.stdout)["swept"]}
    assert escaped in stopped or json.loads(r.stdout)["cgroup_killed"]


def test_cgroup_is_used_where_the_host_allows_it(units_host, units):
    port = free_port()
    r = units("up", "fenced", "--gpus", "2", "--port", str(port), "--json", "--", *serve_cmd(port))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    if _cgroup_v2():
        assert doc["containment"] in ("cgroup", "scope"), doc["containment_note"]
    assert units("down", "fenced").returncode == 0


COLLECT = "from gpuslate.units.contain import collect_stale_cgroups; collect_stale_cgroups()"


def test_a_cgroup_being_joined_is_never_collected():
    """Between a launch's mkdir of its unit's cgroup and its process moving in, the cgroup is empty, as an
    ended unit's is: the collector of another gpuslate sharing the parent cgroup (another user, state
    folder or simulated host: another host lock) leaves it alone meanwhile, and collects it after."""
    with creating_cgroups():
        fence, note = choose_fence("joining")
        if fence.kind != "cgroup" or fence.cgroup is None:
            pytest.skip(f"no cgroup of its own for a unit on this host: {note}")
        path = CGROUP_ROOT / fence.cgroup.lstrip("/")
        try:
            subprocess.run([sys.executable, "-c", COLLECT], check=True, timeout=60)
            assert path.is_dir()
        except BaseException:
            discard_cgroup(fence.cgroup)
            raise

    def collected() -> bool:  # a launch of another test may hold the parent's lock for a moment
        subprocess.run([sys.executable, "-c", COLLECT], check=True, timeout=60)
        return not path.exists()

    wait_for(collected, timeout=30)


def test_a_unit_gets_its_cgroup_while_other_gpuslates_collect(units_host, units):
    """Another gpuslate collecting stale cgroups all the while (its own host lock, the same parent
    cgroup): every unit started meanwhile still gets its cgroup, never a session for a refused one."""
    if not _cgroup_v2():
        pytest.skip("no cgroup v2 hierarchy: no cgroup to make or collect")
    loop = (f"import time\n{COLLECT}\nend = time.monotonic() + 120\n"
            "while time.monotonic() < end:\n    collect_stale_cgroups()\n")
    collector = subprocess.Popen([sys.executable, "-c", loop], start_new_session=True)
    try:
        for i in range(3):
            port = free_port()
            r = units("up", f"c{i}", "--gpus", "3", "--port", str(port), "--json", "--", *serve_cmd(port))
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            assert units("down", f"c{i}").returncode == 0
            assert doc["containment"] in ("cgroup", "scope"), doc["containment_note"]
    finally:
        collector.kill()
        collector.wait()


def test_what_a_unit_starts_while_it_stops_is_counted_apart(units_host, units, tmp_path):
    """A unit that starts a helper as it is told to stop (a shell's trap): the helper is found and
    ended in a later round, said as more processes, so the progress lines add up to the report."""
    pidfile = tmp_path / "late.pid"
    script = (f"trap 'sleep 300 & echo $! > {shlex.quote(str(pidfile))}; exit 0' TERM; "
              f"{shlex.quote(sys.executable)} -m gpuslate sim hold --gpus 0 --memory 1GiB & wait")
    r = units("up", "late", "--gpus", "0", "--containment", "session", "--ready-log", '"ready": true', "--",
              "bash", "-c", script)
    assert r.returncode == 0, r.stderr
    r = units("down", "late")
    assert r.returncode == 0, r.stderr
    late = int(pidfile.read_text())
    assert is_gone(late)
    first, more = re.findall(r"SIGTERM sent to (\d+) (more )?process", r.stderr)
    assert not first[1] and more[1] and int(first[0]) + int(more[0]) == int(
        re.search(r"stopped \(ready before\): (\d+) processes", r.stdout)[1]), (r.stdout, r.stderr)
