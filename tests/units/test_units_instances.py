"""Units that share a name are not one unit (issue 15, E). A unit's processes carry the id of
that instance (GPUSLATE_UNIT_ID, 128 random bits) and the state folder it is recorded in; `down`
reaches only the caller's own processes of its own instance (root: that instance's, by identity):

* root's `down web` leaves another user's own `web` alone, with the record intact or torn;
* two jobs of one user, each with its own GPUSLATE_STATE_DIR and a unit `web`: `down web` in one
  leaves the other running, with the record intact or torn (the name marker then counts only
  with the state folder's), and a cgroup gpuslate made for the other's `web` is never killed.

The second user is `nobody` (no user is created); it runs gpuslate with the system Python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from gpuslate.proc.procfs import read_stat
from helpers import SRC, GiB, is_gone, kill_leftovers, unit_records, wait_for
from test_units_lifecycle import gpus_clean
from unitkit import run_units

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


def hold(gpu: int, python: str) -> list[str]:
    """A unit command: a launcher and one worker that double-forks away from it, holding 1 GiB."""
    return [python, "-m", "gpuslate", "sim", "hold", "--gpus", str(gpu), "--memory", "1GiB", "--workers", "1",
            "--orphan-workers"]


def up_web(state: Path, gpu: int, containment: str = "session") -> dict:
    r = run_units("up", "web", "--gpus", str(gpu), "--containment", containment, "--ready-log", '"workers"',
                  "--json", "--", *hold(gpu, sys.executable), env={"GPUSLATE_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def processes(state: Path) -> list[int]:
    r = run_units("ps", "--json", env={"GPUSLATE_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    return next(u["processes"] for u in json.loads(r.stdout)["units"] if u["name"] == "web")


def settled(state: Path) -> list[int]:
    """The unit's processes once its worker's double fork is done (launcher and worker: two)."""
    def both() -> list[int] | None:
        found = processes(state)
        return found if len(found) == 2 else None

    return wait_for(both)  # type: ignore[return-value]


def down_web(state: Path) -> dict:
    r = run_units("down", "web", "--json", "--timeout", "20", env={"GPUSLATE_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tear(state: Path) -> None:
    """The record torn by a crash: not even the instance id survives."""
    path = state / "units" / "web.json"
    path.write_text(path.read_text()[:40])


def alive(pids: list[int]) -> bool:
    return bool(pids) and not any(is_gone(p) for p in pids)


@pytest.mark.parametrize("containment", ["session", "auto"])
def test_two_state_folders_of_one_user_each_with_web(units_host, tmp_path, containment):
    a, b = tmp_path / "job-a", tmp_path / "job-b"
    up_web(a, 0, containment)
    up_web(b, 1, containment)  # started later: the old name scan of job a took it in
    pa, pb = settled(a), settled(b)
    assert not set(pa) & set(pb)

    tear(a)  # job a's record is torn: its processes are found by the name and the state folder
    assert sorted(processes(a)) == sorted(pa)
    doc = down_web(a)
    assert doc["corrupt"] and sorted(p["pid"] for p in doc["processes"] + doc["swept"]) == sorted(pa)
    assert doc["verified_gpus"] == [0] and doc["memory_released"] is True  # what they held, read before
    wait_for(lambda: all(is_gone(p) for p in pa))
    assert alive(pb) and not gpus_clean(units_host, [1])

    up_web(a, 0, containment)  # again: now started after job b's
    pa = settled(a)
    doc = down_web(b)  # job b's intact record: only its own instance
    assert sorted(p["pid"] for p in doc["processes"] + doc["swept"]) == sorted(pb)
    wait_for(lambda: all(is_gone(p) for p in pb))
    assert alive(pa) and gpus_clean(units_host, [1]) and not gpus_clean(units_host, [0])
    down_web(a)
    wait_for(lambda: gpus_clean(units_host, [0, 1]))


@pytest.fixture
def shared(units_host: SimHost) -> Iterator[tuple[SimHost, dict[str, str]]]:
    """A simulated host root and `nobody` both use, and nobody's environment for gpuslate.

    The folder (outside tmp_path: `nobody` must reach it) is removed at the end, after what the test
    left in it was killed and with the environment naming it undone first: units_host's teardown
    runs after this one and must look at its own state folder, not make this one again."""
    if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail("needs root and /usr/bin/python3 to run a unit as another user")
        pytest.skip("needs root and /usr/bin/python3 to run a unit as another user")
    base = Path(tempfile.mkdtemp(prefix="gpuslate-units-"))
    try:
        with pytest.MonkeyPatch.context() as mp:  # undone before units_host's teardown
            base.chmod(0o755)
            host = SimHost.init(base / "host", gpus=4, memory=96 * GiB, release_delay=0.1)
            for d in (host.root, host.alloc):
                d.mkdir(exist_ok=True)
                d.chmod(0o1777)
            for name, uid in (("state-root", 0), ("locks-root", 0), ("state-nobody", NOBODY),
                              ("locks-nobody", NOBODY)):
                (base / name).mkdir(mode=0o700)
                os.chown(base / name, uid, -1)
            mp.setenv("GPUSLATE_SIM", str(host.root))
            mp.setenv("GPUSLATE_STATE_DIR", str(base / "state-root"))
            mp.setenv("GPUSLATE_LOCK_DIR", str(base / "locks-root"))
            env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC, "GPUSLATE_SIM": str(host.root),
                   "GPUSLATE_STATE_DIR": str(base / "state-nobody"), "GPUSLATE_LOCK_DIR": str(base / "locks-nobody")}
            try:
                yield host, env
            finally:
                from gpuslate.units.unit import load_units

                kill_leftovers(host, load_units(unit_records()))  # root's units here, and every holder
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SYSTEM_PYTHON, "-m", "gpuslate", *args], capture_output=True, text=True, env=env,
                          cwd="/", timeout=60, user=NOBODY, group=NOBODY, extra_groups=[])


@pytest.mark.parametrize("torn", [False, True])
def test_roots_down_web_leaves_another_users_web(shared, torn):
    host, env = shared
    r = run_units("up", "web", "--gpus", "0", "--containment", "session", "--ready-log", '"workers"', "--json",
                  "--", *hold(0, sys.executable))
    assert r.returncode == 0, r.stderr
    mine = settled(Path(os.environ["GPUSLATE_STATE_DIR"]))
    r = as_nobody(env, "up", "web", "--gpus", "1", "--ready-log", '"workers"', "--json", "--", *hold(1, SYSTEM_PYTHON))
    assert r.returncode == 0, r.stderr

    def their_web() -> list[int] | None:
        doc = json.loads(as_nobody(env, "ps", "--json").stdout)
        found = next(u["processes"] for u in doc["units"] if u["name"] == "web")
        return found if len(found) == 2 else None

    theirs: list[int] = wait_for(their_web)  # type: ignore[assignment]
    try:
        assert all(os.stat(f"/proc/{p}").st_uid == NOBODY for p in theirs)
        if torn:
            tear(Path(os.environ["GPUSLATE_STATE_DIR"]))
        doc = down_web(Path(os.environ["GPUSLATE_STATE_DIR"]))
        signaled = {p["pid"] for p in doc["processes"] + doc["swept"]}
        assert signaled == set(mine) and not signaled & set(theirs), doc
        wait_for(lambda: all(is_gone(p) for p in mine))
        assert alive(theirs) and not gpus_clean(host, [1])
        assert doc["verified_gpus"] == [0] and doc["memory_released"] is True
    finally:
        r = as_nobody(env, "down", "web", "--json")  # nobody stops its own unit
        assert r.returncode == 0, r.stderr
    wait_for(lambda: all(read_stat(p) is None or is_gone(p) for p in theirs))
    assert gpus_clean(host, [0, 1])


def test_a_spec_cannot_forge_the_markers_and_they_come_first(units_host):
    from gpuslate.units.launch import unit_env
    from gpuslate.units.spec import UnitSpec

    spec = UnitSpec("web", command=["x"], env={"GPUSLATE_UNIT_ID": "f" * 32, "GPUSLATE_UNIT": "api", "A": "1"})
    env = unit_env(spec, "a" * 32, unit_records().mark())
    assert env["GPUSLATE_UNIT_ID"] == "a" * 32 and env["GPUSLATE_UNIT"] == "web" and env["A"] == "1"
    assert list(env)[:3] == ["GPUSLATE_UNIT", "GPUSLATE_UNIT_ID", "GPUSLATE_UNIT_STATE"]
    doc = up_web(Path(os.environ["GPUSLATE_STATE_DIR"]), 2)
    block = open(f"/proc/{doc['pid']}/environ", "rb").read()
    assert block.startswith(b"GPUSLATE_UNIT=web\0GPUSLATE_UNIT_ID=" + doc["instance"].encode())
    down_web(Path(os.environ["GPUSLATE_STATE_DIR"]))


def test_another_users_holder_on_a_crashed_units_gpu_is_no_stray(shared):
    """A unit crashed (nothing of it left, its record says ready); another user now holds its GPU.
    That process started after the unit, on its GPU: but it is not the caller's, so it is not the
    unit's stray: `ps` says `exited` (not `orphaned`) and `down` leaves it alone."""
    import signal

    host, env = shared
    state = Path(os.environ["GPUSLATE_STATE_DIR"])
    up_web(state, 0)
    mine = settled(state)
    for pid in mine:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(is_gone(p) for p in mine) and gpus_clean(host, [0]))
    p = subprocess.Popen([SYSTEM_PYTHON, "-m", "gpuslate", "sim", "hold", "--gpus", "0", "--memory", "2GiB"],
                         stdout=subprocess.PIPE, text=True, env=env, cwd="/", user=NOBODY, group=NOBODY,
                         extra_groups=[], start_new_session=True)
    try:
        theirs = json.loads(p.stdout.readline())["pid"]
        r = run_units("ps", "--json")
        web = next(u for u in json.loads(r.stdout)["units"] if u["name"] == "web")
        assert web["state"] == "exited" and web["strays"] == [] and web["processes"] == [], web
        r = run_units("down", "web", "--json", "--timeout", "3")
        doc = json.loads(r.stdout)
        assert doc["strays"] == [] and not is_gone(theirs)
        assert doc["memory_released"] is False and r.returncode == 4  # GPU 0 is not free: said, not hidden
    finally:
        p.kill()
        p.wait()
