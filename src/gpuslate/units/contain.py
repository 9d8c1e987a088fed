"""How a unit is fenced in at launch, and the cgroup operations its fence uses later.

Every unit runs in its own session and process group. Where the host allows,
it also gets a cgroup of its own, so that a descendant that left the session
(``setsid`` after a double fork) still belongs to it:

* ``cgroup``: a child of gpuslate's own cgroup v2 (when that is writable,
  e.g. under a delegated systemd user slice or in a container with a
  writable cgroupfs); stopping it ends with ``cgroup.kill``;
* ``scope``: a transient ``systemd-run --user --scope`` unit;
* ``session``: neither is possible; the session, the process group, the
  descendants of the main process and the processes recorded at readiness.

A ``cgroup`` fence is made empty (``mkdir``) and joined by the unit's process
between its fork and its exec; meanwhile it looks like the empty cgroup of a unit
that ended, which :func:`collect_stale_cgroups` removes. Every gpuslate whose
cgroup is the same parent shares that folder, whatever its host lock (another
user, another state folder, a simulated host): so a launch holds a shared
``flock`` on the parent cgroup's folder from the ``mkdir`` until its process is
in (:func:`creating_cgroups`), and a collector collects only while it can take
that lock exclusively, else leaves it to the next one.

Which processes belong to a unit *later* (for ``down``, ``ps``, ``logs``,
``swap``) is the unit's fence object's business: see :mod:`.fence`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from ..options import Containment
from ..proc.procfs import read_cgroup, read_stat


def _cgroup2_mount() -> Path:
    """Where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on unified hosts,
    /sys/fs/cgroup/unified on hybrid ones (v1 controllers beside a v2 tree)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return Path(left.split()[4])
    except OSError:
        pass
    return Path("/sys/fs/cgroup")


CGROUP_ROOT = _cgroup2_mount()


class LaunchFence(NamedTuple):
    """How to start a unit fenced in; what it becomes afterwards is a :class:`.fence.Fence`."""

    kind: Containment  # cgroup | scope | session
    cgroup: str | None  # for kind cgroup: the path made for the unit (relative to CGROUP_ROOT)
    argv_prefix: list[str]  # for kind scope: systemd-run ...
    preexec: Callable[[], None] | None


def _cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.procs").exists() and (CGROUP_ROOT / "cgroup.controllers").exists()


