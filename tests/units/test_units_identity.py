"""Identity by number (issue 15, C): a unit's PID, session id and group id are numbers the kernel
reuses once the unit is gone. A crashed unit's PID handed to another user's program that calls
`setsid` and forks must not make `ps` call the unit `orphaned`, and `down` must never signal it.

The PID is reused for real: the scenario runs as PID 1 of a private PID namespace
(`unshare --fork --pid --mount-proc`, as in a container), where root can choose the next PID by
writing /proc/sys/kernel/ns_last_pid (tests/units/pidreuse.py). Needs root and unshare; in CI
(CI=true) their absence is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuslate.proc.procfs import read_stat
from helpers import gpuslate_env, is_gone, unit_records, wait_for

DRIVER = str(Path(__file__).with_name("pidreuse.py"))


def need_namespaces() -> None:
    missing = ("root" if os.geteuid() != 0 else None) or \
              next((t for t in ("unshare", "setpriv") if shutil.which(t) is None), None) or \
              (None if os.access("/usr/bin/python3", os.X_OK) else "/usr/bin/python3")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"needs {missing} to reuse a PID in a private PID namespace")
        pytest.skip(f"needs {missing} to reuse a PID in a private PID namespace")


def reuse(mode: str) -> dict:
    need_namespaces()
    r = subprocess.run(["unshare", "--fork", "--pid", "--mount-proc", sys.executable, DRIVER, mode],
                       capture_output=True, text=True, env=gpuslate_env(), timeout=180)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["record", "torn", "leader"])
def test_a_reused_pid_and_its_session_are_not_the_unit(units_host, mode):
    got = reuse(mode)
    web = next(u for u in got["ps"]["units"] if u["name"] == "web")
    assert got["stranger"] not in web["processes"], web
    assert web["processes"] == [] and web["state"] == ("corrupt" if mode == "torn" else "exited"), web
    down = got["down"]
    assert down is not None, got["down_err"]
    signaled = [p["pid"] for p in down["processes"] + down["swept"]]
    assert got["stranger"] not in signaled and got["main"] not in signaled, down
    assert got["stranger_alive"], "down signaled the stranger that reused the unit's session id"
    assert got["leader_alive"] == (mode == "leader")
    if mode == "torn":  # nothing found, no GPU known: not verified, and said so, never "released"
        assert down["memory_released"] is None and "no GPU" in down["unverified"], down
    else:
        assert got["down_rc"] == 0 and down["memory_released"] is True and down["verified_gpus"] == [0]


def test_a_record_from_another_boot_names_nobody_by_its_numbers(units_host, units):
    """Found in issue 32's attacks: a process identity (pid, start ticks) holds within one boot only. After
    a reboot, pids and ticks start again, and a program started as early in the new boot can have the very
    pid and start tick a unit's main process had. A record of another boot (its boot id) proves nothing by
    its numbers: down signals nothing of it, ps finds nothing; the same record of this boot is the unit."""
    import dataclasses
    import secrets

    from gpuslate.proc.procfs import boot_id
    from gpuslate.units.spec import UnitSpec
    from gpuslate.units.store import UnitRecord

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        wait_for(lambda: read_stat(p.pid) is not None)
        st = read_stat(p.pid)
        rec = UnitRecord(name="old", spec=UnitSpec("old", command=["x"], ready_log="x").to_json(), phase="ready",
                         pid=p.pid, start_ticks=st.start_ticks, pgid=p.pid, sid=p.pid, containment="session",
                         cgroup=None, log="/dev/null", gpus=[0], port=None, env={}, launched_at=time.time() - 100,
                         instance=secrets.token_hex(16), boot="00000000-0000-4000-8000-000000000000")
        store = unit_records()
        store.save(rec)
        ps_doc = json.loads(units("ps", "--json").stdout)
        assert [u["processes"] for u in ps_doc["units"] if u["name"] == "old"] == [[]]
        r = units("down", "old", "--json")
        assert json.loads(r.stdout)["processes"] == [] and not is_gone(p.pid), r.stdout
        torn = store.record_path("old")
        torn.write_text(torn.read_text()[:-40])  # torn: stopped by what is left of it, its boot still shows
        r = units("down", "old", "--json")
        assert json.loads(r.stdout)["processes"] == [] and not is_gone(p.pid), r.stdout
        store.save(dataclasses.replace(rec, boot=boot_id(), phase="ready"))  # this boot's: it is the unit
        r = units("down", "old", "--json")
        assert [x["pid"] for x in json.loads(r.stdout)["processes"]] == [p.pid], r.stdout
        wait_for(lambda: is_gone(p.pid))
    finally:
        p.kill()
        p.wait()
