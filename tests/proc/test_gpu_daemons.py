"""Telling GPU daemons by their program, and the MPS pipe folder from a real process's environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import pytest

from gpuslate.proc import daemons
from gpuslate.proc.daemons import (
    MPS_DEFAULT_PIPE,
    DaemonWatch,
    Env,
    Prover,
    daemon_program,
    env_value,
    pipe_of,
    read_client_pipe,
    read_daemon,
    read_server_pipe,
    why_unproven,
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
    wait_for(lambda: _runs(p.pid, os.path.realpath(exe)), timeout=10)
    return p


def _runs(pid: int, exe: str) -> bool:
    """``pid`` runs ``exe``, its exec done: the kernel shows the new program a moment before it has set
    up the environment (``/proc/PID/environ`` then reads empty)."""
    if read_exe(pid) != exe:
        return False
    with open(f"/proc/{pid}/environ", "rb") as f:
        return bool(f.read(1))


def test_pipe_folders_of_real_processes(tmp_path):
    client = _sleeper({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    plain = _sleeper({"PATH": "/usr/bin"})
    try:
        assert read_client_pipe(client.pid) == str(tmp_path / "pipe")
        assert read_client_pipe(plain.pid) == MPS_DEFAULT_PIPE
        # a server without the variable: its parent's (the control daemon's); a parent that names none uses
        # the default, one whose environment is written over (pytest-xdist's workers retitle themselves) is unknown
        assert read_server_pipe(plain.pid, client.pid) == str(tmp_path / "pipe")
        assert read_server_pipe(client.pid, plain.pid) == str(tmp_path / "pipe")
        assert read_server_pipe(plain.pid, plain.pid) == MPS_DEFAULT_PIPE
        assert read_server_pipe(plain.pid, 2**22 + 7) is None
        assert read_client_pipe(2**22 + 7) is None  # no such process: unknown
    finally:
        for p in (client, plain):
            p.kill()
            p.wait()


PAIR = r"""
import os, sys
control, server = sys.argv[1], sys.argv[2]
os.setsid()  # as nvidia-cuda-mps-control -d daemonizes
pid = os.fork()
if pid == 0:
    os.execv(server, ["nvidia-cuda-mps-server", "60"])
print(pid, flush=True)
os.execv(control, ["nvidia-cuda-mps-control", "60"])
"""


def _programs(folder) -> tuple[str, str]:
    """Root's copies of ``sleep`` named as the MPS control daemon and server, in ``folder``."""
    folder.mkdir(exist_ok=True)
    out = []
    for name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        shutil.copy(SLEEP, folder / name)
        (folder / name).chmod(0o755)
        out.append(str(folder / name))
    return out[0], out[1]


