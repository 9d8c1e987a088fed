"""Host facts about processes, read straight from ``/proc``.

gpuslate runs on Linux hosts with NVIDIA drivers, so it reads ``/proc`` itself
rather than going through psutil: fewer syscalls per process and no import
cost on the ``status`` path, which must stay close to the Python floor.

**A process lives while any of its threads does.** ``/proc/PID`` shows the
thread-group leader: when the main thread calls ``pthread_exit`` while another
thread keeps the GPU memory, ``/proc/PID/stat`` says ``Z`` though the process
runs, NVML still lists PID (the driver names the process, the tgid) and only a
SIGKILL of PID frees it; its program (``exe``), command line, environment and
fds then read empty or fail at ``/proc/PID`` and show at ``/proc/PID/task/TID``
of a live thread. So liveness is decided in one place, :func:`read_stat`: a
leader in state ``Z`` with a live thread is a live process whose ``state`` is
its threads' and whose ``live_task`` names the thread its facts are read from
(:func:`image_dir`, used by every reader of those files). A true zombie has
no live task: it has exited, and only its parent (``ppid``) can reap it.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import re
import time
from typing import NamedTuple

PROC = "/proc"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

# Containers show up in the cgroup path under a 64-hex-digit id (docker,
# containerd, cri-o, podman all use it).
_CONTAINER_PATTERN = r"(?:docker|cri-containerd|crio|libpod)?[-/:]?([0-9a-f]{64})"

#: process states of a task that has exited (zombie, dead)
EXITED_STATES = frozenset({"Z", "X"})
#: at most this many threads of an exited leader are read to tell the process's state (a live
#: one is looked for beyond them): a process of 100,000 threads costs no more than this
MAX_TASKS_READ = 256
#: a process's state from its live threads when its leader has exited: the first of these that
#: any thread is in (one thread in D holds the exit up; stopped only when every thread is;
#: ``?`` places a letter not listed here)
_TASK_STATE_ORDER = "DRSIWPK?tT"
SIGTERM_BIT = 1 << (15 - 1)  # SIGTERM is signal 15: bit 14 of the SigIgn/SigCgt masks
PF_KTHREAD = 0x00200000  # task flag (field 9 of /proc/PID/stat) of kernel threads
#: at most this much of a command line is read: another user's 600 KB argv must not make
#: planning (and a --match regular expression run over it) unbounded
CMDLINE_MAX = 64 * 1024

_boot_time: float | None = None
_user_cache: dict[int, str] = {}


class ProcessId(NamedTuple):
    """Identity of a process: a PID alone can be reused, (pid, start) cannot."""

    pid: int
    start_ticks: int  # field 22 of /proc/PID/stat: clock ticks after boot


class ProcStat(NamedTuple):
    pid: int
    name: str  # comm: the kernel's 15-character process name (the title when set)
    state: str  # R, S, D (uninterruptible), Z (zombie), T, I ...
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    flags: int
    tty_nr: int = 0  # controlling terminal (0: none)
    #: a live thread's id when the leader thread has exited and others run: the process lives,
    #: ``state`` is its threads', its program, command line, environment and fds are read there
    live_task: int | None = None
    cpu_ticks: int = 0  # user + system CPU time of all its threads so far (utime + stime), in clock ticks
    rss_pages: int = 0  # resident host memory, in pages (what ps calls RSS)

    @property
    def ident(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)

    @property
    def has_exited(self) -> bool:
        """Every thread has exited (a zombie, or a dead task): only its exit status remains.
        A leader that exited while another thread runs has not (see the module doc)."""
        return self.state in EXITED_STATES

    @property
    def leader_exited(self) -> bool:
        """The main thread exited (``pthread_exit``) and another thread keeps the process alive."""
        return self.live_task is not None

    @property
    def image_dir(self) -> str:
        """The /proc folder that shows this process's program, command line, environment and fds."""
        return f"{PROC}/{self.pid}/task/{self.live_task}" if self.live_task is not None else f"{PROC}/{self.pid}"

    @property
    def is_kernel_thread(self) -> bool:
        """PF_KTHREAD, the kernel's own mark, and nothing else: a container's PID 2 is a
        user process (behind tini or ``docker --init``), and a name proves nothing."""
        return bool(self.flags & PF_KTHREAD)


