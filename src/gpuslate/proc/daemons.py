"""GPU daemons: NVIDIA's own programs that hold GPUs for the whole host, told apart by what they run.

A process *runs* a GPU daemon when the program it runs (``/proc/PID/exe``, which
it cannot rewrite) is a system program (root's file, writable by no one else:
:func:`~gpuslate.proc.procfs.read_exe_is_system`) named as one of
:data:`GPU_DAEMONS`. Its title, argv or a user's own copy of a program named so
prove nothing: anyone can copy a program to ``~/bin/nvidia-cuda-mps-server``,
only root can make that copy root's. That is enough to *spare* it (``clear``
leaves it unless ``--include-handles``: sparing signals nothing).

It is not enough to call what it holds the host's (the baseline below): any user
can run root's program, with their own code in it (``LD_PRELOAD``) or with GPU
memory they allocated before an ``exec`` kept open. So a daemon's memory counts
as the host's only when the daemon is **proven** (:func:`why_unproven`, a pure
function of :class:`DaemonFacts` that :func:`daemon_facts` gathers):

* its program file is root's, writable by no one else, in folders only root can
  change (every folder from ``/`` root's and closed to others, a sticky one like
  ``/tmp`` allowed) and unchanged (the file at that path is the one it runs: not
  replaced, not deleted);
* the process runs as root or as the user NVIDIA documents for it
  (:data:`DAEMON_USERS`; the MPS server runs as the user of its clients, so any);
* nothing is preloaded into it: its environment reads, is as ``execve`` left it,
  and has no ``LD_PRELOAD`` or ``LD_AUDIT``; every executable mapping of
  ``/proc/PID/maps`` with a file is a system file as above (the libraries of
  ``/usr/lib``, ``/lib``, ``/usr/local/nvidia/lib64``: wherever only root can put
  one), none deleted; and no debugger is attached to it (``TracerPid``);
* an MPS server's parent is the MPS control daemon: a process running the MPS
  control daemon's proven program file (the control daemon starts every server).

Anything that cannot be read (another user's process seen by a non-root caller,
a process gone meanwhile) proves nothing. An unproven daemon is still spared; its
memory is held like any process's (``clear`` then reports the GPU not free and
names it).

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
import pwd
import stat
from collections.abc import Collection, Iterable
from enum import Enum
from typing import NamedTuple

from .environ import intact
from .procfs import PROC, image_dir, open_image_file, read_exe, read_exe_is_system, read_stat

#: GPU daemons spared unless --include-handles, whatever they hold
GPU_DAEMONS = frozenset({
    "nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-smi", "nvidia-fabricmanager", "nvidia-dcgm",
})
#: the MPS server: one per user at a time, it holds a context on every GPU its clients use
MPS_SERVER = "nvidia-cuda-mps-server"
#: the users (besides root) NVIDIA documents each daemon as running as; ``None``: any user (the MPS server
#: runs as the user of its clients; the control daemon as root, or as the one user of a single-user MPS)
DAEMON_USERS: dict[str, frozenset[str] | None] = {
    "nvidia-persistenced": frozenset({"nvidia-persistenced"}),  # nvidia-persistenced --user
    "nv-hostengine": frozenset({"nvidia-dcgm"}), "nvidia-dcgm": frozenset({"nvidia-dcgm"}),
    "nvidia-cuda-mps-server": None, "nvidia-cuda-mps-control": None,
}
#: environment variables that make the dynamic loader load code the program did not ask for
PRELOAD_VARS = (b"LD_PRELOAD=", b"LD_AUDIT=")
#: the most of /proc/PID/maps read (a daemon maps a few hundred regions; more is unknown)
MAX_MAPS = 4 << 20
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


class Env(str, Enum):
    """What a daemon's environment says of what the loader preloads into it."""

    CLEAN = "clean"  # read, as execve left it, no LD_PRELOAD or LD_AUDIT
    PRELOAD = "preload"  # LD_PRELOAD or LD_AUDIT in it
    WRITTEN_OVER = "written over"  # not as execve left it: what it held at exec is unknown
    UNREAD = "unread"  # cannot be read (another user's process for a non-root caller, gone)

    def __str__(self) -> str:
        return self.value