def _parent_folder(lock: int) -> int | None:
    """This process's own cgroup folder (where its units' cgroups are made), opened and locked with
    ``lock`` (``fcntl.LOCK_SH``, ``fcntl.LOCK_EX | fcntl.LOCK_NB``); None where there is none to
    open, or the lock was not free."""
    if not _cgroup_v2():
        return None
    mine = read_cgroup(os.getpid())
    if mine is None:
        return None
    try:
        fd = os.open(CGROUP_ROOT / mine.lstrip("/"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, lock)
    except OSError:  # held (LOCK_NB), or flock refused by the file system
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def creating_cgroups() -> Iterator[None]:
    """While a unit's cgroup is made and its process moves in (:func:`choose_fence` through the
    spawn): no :func:`collect_stale_cgroups`, of this gpuslate or another, removes it meanwhile."""
    fd = _parent_folder(fcntl.LOCK_SH)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with it


def choose_fence(name: str, wanted: Containment = Containment.AUTO) -> tuple[LaunchFence, str | None]:
    """The strongest fence this host allows (or ``wanted``); with why a stronger one was not used."""
    notes: list[str] = []
    if wanted in (Containment.AUTO, Containment.CGROUP):
        fence, why = _own_cgroup(name)
        if fence:
            return fence, None
        notes.append(why)
    if wanted in (Containment.AUTO, Containment.SCOPE):
        fence, why = _systemd_scope(name)
        if fence:
            return fence, None
        notes.append(why)
    return LaunchFence(Containment.SESSION, None, [], None), "; ".join(n for n in notes if n) or None


def _own_cgroup(name: str) -> tuple[LaunchFence | None, str]:
    if not _cgroup_v2():
        return None, "no cgroup v2 hierarchy at /sys/fs/cgroup"
    mine = read_cgroup(os.getpid())
    if mine is None:
        return None, "own cgroup unknown"
    parent = CGROUP_ROOT / mine.lstrip("/")
    # moving a process between cgroups needs write access to the common ancestor's cgroup.procs
    if not (os.access(parent, os.W_OK) and os.access(parent / "cgroup.procs", os.W_OK)):
        return None, f"cgroup {mine} is not writable"
    child = parent / f"gpuslate-{name}-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as exc:
        return None, f"cannot create a cgroup under {mine}: {exc.strerror or exc}"
    procs = str(child / "cgroup.procs")

    def join() -> None:  # runs in the child between fork and exec: nothing it forks escapes
        with open(procs, "w") as f:
            f.write("0")

    rel = "/" + str(child.relative_to(CGROUP_ROOT))
    return LaunchFence(Containment.CGROUP, rel, [], join), ""


def _systemd_scope(name: str) -> tuple[LaunchFence | None, str]:
    exe = shutil.which("systemd-run")
    if exe is None:
        return None, "no systemd-run"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    if not (Path(runtime, "systemd", "private").exists() or Path(runtime, "bus").exists()) or not _cgroup_v2():
        return None, "no systemd user manager"
    try:  # the user manager may be there and still refuse (no lingering, no delegation)
        ok = subprocess.run([exe, "--user", "--scope", "--quiet", "--collect", "true"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        return None, "systemd-run --user --scope failed"
    prefix = [exe, "--user", "--scope", "--quiet", "--collect", f"--unit=gpuslate-{name}-{uuid.uuid4().hex[:8]}", "--"]
    return LaunchFence(Containment.SCOPE, None, prefix, None), ""


def discard_cgroup(cgroup: str | None, wait: float = 0.0) -> None:
    """Remove the unit's cgroup once it is empty; never blocks longer than ``wait``.

    A dead unit's processes stay in its cgroup as zombies until their parent
    reaps them, and a detached unit's parent is init, which may reap only
    every few seconds: so stopping does not wait for it, and
    :func:`collect_stale_cgroups` removes the cgroup later. A cgroup with live
    processes is never removed."""
    if not cgroup:
        return
    path = CGROUP_ROOT / cgroup.lstrip("/")
    deadline = time.monotonic() + wait
    delay = 0.001
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            try:
                if "populated 1" in (path / "cgroup.events").read_text() and not _only_zombies(path):
                    return  # live processes: the cgroup stays, and says who is left
            except OSError:
                return
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def collect_stale_cgroups() -> None:
    """Remove the leftover cgroups of units that have ended (empty ``gpuslate-*``
    cgroups beside the ones gpuslate creates), unless a launch is between creating
    one and moving its process in (:func:`creating_cgroups`, of any gpuslate that
    shares this parent, under whatever host lock): then the next call does it."""
    fd = _parent_folder(fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        return
    try:
        entries = [e for e in os.scandir(fd) if e.name.startswith("gpuslate-") and e.is_dir()]
        for e in entries:
            with contextlib.suppress(OSError):  # refused (EBUSY) while any process, zombies included, is inside
                os.rmdir(e.name, dir_fd=fd)
    except OSError:
        return
    finally:
        os.close(fd)


def _only_zombies(path: Path) -> bool:
    try:
        pids = [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return False
    return all((st := read_stat(p)) is None or st.has_exited for p in pids)


def cgroup_pids(cgroup: str | None) -> list[int]:
    """Processes of the cgroup and of every cgroup below it."""
    if not cgroup:
        return []
    top = CGROUP_ROOT / cgroup.lstrip("/")
    out: list[int] = []
    for dirpath, _dirs, files in os.walk(top):
        if "cgroup.procs" in files:
            try:
                out += [int(x) for x in Path(dirpath, "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pass
    return out


def cgroup_kill(cgroup: str | None) -> bool:
    """SIGKILL everything in the cgroup at once (Linux 5.14+); False when not available."""
    if not cgroup:
        return False
    try:
        with open(CGROUP_ROOT / cgroup.lstrip("/") / "cgroup.kill", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def gpuslate_cgroups(name: str) -> list[str]:
    """The cgroups gpuslate made for units named ``name`` (beside its own cgroup), relative to
    the mount: how a unit whose record is unreadable is still found."""
    if not _cgroup_v2():
        return []
    mine = read_cgroup(os.getpid())
    if mine is None:
        return []
    parent = CGROUP_ROOT / mine.lstrip("/")
    try:
        found = [e.name for e in os.scandir(parent) if e.is_dir() and e.name.startswith(f"gpuslate-{name}-")
                 and len(e.name) == len(f"gpuslate-{name}-") + 8]
    except OSError:
        return []
    return ["/" + str((parent / n).relative_to(CGROUP_ROOT)) for n in sorted(found)]
