"""A simulated host's files are reached by the trusted-root walk (issue 25): another user's host folder
cannot make root's gpuslate read without end, hang, follow a link into root's own folders, or remove
and create files there. As root, with a second real user owning the host (its files and links are
handed to that user with lchown: the kernel's facts are then what that user would have made).

Shapes the issue names: ``host.json`` a link to /dev/zero or a FIFO (status, clear, wait), ``alloc``
and ``dev`` links to a root folder (``sim init``). Shapes it does not: ``dev`` a link to /dev (whose
real GPUs' holders would pass for simulated ones), ``alloc`` a link (status would collect and mark
root's files), the host folder itself a link, ``memory.lock``/``dev/nvidia0``/a dead marker a FIFO,
a host.json of 8 MB or nested 100,000 deep, a root reset of another user's host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslate.gpu.simhost.host import SimHost
from helpers import GiB, gpuslate_env


def gs(*args: str, sim: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = gpuslate_env({"GPUSLATE_STATE_DIR": str(sim.parent / "state"),
                        "GPUSLATE_LOCK_DIR": str(sim.parent / "locks")})
    env.pop("GPUSLATE_SIM", None)
    return subprocess.run([sys.executable, "-m", "gpuslate", "--sim", str(sim), *args], text=True,
                          capture_output=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("gpuslate: error: "), r.stderr
    return lines[0]


def give(path: Path, user) -> None:
    """Hand ``path`` (a link itself, not its target) to ``user``."""
    os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


@pytest.fixture
def base() -> Iterator[Path]:
    b = Path(tempfile.mkdtemp(prefix="gpuslate-simpaths-"))
    b.chmod(0o755)
    yield b
    shutil.rmtree(b, ignore_errors=True)


@pytest.fixture
def theirs(base: Path, other_user) -> SimHost:
    """A simulated host whose folder and files are the other user's."""
    host = SimHost.init(base / "host", gpus=2, memory=8 * GiB, release_delay=0.1)
    for p in [host.root, *host.root.rglob("*")]:
        give(p, other_user)
    return host


@pytest.fixture
def roots(base: Path) -> Path:
    """A folder of root's with files that must stay as they are."""
    d = base / "roots"
    d.mkdir()
    for name in ("keep.json", "g0.keep.json", "nvidia0"):
        (d / name).write_text('{"gpu": 0, "pid": 1, "start_ticks": 0, "bytes": 1, "kind": "compute"}')
    return d


def replace_with_link(path: Path, target: str | Path, user) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(target)
    give(path, user)


@pytest.mark.parametrize("command", [["status", "--json"], ["clear", "--yes", "--json"],
                                     ["wait", "--free", "--timeout", "5", "--json"]], ids=lambda c: c[0])
@pytest.mark.parametrize("shape", ["dev-zero", "fifo", "huge", "deep"])
def test_host_json_of_another_user_is_never_read_without_end(theirs, other_user, command, shape):
    cfg = theirs.root / "host.json"
    cfg.unlink()
    if shape == "dev-zero":
        cfg.symlink_to("/dev/zero")
    elif shape == "fifo":
        os.mkfifo(cfg)
    elif shape == "huge":
        with open(cfg, "wb") as f:
            f.truncate(8 << 20)  # 8 MB of zeros (sparse)
    else:
        cfg.write_text("[" * 100_000 + "]" * 100_000)
    give(cfg, other_user)
    t0 = time.monotonic()
    r = gs(*command, sim=theirs.root)
    assert r.returncode == 3, (r.stdout, r.stderr)
    line = one_line(r)
    assert "host.json" in line, line
    assert time.monotonic() - t0 < 20  # no hang, no read of /dev/zero


@pytest.mark.parametrize("folder", ["alloc", "dev"])
def test_root_sim_init_never_unlinks_or_creates_through_another_users_link(theirs, roots, other_user, folder):
    replace_with_link(theirs.root / folder, roots, other_user)
    before = sorted(p.name for p in roots.iterdir())
    r = gs("sim", "init", str(theirs.root), "--count", "2", sim=theirs.root)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "cannot initialise" in one_line(r)
    assert sorted(p.name for p in roots.iterdir()) == before  # nothing removed, nothing created


