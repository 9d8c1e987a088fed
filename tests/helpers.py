"""Helpers shared by the tests: the CLI as a subprocess, awaiting conditions, holder handles."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from gpuslate.bench.experiment import POINT_SCHEMA, write_json_atomic
from gpuslate.proc.procfs import ProcessId, read_stat
from gpuslate.proc.signals import send_signal
from gpuslate.proc.tree import ProcTable

if TYPE_CHECKING:
    from gpuslate.gpu.simhost.host import SimHost
    from gpuslate.units.store import UnitStore
    from gpuslate.units.unit import Unit

GiB = 1024**3
SRC = str(Path(__file__).resolve().parents[1] / "src")


def gpuslate_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def count_host_opens(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often, from now on, a GPU backend is opened by a host context, the host lock acquired
    and an audit log opened (the counts go up as it happens)."""
    from gpuslate.host import audit, lock, session  # lazy: startup

    counts = {"backend": 0, "lock": 0, "audit": 0}

    def count(key: str, real: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*a: object, **k: object) -> object:
            counts[key] += 1
            return real(*a, **k)
        return wrapper

    monkeypatch.setattr(session, "open_backend", count("backend", session.open_backend))
    monkeypatch.setattr(lock.HostLock, "acquire", count("lock", lock.HostLock.acquire))
    monkeypatch.setattr(audit.AuditLog, "__init__", count("audit", audit.AuditLog.__init__))
    return counts


def unit_records() -> UnitStore:
    """The unit records of the state folder this process's environment names, as a Host opened
    here finds it (``GPUSLATE_STATE_DIR``, else ``$GPUSLATE_SIM/state``)."""
    from gpuslate.api import Host  # lazy: startup (a test module that needs no units loads none)
    from gpuslate.units.store import UnitStore  # lazy: startup

    with Host.open() as host:
        return UnitStore.of(host)


def kill_leftovers(host: SimHost, units: Sequence[Unit]) -> None:
    """SIGKILL every process of ``units`` and every live holder on the simulated ``host`` (all
    started by the test), each by exact identity; then release the units' fences (the host's
    cgroup tree is shared: leave nothing in it)."""
    idents: set[ProcessId] = set()
    table = ProcTable()
    for unit in units:
        idents.update(st.ident for st in unit.members(table))
    for held in host.held():
        r = held.record
        if held.alive and r.pid is not None and r.pid != os.getpid():
            idents.add(ProcessId(r.pid, r.start_ticks))
    for ident in idents:
        send_signal(ident, signal.SIGKILL)
    for unit in units:
        unit.fence.release(wait=10.0)  # init may take seconds to reap the killed processes




USER_MARKER = "gpuslate test user, removed by the tests"


def end_what_this_test_started() -> None:
    """SIGKILL every process this test started that still runs, found by the markers it inherited
    (leakcheck.py): for a finalizer of processes that leave the test's process groups (what a
    supervisor loop starts with ``setsid``), one of which may be starting as the loop is killed."""
    import leakcheck  # lazy: startup (a plugin module, imported by conftest.py before any test)

    run, node = os.environ.get(leakcheck.RUN), os.environ.get(leakcheck.NODE)
    if run and node:
        leakcheck.end(leakcheck.known(run, node), run)


def per_worker(name: str) -> str:
    """``name`` for this test process: under pytest-xdist each worker has its own (``name-gw0``),
    so that one worker removing its user at the end of a module never pulls it from under another
    worker's tests."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"{name}-{worker}" if worker else name


def unavailable(why: str) -> None:
    """Skip a test that needs what this machine lacks; in CI (``CI=true``), which installs what the
    tests need, fail instead, so that a missing tool never hides a test."""
    (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(why)


@contextmanager
def throwaway_user(name: str) -> Iterator[pwd.struct_passwd]:
    """A second user called ``name``, created for the caller and removed afterwards (as is one an
    earlier run left behind); someone's own user of that name is used and never removed. Needs root
    and ``useradd``."""
    if os.geteuid() != 0:
        unavailable("needs root to create a second user")
    try:
        existing = pwd.getpwnam(name)
    except KeyError:
        existing = None
    if existing is not None and existing.pw_gecos != USER_MARKER:
        yield existing
        return
    if existing is None:
        if not shutil.which("useradd"):
            unavailable("useradd is not available to create a second user")
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--comment", USER_MARKER,
                        name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def program_named(name: str, root: Path) -> str:
    """An interpreter that *is* the program ``name`` as the kernel sees it (``/proc/PID/exe``
    ends in ``/name``), for tests of what a process runs as opposed to what it calls itself
    (``--title`` renames a process; it does not make it a GPU daemon or an sshd).
    A copy of this interpreter with this virtual environment's packages, made once under
    ``root``."""
    exe = root / "bin" / name
    if not exe.exists():
        real = Path(os.path.realpath(sys.executable))
        (root / "bin").mkdir(parents=True, exist_ok=True)
        site = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        lib = root / "lib" / site.parent.name
        lib.mkdir(parents=True, exist_ok=True)
        if not (lib / "site-packages").exists():
            (lib / "site-packages").symlink_to(site)
        (root / "pyvenv.cfg").write_text(f"home = {real.parent}\ninclude-system-site-packages = false\n")
        tmp = exe.with_suffix(".tmp")
        shutil.copy2(real, tmp)
        os.replace(tmp, exe)
    return str(exe)


def wait_for(cond: Callable[[], object], timeout: float = 10.0, interval: float = 0.005) -> object:
    """Await a condition (no fixed sleeps): return its first truthy value or fail."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {cond}")
        time.sleep(interval)


