"""Telling GPU daemons by their program, and the MPS pipe folder from a real process's environment."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpuslate.proc import daemons
from gpuslate.proc.daemons import (
    MPS_DEFAULT_PIPE,
    DaemonWatch,
    daemon_program,
    env_value,
    pipe_of,
    read_client_pipe,
    read_daemon,
    read_server_pipe,
)
from gpuslate.proc.procfs import read_exe
from helpers import wait_for


def test_a_daemon_is_a_system_program_of_a_daemons_name():
    assert daemon_program("/usr/bin/nvidia-cuda-mps-server", True) == "nvidia-cuda-mps-server"
    assert daemon_program("/usr/bin/nvidia-cuda-mps-server (deleted)", True) == "nvidia-cuda-mps-server"
    assert daemon_program("/home/u/bin/nvidia-cuda-mps-server", False) is None  # a user's own copy
    assert daemon_program("/usr/bin/python3", True) is None
    assert daemon_program(None, True) is None


def test_environment_values_and_pipe_folders():
    env = b"A=1\0CUDA_MPS_PIPE_DIRECTORY=/run/mps//\0B=2"
    assert env_value(env, "A") == "1" and env_value(env, "CUDA_MPS") is None
    assert pipe_of(env, default=False) == "/run/mps"
    assert pipe_of(b"A=1", default=True) == MPS_DEFAULT_PIPE and pipe_of(b"A=1", default=False) is None
    assert pipe_of(None, default=True) is None
    # written over by a title (its tail and NUL padding): a missing variable is no sign of the default
    assert pipe_of(b"duler_TP0\0\0\0\0B=2\0", default=True) is None
    assert pipe_of(b"app.config=1\0", default=True) == MPS_DEFAULT_PIPE


SLEEP = shutil.which("sleep") or "/bin/sleep"


def _sleeper(env: dict[str, str], exe: str = SLEEP) -> subprocess.Popen[bytes]:
    """``exe 60`` with ``env``, once it runs it (before its exec, /proc shows this process's environment)."""
    p = subprocess.Popen([exe, "60"], env=env, start_new_session=True)
    wait_for(lambda: read_exe(p.pid) == os.path.realpath(exe), timeout=10)
    return p


def test_pipe_folders_of_real_processes(tmp_path):
    client = _sleeper({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    plain = _sleeper({"PATH": "/usr/bin"})
    try:
        assert read_client_pipe(client.pid) == str(tmp_path / "pipe")
        assert read_client_pipe(plain.pid) == MPS_DEFAULT_PIPE
        # a server without the variable: its parent's (the control daemon); this test process is the parent
        expected = os.path.normpath(os.environ["CUDA_MPS_PIPE_DIRECTORY"]) if os.environ.get(
            "CUDA_MPS_PIPE_DIRECTORY") else MPS_DEFAULT_PIPE
        assert read_server_pipe(plain.pid, os.getpid()) == expected
        assert read_server_pipe(client.pid, os.getpid()) == str(tmp_path / "pipe")
        assert read_client_pipe(2**22 + 7) is None  # no such process: unknown
    finally:
        for p in (client, plain):
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a system program")
def test_read_daemon_checks_the_program_file_and_watch_remembers_only_non_daemons(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia-cuda-mps-server"
    shutil.copy(SLEEP, exe)
    p = _sleeper({}, str(exe))
    try:
        assert read_daemon(p.pid) == "nvidia-cuda-mps-server"
        exe.chmod(0o777)  # anyone may write it: no system program
        assert read_daemon(p.pid) is None
        exe.chmod(0o755)
        watch = DaemonWatch(exclude=[1])
        assert watch([p.pid, os.getpid(), 1]) == {p.pid: "nvidia-cuda-mps-server"}
        calls: list[int] = []
        real = daemons.read_daemon
        monkeypatch.setattr(daemons, "read_daemon", lambda pid: calls.append(pid) or real(pid))
        assert watch([p.pid, os.getpid()]) == {p.pid: "nvidia-cuda-mps-server"}
        assert calls == [p.pid]  # the daemon is read again, the ordinary process is not
    finally:
        p.kill()
        p.wait()
    assert read_daemon(p.pid) is None  # gone
