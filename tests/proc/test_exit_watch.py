"""ExitWatch: waiting wakes when the whole process has exited, not when its leader thread has."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gpuslate.proc.procfs import read_stat
from gpuslate.proc.signals import ExitWatch, is_gone

# The main thread leaves with pthread_exit: the leader is a zombie while a second
# thread (like a CUDA context's teardown in a real server) still runs until stdin closes.
LEADER_EXITS_FIRST = r"""
import ctypes, sys, threading
threading.Thread(target=sys.stdin.read).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_exit_means_every_thread(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", LEADER_EXITS_FIRST], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    watch = ExitWatch()
    try:
        assert p.stdout.readline().strip() == "ready"
        _until(lambda: (st := read_stat(p.pid)) is not None and st.leader_exited)
        ident = read_stat(p.pid).ident
        watch.add(ident)
        if watch.exited(p.pid) is None:
            pytest.skip("no pidfds on this kernel")
        assert not is_gone(ident)  # /proc says Z for the leader: the process lives in its thread...
        t = time.monotonic()
        watch.wait(0.2, fallback=1.0)
        assert time.monotonic() - t >= 0.19 and watch.exited(p.pid) is False  # ...and the watch agrees
        p.stdin.close()  # the last thread ends
        t = time.monotonic()
        watch.wait(10.0, fallback=1.0)
        assert watch.exited(p.pid) is True and time.monotonic() - t < 5.0  # woken by the exit, not the timeout
        _until(lambda: is_gone(ident))
    finally:
        watch.close()
        p.kill()
        p.wait()


def test_gone_before_watching_and_reused_identity():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = read_stat(p.pid).ident
    p.wait()
    watch = ExitWatch()
    watch.add(ident)  # reaped already: nothing to wait for
    assert watch.exited(p.pid) is True
    watch.wait(5.0, fallback=1.0)  # returns at once: nothing is watched
    watch.close()


def test_wrong_start_time_is_not_watched():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ident = read_stat(p.pid).ident
        stale = ident._replace(start_ticks=ident.start_ticks - 1)  # the pid's previous owner
        watch = ExitWatch()
        watch.add(stale)
        assert watch.exited(p.pid) is True  # that process is gone; this one is not waited for
        watch.close()
    finally:
        p.kill()
        p.wait()


def test_terminate_without_pidfds_polls(monkeypatch):
    """Where pidfds are missing (old kernels, some sandboxes), waiting falls back to polling /proc."""
    from gpuslate.proc import signals
    from gpuslate.proc.terminate import Victim, terminate

    monkeypatch.setattr(signals, "_HAVE_PIDFD", False)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        victims = [Victim(read_stat(p.pid).ident, {"pid": p.pid}) for p in procs]
        t = time.monotonic()
        results = terminate(victims, grace=10, kill_wait=5, action="clear", run_id="r", audit=None)
        assert all(r.ended_by == "SIGTERM" for r in results) and time.monotonic() - t < 5
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_bug_on_the_early_thread_prints_nothing_and_is_redone(monkeypatch, capfd):
    """An unexpected error while the driver opens in the background is not printed there;
    the backend is opened again on the caller's thread."""
    import gpuslate.gpu.nvml as nvml

    calls: list[str] = []

    class Lib:
        def init(self) -> None:
            calls.append("init")

        def device_count(self) -> int:
            if len(calls) == 1:
                raise RuntimeError("a bug")
            return 0

    monkeypatch.setattr(nvml, "open_library", Lib)
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()
    backend = nvml.open_nvml()
    assert calls == ["init", "init"] and backend.read() == []
    assert "Traceback" not in capfd.readouterr().err
