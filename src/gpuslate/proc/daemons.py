"""GPU daemons: NVIDIA's own programs that hold GPUs for the whole host, told apart by what they run.

A process is a GPU daemon when the program it runs (``/proc/PID/exe``, which it
cannot rewrite) is a system program (root's file, writable by no one else:
:func:`~gpuslate.proc.procfs.read_exe_is_system`) named as one of
:data:`GPU_DAEMONS`. Its title, argv or a user's own copy of a program named so
prove nothing: anyone can copy a program to ``~/bin/nvidia-cuda-mps-server``,
only root can make that copy root's.

Why it matters: ``clear`` spares GPU daemons unless ``--include-handles``, and
the memory a spared daemon holds is the host's baseline, not a job's (see
:mod:`gpuslate.host.daemons`). The one daemon that holds memory is the CUDA MPS
server (``nvidia-cuda-mps-server``, 66 MiB per GPU when idle on an H200 with
driver 580), started by the MPS control daemon (``nvidia-cuda-mps-control -d``)
for the first client of a user. Its clients find the control daemon through
``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), read here from the
environment a process started with (bounded; unknown when it cannot be read).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from .environ import intact
from .procfs import PROC, image_dir, open_image_file, read_exe, read_exe_is_system, read_stat

#: GPU daemons spared unless --include-handles, whatever they hold
GPU_DAEMONS = frozenset({
    "nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-smi", "nvidia-fabricmanager", "nvidia-dcgm",
})
#: the MPS server: one per user at a time, it holds a context on every GPU its clients use
MPS_SERVER = "nvidia-cuda-mps-server"
#: the MPS control daemon, the server's parent
MPS_CONTROL = "nvidia-cuda-mps-control"
#: where MPS clients and the control daemon meet, and its default
MPS_PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"
#: the most of one process's environment that is read (it is rarely above a few KiB)
MAX_ENVIRON = 256 * 1024


def daemon_program(exe: str | None, is_system: bool) -> str | None:
    """The GPU daemon a process is, from its program's path and whether that file is a
    system program; ``None`` for every other process (and for an unreadable program)."""
    if exe is None or not is_system:
        return None
    prog = exe.removesuffix(" (deleted)").rsplit("/", 1)[-1]
    return prog if prog in GPU_DAEMONS else None


def exe_daemon(pid: int) -> str | None:
    """The GPU daemon that ``/proc/PID/exe`` is (its file is checked only when its name is one)."""
    exe, image = read_exe(pid), None
    if exe is None:  # a leader thread that exited while another lives: read the program through that one
        image = image_dir(pid)
        exe = read_exe(pid, image) if image != f"{PROC}/{pid}" else None
    prog = daemon_program(exe, True)
    return prog if prog is not None and read_exe_is_system(pid, image) else None


def read_daemon(pid: int) -> str | None:
    """The GPU daemon process ``pid`` runs now; ``None`` when it is none, has exited
    (a zombie runs nothing) or cannot be read."""
    st = read_stat(pid)
    if st is None or st.has_exited:
        return None
    return exe_daemon(pid)


class DaemonWatch:
    """Which of the pids a GPU lists are GPU daemons, read from ``/proc`` each time it is
    asked, for the polls of a wait; ``exclude`` are never daemons here (the targets of a
    clear: a daemon that is a target is no spared baseline).

    Only "not a daemon" is remembered (by pid, for the watch's life): a pid reused since
    by a daemon is then counted as an ordinary holder, the safe side; a daemon is read
    again every time, so a reused daemon pid is never taken for one."""

    def __init__(self, exclude: Iterable[int] = ()) -> None:
        self._not = set(exclude)

    def __call__(self, pids: Collection[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for pid in pids:
            if pid in self._not:
                continue
            prog = read_daemon(pid)
            if prog is None:
                self._not.add(pid)
            else:
                out[pid] = prog
        return out


def env_value(environ: bytes, name: str) -> str | None:
    """The value of ``name`` in a NUL-separated environment block, ``None`` when absent."""
    key = name.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return entry[len(key):].decode("utf-8", "replace")
    return None


def read_environ(pid: int) -> bytes | None:
    """The environment ``pid`` started with (``/proc/PID/environ``); ``None`` when it cannot be
    read, is larger than :data:`MAX_ENVIRON`, or is empty (a kernel thread, a zombie, or a
    process whose title overwrote it: nothing can be concluded from it)."""
    try:  # a live thread's where the leader thread exited
        with open(open_image_file(pid, "environ"), "rb") as f:
            data = f.read(MAX_ENVIRON + 1)
    except OSError:
        return None
    return data if data and len(data) <= MAX_ENVIRON else None


def pipe_of(environ: bytes | None, *, default: bool) -> str | None:
    """The MPS pipe folder an environment names (normalised); with ``default``, the one an
    environment without it uses. ``None``: unknown: the environment cannot be read, or it is not
    as ``execve`` left it (a title written over it: :func:`~gpuslate.proc.environ.intact`), where a
    missing variable is no evidence of the default folder."""
    if environ is None or not intact(environ):
        return None
    value = env_value(environ, MPS_PIPE_VAR)
    if value:
        return os.path.normpath(value)
    return MPS_DEFAULT_PIPE if default else None


def read_client_pipe(pid: int) -> str | None:
    """The MPS pipe folder an MPS client connects through (its environment's, else the default)."""
    return pipe_of(read_environ(pid), default=True)


def read_server_pipe(pid: int, ppid: int | None) -> str | None:
    """The MPS pipe folder of an MPS server: named in its own environment, else in its
    parent's (the control daemon that started it, whose environment the user gave), else the
    default when the parent's environment can be read and names none."""
    own = pipe_of(read_environ(pid), default=False)
    if own is not None or ppid is None or ppid <= 1:
        return own
    return pipe_of(read_environ(ppid), default=True)