class Holder:
    def __init__(self, proc: subprocess.Popen[str], ready: dict) -> None:
        self.proc = proc
        self.pid: int = ready["pid"]
        self.workers: list[int] = ready["workers"]
        self.ready = ready  # the whole ready line (``sim mps``: its ``control`` daemon's pid too)
        self.pgid = os.getpgid(self.pid)

    @property
    def pids(self) -> list[int]:
        return [self.pid, *self.workers]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        # orphaned workers are in the same group; these lines cover any left outside
        for pid in self.workers:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass






def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuslate ARGS``, its stdin ``input`` or /dev/null (never the terminal pytest may run on: a
    command that signals asks there)."""
    return subprocess.run([sys.executable, "-m", "gpuslate", *args], capture_output=True, text=True,
                          env=gpuslate_env(env), timeout=timeout, input=input,
                          stdin=subprocess.DEVNULL if input is None else None)




def is_gone(pid: int) -> bool:
    """Gone, or a true zombie (a leader thread that exited while another runs is not gone)."""
    st = read_stat(pid)
    return st is None or st.has_exited


def experiment_folder(tmp_path: Path, failed: int = 0) -> Path:
    """An experiment folder with finished points (no server): two deployments, two levels, two repeats."""
    def stat(v: float) -> dict[str, float]:
        return {"mean": v, "p50": v, "p90": v, "p99": v}

    out = tmp_path / "exp"
    deps = [{"name": "base", "role": "baseline", "command": ["serve"]},
            {"name": "spec", "role": "speculative", "command": ["serve", "--spec"]}]
    write_json_atomic(out / "experiment.json", {"spec": {
        "name": "x", "path": "x.toml", "deployments": deps, "levels": [1, 2], "repeats": 2, "time_scale": 1.0}})
    figs = {("base", 1): (100, 104), ("base", 2): (200, 204), ("spec", 1): (130, 128), ("spec", 2): (150, 152)}
    for (dep, c), values in figs.items():
        for r, thr in enumerate(values):
            write_json_atomic(out / "points" / f"{dep}-{c}-{r}.json", {
                "schema": POINT_SCHEMA, "deployment": dep, "role": "baseline" if dep == "base" else "speculative",
                "concurrency": c, "repeat": r, "engine": {"engine": "gpuslate-sim", "version": "0"},
                "level": {"completed": 8, "failed": failed, "output_tokens": 256, "input_tokens": 64,
                          "output_token_throughput": thr, "request_throughput": thr / 32,
                          "total_token_throughput": thr * 1.25, "ttft_ms": stat(10.0), "tpot_ms": stat(5.0),
                          "itl_ms": stat(5.0), "e2e_ms": stat(100.0), "accept_length": None,
                          "tokens_estimated": False}})
    return out


#: a Python program whose main thread ends (pthread_exit) after ``SETUP`` ran, while a second thread
#: keeps the process, and what it opened, alive until its stdin closes (or a signal ends it); it prints
#: its pid and what ``SETUP`` left in ``report``
_LEADER_EXITS = r"""
import ctypes, json, os, sys, threading
report = None
{setup}
threading.Thread(target=sys.stdin.read, name="keeper").start()
print(json.dumps({{"pid": os.getpid(), "report": report}}), flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


class LeaderExited(NamedTuple):
    proc: subprocess.Popen[str]
    pid: int
    report: Any  # what the setup code put in ``report``


@contextmanager
def leader_exits(setup: str = "", env: dict[str, str] | None = None) -> Iterator[LeaderExited]:
    """A process whose main thread has exited while another runs: ``/proc/PID/stat`` says Z, its fds
    are in ``/proc/PID/task/TID/fd``; yielded once /proc shows it so, SIGKILLed and reaped after.
    ``setup`` runs first (Python: open files, listen on a port; may set ``report``)."""
    p = subprocess.Popen([sys.executable, "-c", _LEADER_EXITS.format(setup=setup)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=gpuslate_env(env))
    try:
        ready = json.loads(p.stdout.readline())  # type: ignore[union-attr]
        assert ready["pid"] == p.pid
        wait_for(lambda: (st := read_stat(p.pid)) is not None and st.leader_exited)
        yield LeaderExited(p, p.pid, ready["report"])
    finally:
        p.kill()
        p.wait(10)