class DaemonFacts(NamedTuple):
    """What is known of one process that runs a GPU daemon's system program (``None``: unknown)."""

    program: str  # the daemon it runs (nvidia-cuda-mps-server)
    system_file: bool | None  # its program file root's, closed to others, in folders only root can change
    unchanged: bool | None  # the file at the program's path is the one it runs (not replaced, not deleted)
    uids: tuple[int, ...] | None  # real, effective, saved and filesystem uid
    allowed: frozenset[int] | None  # the uids it may run as besides root (None: any)
    env: Env
    foreign: str | None  # the first executable mapping that is no system file ("": none; None: unread)
    tracer: int | None  # the pid of a debugger attached to it (0: none; None: unread)
    parent_control: bool | None = True  # an MPS server's parent runs the proven MPS control program


def why_unproven(f: DaemonFacts) -> str | None:
    """Why ``f``'s process is not proven the daemon its program names (see the module doc), or
    ``None``: it is. Pure, total: every unknown fact is a reason."""
    if f.system_file is None or f.unchanged is None:
        return "its program file cannot be read from here"
    if not f.system_file:
        return "its program file is not root's in a folder only root can change"
    if not f.unchanged:
        return "its program file was replaced or deleted since it started"
    if f.uids is None:
        return "its user cannot be read"
    if f.allowed is not None and not all(u == 0 or u in f.allowed for u in f.uids):
        return f"it runs as uid {max(f.uids)}, not as root or the user NVIDIA documents for {f.program}"
    if f.env == Env.UNREAD:
        return "its environment cannot be read from here"
    if f.env == Env.WRITTEN_OVER:
        return "its environment is written over: what was preloaded into it is unknown"
    if f.env == Env.PRELOAD:
        return "LD_PRELOAD or LD_AUDIT in its environment"
    if f.foreign is None:
        return "its memory map cannot be read from here"
    if f.foreign:
        return f"it runs code from {f.foreign}, no system file"
    if f.tracer is None:
        return "whether a debugger is attached to it cannot be read"
    if f.tracer:
        return f"a debugger (pid {f.tracer}) is attached to it"
    if f.parent_control is None:
        return f"its parent cannot be read from here (the {MPS_CONTROL} that starts every server)"
    if not f.parent_control:
        return f"its parent is not the {MPS_CONTROL} (which starts every server)"
    return None


class Prover:
    """Gathers :class:`DaemonFacts` from ``/proc`` (:meth:`facts`) and decides (:meth:`unproven`);
    what it learns of folders and files (whose owner and mode only root can change) is kept
    for its life: one snapshot, one wait."""

    def __init__(self) -> None:
        self._dirs: dict[tuple[str, str], bool | None] = {}
        self._users: dict[str, int | None] = {}

    def facts(self, pid: int, program: str) -> DaemonFacts:
        """What ``/proc`` shows of process ``pid``, which runs ``program``'s system program."""
        image = image_dir(pid)
        root = f"{image}/root"
        exe = read_exe(pid, image if image != f"{PROC}/{pid}" else None)
        system_file = unchanged = None
        if exe is not None and not exe.endswith(" (deleted)"):
            ran = _stat(f"{image}/exe")
            here = _stat(root + exe, follow=False)
            if ran is not None and here is not None:
                unchanged = (ran.st_dev, ran.st_ino) == (here.st_dev, here.st_ino)
                folders = self._system_dir(root, os.path.dirname(exe))
                system_file = None if folders is None else folders and _system_file(here)
        elif exe is not None:
            system_file, unchanged = True, False
        status = _status(pid)
        uids = status.get("Uid")
        tracer = status.get("TracerPid")
        users = DAEMON_USERS.get(program, frozenset())
        allowed = None if users is None else frozenset(u for n in users if (u := self._uid(n)) is not None)
        parent: bool | None = True
        if program == MPS_SERVER:
            st = read_stat(pid)
            parent = None if st is None else self._is_control(st.ppid)
        return DaemonFacts(program, system_file, unchanged, tuple(uids) if uids else None, allowed,
                           _env_fact(pid), self._foreign(pid, root), tracer[0] if tracer else None, parent)

    def unproven(self, pid: int, program: str) -> str | None:
        """Why process ``pid`` (running ``program``'s system program) is not proven; None: it is."""
        return why_unproven(self.facts(pid, program))

    def _is_control(self, pid: int) -> bool | None:
        if pid <= 1:
            return False
        exe = read_exe(pid)
        if exe is None:
            return None
        if daemon_program(exe, True) != MPS_CONTROL or exe.endswith(" (deleted)"):
            return False
        root = f"{PROC}/{pid}/root"
        ran, here = _stat(f"{PROC}/{pid}/exe"), _stat(root + exe, follow=False)
        folders = self._system_dir(root, os.path.dirname(exe))
        if ran is None or here is None or folders is None:
            return None
        return folders and _system_file(here) and (ran.st_dev, ran.st_ino) == (here.st_dev, here.st_ino)

    def _uid(self, name: str) -> int | None:
        if name not in self._users:
            try:
                self._users[name] = pwd.getpwnam(name).pw_uid
            except KeyError:
                self._users[name] = None
        return self._users[name]

    def _system_dir(self, root: str, folder: str) -> bool | None:
        """Whether ``folder`` (absolute, as the process sees it under ``root``) and every folder above
        it are root's and closed to others (sticky ones allowed); None: one cannot be read."""
        key = (_root_key(root), folder)
        if key not in self._dirs:
            verdict: bool | None = True
            path = root
            for part in [""] + [p for p in folder.split("/") if p]:
                path = f"{path}/{part}" if part else path
                st = _stat(path, follow=not part)  # the root itself is a magic link to follow
                if st is None:
                    verdict = None
                    break
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or (
                        st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
                    verdict = False
                    break
            self._dirs[key] = verdict
        return self._dirs[key]

    def _foreign(self, pid: int, root: str) -> str | None:
        """The first executable mapping of ``pid`` whose file is no system file ("": none; None: unread)."""
        try:
            fd = open_image_file(pid, "maps")
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_MAPS + 1)
        except OSError:
            return None
        if len(data) > MAX_MAPS:
            return None
        checked: set[str] = set()
        for line in data.decode("utf-8", "surrogateescape").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or "x" not in fields[1] or not fields[5].startswith("/"):
                continue  # not executable, or no file ([vdso], anonymous)
            path = fields[5]
            if path in checked:
                continue
            checked.add(path)
            if path.endswith(" (deleted)"):
                return path
            here = _stat(root + path, follow=False)
            folders = self._system_dir(root, os.path.dirname(path))
            if here is None or folders is None:
                return None
            if not (folders and _system_file(here)):
                return path
        return ""


