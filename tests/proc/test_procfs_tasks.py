"""A process lives while any of its threads does (issue 24): a leader thread that exited
(``pthread_exit``) leaves ``/proc/PID/stat`` saying Z for a process that runs; its program,
command line, environment and fds are read from a live thread. A true zombie has exited.
Real processes, and a fake /proc for the states no test can make a thread take at will."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuslate.proc import procfs
from gpuslate.proc.procfs import is_alive, live_task, open_image_file, read_info, read_stat
from gpuslate.proc.tree import ProcTable
from helpers import leader_exits, wait_for


def test_a_process_whose_leader_exited_lives_and_shows_its_facts_from_a_thread():
    with leader_exits("import time", env={"MARK_24": "leader-exits"}) as p:
        with open(f"/proc/{p.pid}/stat") as f:
            assert f.read().rsplit(")", 1)[1].split()[0] == "Z"  # what /proc says of the leader
        assert os.listdir(f"/proc/{p.pid}/fd") == []  # and its fd table: empty
        st = read_stat(p.pid)
        assert st is not None and not st.has_exited and st.leader_exited and st.state in "RS"
        assert st.live_task != p.pid and st.image_dir == f"/proc/{p.pid}/task/{st.live_task}"
        assert is_alive(st.ident)
        table = ProcTable()
        table.load_all()
        assert table.exe(p.pid) == os.path.realpath(sys.executable)  # its program: no "unknown program"
        assert table.argv(p.pid)[:2] == (sys.executable, "-c")
        assert read_info(p.pid).cmdline[:2] == [sys.executable, "-c"]
        fd = open_image_file(p.pid, "environ")
        try:
            assert b"MARK_24=leader-exits" in os.read(fd, 1 << 20)
        finally:
            os.close(fd)


def test_the_state_of_a_process_whose_leader_exited_is_its_threads():
    """Stopped (SIGSTOP stops every thread): T, so clear knows SIGTERM stays pending."""
    with leader_exits() as p:
        os.kill(p.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: read_stat(p.pid).state == "T")
            assert not read_stat(p.pid).has_exited
        finally:
            os.kill(p.pid, signal.SIGCONT)
        wait_for(lambda: read_stat(p.pid).state in "RS")


def test_a_true_zombie_has_exited_and_names_its_parent():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: read_stat(child.pid).state == "Z")  # not reaped: a zombie of this process
        st = read_stat(child.pid)
        assert st.has_exited and not st.leader_exited and st.ppid == os.getpid()
        assert live_task(child.pid) is None and not is_alive(st.ident)
        assert procfs.zombie_reason(st.ppid).endswith(f"(PID {os.getpid()}) has not reaped it")
    finally:
        child.wait()


def test_kill_of_the_process_ends_every_thread():
    with leader_exits() as p:
        ident = read_stat(p.pid).ident
        os.kill(p.pid, signal.SIGKILL)
        p.proc.wait(10)
        assert not is_alive(ident)


def _fake_task(root: Path, pid: int, tid: int, state: str) -> None:
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{tid} (py (x)) {state} 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 20 0 2 0 100 0 0\n")


@pytest.mark.parametrize(("states", "expected"), [
    ("ZS", "S"), ("ZST", "S"), ("ZTD", "D"), ("ZTt", "t"), ("ZTT", "T"), ("ZRS", "R"), ("ZX", None), ("Z", None),
    ("ZYT", "Y"),  # a letter not known here: not stopped, since one thread is not
])
def test_the_state_from_threads_is_the_most_telling(tmp_path, monkeypatch, states, expected):
    """D if any thread is in D (it holds the exit up), stopped only when every live thread is."""
    pid = 50
    for i, s in enumerate(states):
        _fake_task(tmp_path, pid, pid + i, s)
    (tmp_path / str(pid) / "stat").write_text((tmp_path / str(pid) / "task" / str(pid) / "stat").read_text())
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    st = read_stat(pid)
    assert st.state == (expected or "Z") and st.has_exited == (expected is None)
    assert (st.live_task is not None) == (expected is not None)


def test_a_leader_with_many_threads_costs_a_bounded_read(tmp_path, monkeypatch):
    """Beyond MAX_TASKS_READ threads only a first live one is looked for, not the whole list."""
    pid = 7
    monkeypatch.setattr(procfs, "MAX_TASKS_READ", 4)
    _fake_task(tmp_path, pid, pid, "Z")
    for tid in range(8, 20):
        _fake_task(tmp_path, pid, tid, "X")
    _fake_task(tmp_path, pid, 30, "S")
    _fake_task(tmp_path, pid, 31, "D")  # past the first live one beyond the bound: not read
    (tmp_path / str(pid) / "stat").write_text((tmp_path / str(pid) / "task" / str(pid) / "stat").read_text())
    monkeypatch.setattr(procfs, "PROC", str(tmp_path))
    monkeypatch.setattr(os, "listdir", lambda p, real=os.listdir: sorted(real(p), key=int))
    assert live_task(pid) == (30, "S")