class ProcessInfo(NamedTuple):
    """Everything gpuslate reports about one host process."""

    pid: int
    start_ticks: int
    name: str
    state: str
    ppid: int
    pgid: int
    sid: int
    uid: int | None
    user: str | None
    cmdline: list[str]
    container: str | None
    cgroup: str | None  # cgroup v2 path
    is_kernel_thread: bool
    cpu_time_s: float = 0.0  # user + system CPU time so far, in seconds (ps's TIME)
    host_memory: int = 0  # resident host memory in bytes (ps's RSS)

    @property
    def ident(self) -> ProcessId:
        return ProcessId(self.pid, self.start_ticks)

    @property
    def command(self) -> str:
        return " ".join(self.cmdline) if self.cmdline else f"[{self.name}]"

    @property
    def started(self) -> float:
        return ticks_to_epoch(self.start_ticks)


def boot_time() -> float:
    global _boot_time
    if _boot_time is None:
        with open(f"{PROC}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    _boot_time = float(line.split()[1])
                    break
            else:  # pragma: no cover - every Linux has btime
                _boot_time = 0.0
    return _boot_time


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``, random at every boot); "" when it cannot be
    read. A process identity (pid, start ticks) means this process only within one boot: after a
    reboot, pids and ticks start again, and a recorded identity may name a stranger."""
    global _boot_id
    if _boot_id is None:
        try:
            with open(f"{PROC}/sys/kernel/random/boot_id", "rb") as f:
                text = f.read(64).decode("ascii", "replace").strip()
        except OSError:
            text = ""
        _boot_id = text if len(text) == 36 else ""
    return _boot_id


_boot_id: str | None = None


def ticks_to_epoch(ticks: int) -> float:
    return boot_time() + ticks / CLK_TCK


def epoch_to_ticks(epoch: float) -> float:
    """An epoch time in the clock of process start times (ticks since boot). /proc/stat's btime
    is whole seconds, too coarse to tell a process started just after a time: use the boot clock."""
    return (epoch - time.time() + time.clock_gettime(time.CLOCK_BOOTTIME)) * CLK_TCK


def _read_stat_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None


def _state_of(data: bytes) -> str:
    return data[data.rfind(b")") + 2 :].split(maxsplit=1)[0].decode()


def read_stat(pid: int) -> ProcStat | None:
    """Parse ``/proc/PID/stat``; ``None`` when the process does not exist. A leader that
    exited while a thread lives gives that process, alive (:func:`live_task`)."""
    data = _read_stat_file(f"{PROC}/{pid}/stat")
    if data is None:
        return None
    # comm may contain spaces and parentheses: it ends at the LAST ')'
    lpar = data.find(b"(")
    rpar = data.rfind(b")")
    name = data[lpar + 1 : rpar].decode("utf-8", "replace")
    fields = data[rpar + 2 :].split()
    # fields[0] is field 3 (state); field N is fields[N - 3]
    st = ProcStat(
        pid=pid, name=name, state=fields[0].decode(), ppid=int(fields[1]), pgid=int(fields[2]),
        sid=int(fields[3]), tty_nr=int(fields[4]), flags=int(fields[6]), start_ticks=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]), rss_pages=int(fields[21]) if len(fields) > 21 else 0,
    )
    if st.state in EXITED_STATES:  # only an exited leader pays for a look at its threads
        live = live_task(pid)
        if live is not None:
            st = st._replace(state=live[1], live_task=live[0])
    return st


def live_task(pid: int) -> tuple[int, str] | None:
    """(a live thread, the process's state from its threads) of process ``pid`` whose leader
    thread has exited; None when no thread but the leader lives (a true zombie, or gone).

    The state is the first of D, R, S, I, ..., t, T that a thread is in (see
    :data:`_TASK_STATE_ORDER`): stopped only when every live thread is. At most
    :data:`MAX_TASKS_READ` threads are read for it, and beyond them only until one lives.
    """
    base = f"{PROC}/{pid}/task"
    try:
        names = os.listdir(base)
    except OSError:
        return None
    tid: int | None = None
    best, rank = "", len(_TASK_STATE_ORDER)
    me = str(pid)
    for i, name in enumerate(names):
        if i >= MAX_TASKS_READ and tid is not None:
            break
        if name == me:
            continue
        data = _read_stat_file(f"{base}/{name}/stat")
        if data is None:
            continue  # that thread has just gone
        state = _state_of(data)
        if state in EXITED_STATES:
            continue
        if tid is None:
            tid = int(name)
        r = _TASK_STATE_ORDER.find(state)
        if r < 0:
            r = _TASK_STATE_ORDER.index("?")
        if r < rank:
            best, rank = state, r
    return (tid, best) if tid is not None else None


def zombie_reason(ppid: int | None) -> str:
    """What a true zombie is, naming its parent (one sentence for every report that meets one)."""
    return ("a zombie: every thread of it has exited, and its parent "
            + (f"(PID {ppid}) " if ppid else "") + "has not reaped it")


def zombie_remedy(ppid: int | None) -> str:
    """What ends a zombie: nothing sent to it; only its parent, by reaping it or by exiting."""
    if ppid == 1:
        return ("its parent is PID 1, which should reap it: inside a container, run it with an init that "
                "reaps (tini, 'docker run --init'); no signal to the zombie itself does anything")
    who = f"its parent (PID {ppid})" if ppid else "its parent"
    return f"{who} must reap it (wait), or end {who}: no signal to the zombie itself does anything"


def image_dir(pid: int) -> str:
    """The /proc folder that shows ``pid``'s program, command line, environment and fds:
    ``/proc/PID``, or that of a live thread when the leader thread has exited (there
    those files read empty or fail though the process lives). For readers that hold no
    :class:`ProcStat`; costs a read of ``stat``."""
    st = read_stat(pid)
    return st.image_dir if st is not None else f"{PROC}/{pid}"


class SignalFacts(NamedTuple):
    """What ``/proc/PID/status`` says about a process's signals and namespaces."""

    tgid: int  # the thread group (process) a task id belongs to
    nspid: tuple[int, ...]  # its pid in each nested PID namespace, outermost first
    sig_ign: int  # mask of ignored signals
    sig_cgt: int  # mask of caught signals (a handler is installed)
    sig_blk: int = 0  # mask of blocked signals (a signalfd reader takes them while blocked)

    @property
    def is_namespace_init(self) -> bool:
        """PID 1 of a PID namespace below ours (a container's entry point)."""
        return len(self.nspid) > 1 and self.nspid[-1] == 1

    @property
    def ignores_sigterm(self) -> str | None:
        """Why SIGTERM will provably do nothing, or None.

        A namespace's init only receives signals it installed a handler for
        (SIGKILL excepted), whoever sends them (pid_namespaces(7)).
        """
        if self.sig_ign & SIGTERM_BIT:
            return "ignores SIGTERM (SIG_IGN)"
        if self.is_namespace_init and not self.sig_cgt & SIGTERM_BIT:
            return "PID 1 of its PID namespace without a SIGTERM handler: the kernel drops SIGTERM"
        return None


def read_signal_facts(pid: int) -> SignalFacts | None:
    """Parse the lines of ``/proc/PID/status`` that decide how a process takes SIGTERM."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("Tgid", "NSpid", "SigIgn", "SigCgt", "SigBlk"):
            fields[key] = value.strip()
    try:
        return SignalFacts(
            tgid=int(fields.get("Tgid", pid)),
            nspid=tuple(int(x) for x in fields.get("NSpid", str(pid)).split()) or (pid,),
            sig_ign=int(fields.get("SigIgn", "0"), 16), sig_cgt=int(fields.get("SigCgt", "0"), 16),
            sig_blk=int(fields.get("SigBlk", "0"), 16),
        )
    except ValueError:
        return None


def identity(pid: int) -> ProcessId | None:
    st = read_stat(pid)
    return st.ident if st else None


def is_alive(ident: ProcessId) -> bool:
    """True while the process with this identity exists and has not exited.

    A zombie has exited: its resources (GPU memory included) are already
    released, only its exit status waits to be collected. A process whose
    leader thread exited while another thread runs has not (:func:`read_stat`).
    """
    st = read_stat(ident.pid)
    return st is not None and st.start_ticks == ident.start_ticks and not st.has_exited


def open_image_file(pid: int, name: str) -> int:
    """``os.open`` (read-only) of ``/proc/PID/NAME``, a file of the process's memory image
    (``environ``); where the leader thread has exited (the kernel answers ESRCH), that of a
    live thread (:func:`image_dir`). Raises OSError like ``os.open``."""
    try:
        return os.open(f"{PROC}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    except ProcessLookupError:
        return os.open(f"{image_dir(pid)}/{name}", os.O_RDONLY | os.O_CLOEXEC)


def user_name(uid: int) -> str:
    name = _user_cache.get(uid)
    if name is None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        _user_cache[uid] = name
    return name


def read_cmdline(pid: int, image: str | None = None) -> list[str]:
    """argv as the process shows it (it may rewrite it), cut at :data:`CMDLINE_MAX` bytes.
    ``image``: the folder to read it from (:attr:`ProcStat.image_dir`; default ``/proc/PID``)."""
    try:
        with open(f"{image or f'{PROC}/{pid}'}/cmdline", "rb") as f:
            raw = f.read(CMDLINE_MAX)
    except OSError:
        return []
    # setproctitle-style titles overwrite argv with one string padded by NULs
    raw = raw.rstrip(b"\0")
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0")] if raw else []


def read_exe(pid: int, image: str | None = None) -> str | None:
    """The path of the program a process runs (``/proc/PID/exe``): a kernel fact that,
    unlike its name or argv, the process cannot rewrite. ``None`` when it cannot be read
    (another user's process for a non-root caller, a non-dumpable setuid program, a
    zombie, a kernel thread); " (deleted)" is kept, it says the file was replaced.
    ``image`` as for :func:`read_cmdline` (an exited leader's ``exe`` cannot be read)."""
    try:
        return os.readlink(f"{image or f'{PROC}/{pid}'}/exe")
    except OSError:
        return None


def read_exe_is_system(pid: int, image: str | None = None) -> bool:
    """Whether the program a process runs is a system program: the very file it runs
    (``stat`` follows ``/proc/PID/exe`` to the inode, even a deleted one) is owned by
    root and writable by no one else. Any user can copy a program to ``~/bin/sshd``;
    no user but root can make that copy root's. False when it cannot be read."""
    try:
        st = os.stat(f"{image or f'{PROC}/{pid}'}/exe")
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022


_NS_GET_PARENT = 0xB702  # ioctl_ns(2): _IO(0xb7, 0x2)


def read_pid_ns(pid: int) -> tuple[int, ...] | None:
    """The PID namespaces a process lives in, as inodes: its own first, then each
    parent (``ioctl(NS_GET_PARENT)``) up to the first one this process may not see
    beyond. None when ``/proc/PID/ns/pid`` cannot be opened (another user's process
    for a non-root caller, a process that has gone)."""
    try:
        fd = os.open(f"{PROC}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chain: list[int] = []
    try:
        while len(chain) < 33:  # the kernel nests PID namespaces 32 deep at most
            chain.append(os.fstat(fd).st_ino)
            try:
                parent = fcntl.ioctl(fd, _NS_GET_PARENT)
            except OSError:  # EPERM: the caller's own namespace or above; ENOTTY: old kernel
                break
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    return tuple(chain)


def read_cgroups(pid: int) -> tuple[str | None, str | None]:
    """(container id, cgroup v2 path) of a process, from one read of /proc/PID/cgroup."""
    try:
        with open(f"{PROC}/{pid}/cgroup", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None, None
    m = re.search(_CONTAINER_PATTERN, text)  # re caches the compiled pattern
    path = next((line[3:].strip() for line in text.splitlines() if line.startswith("0::")), None)
    return (m.group(1)[:12] if m else None), path


def read_cgroup(pid: int) -> str | None:
    """The cgroup v2 path of a process (the ``0::`` line), if any."""
    return read_cgroups(pid)[1]


def read_info(pid: int) -> ProcessInfo | None:
    """All host facts for one process; ``None`` if it does not exist (any more)."""
    st = read_stat(pid)
    if st is None:
        return None
    try:
        uid: int | None = os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        uid = None
    container, cgroup = read_cgroups(pid)
    return ProcessInfo(
        pid=pid, start_ticks=st.start_ticks, name=st.name, state=st.state,
        ppid=st.ppid, pgid=st.pgid, sid=st.sid, uid=uid,
        user=user_name(uid) if uid is not None else None,
        cmdline=read_cmdline(pid, st.image_dir), container=container, cgroup=cgroup,
        is_kernel_thread=st.is_kernel_thread, cpu_time_s=st.cpu_ticks / CLK_TCK, host_memory=st.rss_pages * PAGE_SIZE,
    )


def read_meminfo() -> tuple[int, int] | None:
    """``(MemTotal, MemAvailable)`` of ``/proc/meminfo`` in bytes, or None when either cannot be
    read: the one reader of the host's memory (a park's host-memory guard, a swap's prefetch)."""
    found: dict[str, int] = {}
    try:
        with open(f"{PROC}/meminfo", "rb") as f:
            for line in f.read(1 << 16).decode("ascii", "replace").splitlines():
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    found[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(found) != 2:
        return None
    return found["MemTotal"], found["MemAvailable"]


def list_pids() -> list[int]:
    return [int(n) for n in os.listdir(PROC) if n.isdigit()]


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids for every process on the host."""
    kids: dict[int, list[int]] = {}
    for pid in list_pids():
        st = read_stat(pid)
        if st is not None:
            kids.setdefault(st.ppid, []).append(pid)
    return kids