def test_root_does_not_reset_another_users_host(theirs, other_user):
    leak = theirs.leak(0, GiB)
    give(leak, other_user)
    r = gs("sim", "init", str(theirs.root), "--count", "2", sim=theirs.root)
    assert r.returncode == 5 and "owned by uid" in one_line(r), r.stderr
    assert leak.exists()  # the user's records stay


def test_root_resets_its_own_host_and_a_fresh_one(base):
    host = SimHost.init(base / "mine", gpus=2, memory=8 * GiB)
    host.leak(1, GiB)
    r = gs("sim", "init", str(host.root), "--count", "3", "--json", sim=host.root)
    assert r.returncode == 0, r.stderr
    assert not list(host.alloc.iterdir()) and sorted(p.name for p in host.dev.iterdir()) == [
        "nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidiactl"]
    assert oct(host.dev.stat().st_mode & 0o777) == "0o755" and oct((host.root / "host.json").stat().st_mode & 0o777) \
        == "0o644"
    r = gs("sim", "init", str(base / "new" / "deeper"), "--count", "1", sim=base / "new" / "deeper")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("folder", ["alloc", "dev"])
def test_status_never_follows_another_users_link_for_alloc_or_dev(theirs, roots, other_user, folder):
    """A ``dev`` linked to /dev would make real GPUs' holders pass for simulated ones (and clear
    targets); an ``alloc`` link would make status collect root's files and write markers there."""
    replace_with_link(theirs.root / folder, "/dev" if folder == "dev" else roots, other_user)
    before = {p.name: p.stat().st_mtime_ns for p in roots.iterdir()}
    r = gs("status", "--json", sim=theirs.root)
    if folder == "dev":
        assert r.returncode == 3 and "symbolic link owned by uid" in one_line(r), r.stderr
    else:
        doc = json.loads(r.stdout)
        assert all(g["memory"] is None and "symbolic link owned by uid" in g["error"] for g in doc["gpus"]), doc
    assert {p.name: p.stat().st_mtime_ns for p in roots.iterdir()} == before


def test_a_host_folder_that_is_another_users_link_is_refused(base, theirs, other_user):
    link = base / "alias"
    link.symlink_to(theirs.root)
    give(link, other_user)
    r = gs("status", sim=link)
    assert r.returncode == 3 and "symbolic link owned by uid" in one_line(r)
    mine = base / "mine-alias"
    mine.symlink_to(theirs.root)  # root's own link: followed
    assert gs("status", "--json", sim=mine).returncode == 0


@pytest.mark.parametrize("name", ["memory.lock", "dev/nvidia0", "dev/nvidiactl"])
def test_sim_hold_never_hangs_on_a_fifo(theirs, other_user, name):
    path = theirs.root / name
    path.unlink()
    os.mkfifo(path)
    give(path, other_user)
    t0 = time.monotonic()
    r = gs("sim", "hold", "--gpus", "0", "--memory", "1GiB", sim=theirs.root, timeout=30)
    assert r.returncode in (5, 6), (r.stdout, r.stderr)
    assert "FIFO" in one_line(r)
    assert time.monotonic() - t0 < 20


def test_a_dead_marker_that_is_a_fifo_is_not_waited_on(base):
    host = SimHost.init(base / "h", gpus=1, memory=8 * GiB, release_delay=0.2)
    (host.alloc / "g0.gone.json").write_text(json.dumps({"gpu": 0, "pid": 1, "start_ticks": 0, "bytes": GiB,
                                                         "kind": "compute"}))
    os.mkfifo(host.alloc / "g0.gone.dead")
    r = gs("status", "--json", sim=host.root, timeout=20)
    assert r.returncode == 0 and json.loads(r.stdout)["gpus"][0]["memory"]["used"] == GiB  # being released