def _pair(control: str, server: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """A control daemon (a session of its own) and the server it started, as a real one is; both running."""
    p = subprocess.Popen([sys.executable, "-c", PAIR, control, server], stdout=subprocess.PIPE, text=True,
                         env={**env, "PATH": "/usr/bin:/bin"})
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    wait_for(lambda: _runs(pid, server) and _runs(p.pid, control), timeout=10)
    return p, pid


def _end(p: subprocess.Popen[Any], *pids: int) -> None:
    for pid in (*pids, p.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a system program")
def test_read_daemon_checks_the_program_file_and_watch_remembers_only_non_daemons(tmp_path, monkeypatch):
    control, server = _programs(tmp_path / "bin")
    p, pid = _pair(control, server, {})
    try:
        assert read_daemon(pid) == "nvidia-cuda-mps-server" and read_daemon(p.pid) == "nvidia-cuda-mps-control"
        os.chmod(server, 0o777)  # anyone may write it: no system program
        assert read_daemon(pid) is None
        os.chmod(server, 0o755)
        watch = DaemonWatch(exclude=[1])
        assert watch([pid, os.getpid(), 1]) == {pid: "nvidia-cuda-mps-server"}
        reads: list[int] = []
        proofs: list[int] = []
        real_read, real_prove = daemons.exe_daemon, daemons.Prover.unproven
        monkeypatch.setattr(daemons, "exe_daemon", lambda x: reads.append(x) or real_read(x))
        monkeypatch.setattr(daemons.Prover, "unproven",
                            lambda self, x, prog: proofs.append(x) or real_prove(self, x, prog))
        assert watch([pid, os.getpid()]) == {pid: "nvidia-cuda-mps-server"}
        assert reads == [] and proofs == []  # its identity read again, its proof kept; the other not read again
        assert DaemonWatch()([pid]) == {pid: "nvidia-cuda-mps-server"} and proofs == [pid]  # a new wait proves again
    finally:
        _end(p, pid)
    wait_for(lambda: read_daemon(pid) is None)  # gone (SIGKILL takes a moment)


def _why(pid: int) -> str | None:
    return Prover().unproven(pid, "nvidia-cuda-mps-server")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a system program")
def test_a_server_started_by_its_control_daemon_from_root_programs_is_proven(tmp_path):
    control, server = _programs(tmp_path / "bin")
    p, pid = _pair(control, server, {"CUDA_MPS_PIPE_DIRECTORY": "/run/mps", "app.config": "1"})
    try:
        f = Prover().facts(pid, "nvidia-cuda-mps-server")
        assert (f.system_file, f.unchanged, f.uids, f.env, f.foreign, f.tracer, f.parent_control) == \
            (True, True, (0, 0, 0, 0), Env.CLEAN, "", 0, True)
        assert why_unproven(f) is None
    finally:
        _end(p, pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a system program")
@pytest.mark.parametrize("attack", ["preload", "audit", "library", "parent", "replaced", "folder", "written over",
                                    "hard link"])
def test_a_daemon_look_alike_is_never_proven(tmp_path, attack):
    """Issue 32: root's program run with code of someone else's in it (LD_PRELOAD, LD_AUDIT, a library
    found first through LD_LIBRARY_PATH in a folder another user owns), not started by the control
    daemon, run from a file replaced since or from a folder another user may change, or with its
    environment written over: each is a reason, so its memory is never the host's baseline."""
    control, server = _programs(tmp_path / "bin")
    env: dict[str, str] = {}
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6", "/usr/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6")
                if os.path.exists(p))
    if attack == "preload":
        env["LD_PRELOAD"] = libc  # even a system library: the variable is the fact
    elif attack == "audit":
        env["LD_AUDIT"] = "/nonexistent/audit.so"
    elif attack == "library":  # a copy of libc that the loader finds first, in a folder of another user's
        lib = tmp_path / "lib"
        lib.mkdir()
        shutil.copy(libc, lib / "libc.so.6")
        os.chown(lib, 65534, -1)
        os.chown(lib / "libc.so.6", 65534, -1)
        env["LD_LIBRARY_PATH"] = str(lib)
    if attack == "hard link":  # root's very file, linked from a folder another user owns, run from there
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.link(server, theirs / "nvidia-cuda-mps-server")
        os.chown(theirs, 65534, -1)
        server = str(theirs / "nvidia-cuda-mps-server")
    p: subprocess.Popen[Any]
    if attack == "parent":  # started by someone else than the control daemon
        p = subprocess.Popen([server, "60"], env={"PATH": "/usr/bin"})
        pid = p.pid
        wait_for(lambda: _runs(pid, server), timeout=10)
    else:
        p, pid = _pair(control, server, env)
    try:
        if attack == "replaced":
            shutil.copy(SLEEP, str(server) + ".new")
            os.replace(str(server) + ".new", server)
        elif attack == "folder":
            (tmp_path / "bin").chmod(0o777)
        elif attack == "written over":  # the environment area zeroed, as a title's NUL padding leaves it
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            start, end = int(fields[47]), int(fields[48])
            with open(f"/proc/{pid}/mem", "r+b") as mem:  # root: as the process itself would write it
                mem.seek(start)
                mem.write(b"\0" * (end - start))
        why = _why(pid)
        expected = {"preload": "LD_PRELOAD or LD_AUDIT", "audit": "LD_PRELOAD or LD_AUDIT",
                    "library": f"it runs code from {tmp_path / 'lib' / 'libc.so.6'}, no system file",
                    "parent": "its parent is not the nvidia-cuda-mps-control",
                    "replaced": "its program file was replaced or deleted", "folder": "not root's in a folder",
                    "written over": "its environment is written over",
                    "hard link": "not root's in a folder"}[attack]
        assert why is not None and expected in why, why
        assert DaemonWatch()([pid]) == {}
    finally:
        (tmp_path / "bin").chmod(0o755)
        _end(p, pid)