def _stat(path: str, *, follow: bool = True) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=follow)
    except OSError:
        return None


def _root_key(root: str) -> str:
    st = _stat(root)
    return f"{st.st_dev}:{st.st_ino}" if st is not None else root


def _system_file(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def _status(pid: int) -> dict[str, list[int]]:
    """The ``Uid`` and ``TracerPid`` lines of ``/proc/PID/status`` (absent: unread)."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            text = f.read(64 << 10).decode("ascii", "replace")
    except OSError:
        return {}
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "TracerPid"):
            try:
                out[key] = [int(v) for v in value.split()]
            except ValueError:
                continue
    return out


def _env_fact(pid: int) -> Env:
    environ = read_environ(pid)
    if environ is None:
        return Env.UNREAD
    if not intact(environ):
        return Env.WRITTEN_OVER
    if any(e.startswith(PRELOAD_VARS) for e in environ.split(b"\0")):
        return Env.PRELOAD
    return Env.CLEAN


class DaemonWatch:
    """Which of the pids a GPU lists are *proven* GPU daemons (see the module doc), read from
    ``/proc`` each time it is asked, for the polls of a wait; ``exclude`` are never daemons here
    (the targets of a clear: a daemon that is a target is no spared baseline).

    "Not a daemon" is remembered by pid, for the watch's life: a pid reused since by a daemon
    is then counted as an ordinary holder, the safe side. A daemon is proven once per identity
    (pid and start time, read again at every call: a reused pid is never taken for it) for the
    watch's life, one wait: the polls of a wait come every few milliseconds, and what a proof
    reads (its environment, its memory map, its parent) does not change under a daemon in that
    time unless the daemon itself loads code, which the cap per GPU bounds."""

    def __init__(self, exclude: Iterable[int] = ()) -> None:
        self._not = set(exclude)
        self._prover = Prover()
        self._proven: dict[tuple[int, int], str | None] = {}  # identity -> program, None: not proven

    def __call__(self, pids: Collection[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        for pid in pids:
            if pid in self._not:
                continue
            st = read_stat(pid)
            ident = (pid, st.start_ticks) if st is not None and not st.has_exited else None
            if ident is not None and ident in self._proven:
                prog = self._proven[ident]
                if prog is not None:
                    out[pid] = prog
                continue
            prog = exe_daemon(pid) if ident is not None else None
            if prog is None:
                self._not.add(pid)
                continue
            proven = self._prover.unproven(pid, prog) is None
            self._proven[ident] = prog if proven else None  # type: ignore[index]
            if proven:
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
