"""``gpuslate sim hold``: real processes that hold simulated GPU memory.

The shapes mirror real model servers: a single process, a launcher with
tensor-parallel worker processes (``workers``), workers that double-forked
away from their launcher (``orphan_workers``, like SGLang schedulers that end
up under PID 1), processes that ignore SIGTERM, renamed processes, monitors
that only hold the device open (``memory=0``), and holders whose main thread
exits while another thread keeps the memory (``main_thread_exits``: ``/proc``
then says ``Z`` for a process that lives, see :mod:`gpuslate.proc.procfs`).

And CUDA MPS (``gpuslate sim mps``, ``sim hold --mps``): a real MPS server is
``nvidia-cuda-mps-server``, a root-owned program holding a context (66 MiB on
an H200) on every GPU its clients use, listed by the driver as a compute
process; its clients' contexts are listed as MPS contexts; its parent is the
MPS control daemon (``nvidia-cuda-mps-control -d``, which daemonized: a session
of its own), and its environment is the control daemon's. The simulated server
is the same: a simulated control daemon (a process in a session of its own that
becomes, by ``exec``, a copy of the system's ``sleep`` named
``nvidia-cuda-mps-control``) forks it; it holds its footprint and then becomes,
by ``exec`` with its fds (and so its records and their locks) kept, a copy named
``nvidia-cuda-mps-server``: the program ``/proc/PID/exe`` shows, which is what
tells a GPU daemon (a system program of that name: the copy is root's when root
makes it). What proves a daemon (:mod:`gpuslate.proc.daemons`: its program file
unchanged in a folder only root can change, its user, nothing preloaded in its
environment or its memory map, the control daemon its parent) is then what
``/proc`` shows of real programs: the copies map the system's own libraries. A
client (``--mps``) records MPS contexts and needs a live simulated server of its
own user on each of its GPUs, as MPS serves one user at a time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, NamedTuple, NoReturn

from ..._parse import format_gpu_list
from ...errors import PermissionDenied, ServerFailed, UsageError
from ...proc.daemons import MPS_CONTROL, MPS_SERVER
from ...proc.jobs import program
from ...proc.procfs import PROC, read_exe, read_stat
from .host import SimHost

#: the simulated MPS server's program runs this long (it is ended by a signal)
_FOREVER_S = "2147483647"


def full_titles() -> bool:
    """Whether :func:`set_title` can rewrite the whole command line: setproctitle, a C extension,
    is importable (the zipapp of ``install`` has none: there a title is the kernel's name only)."""
    return importlib.util.find_spec("setproctitle") is not None


def set_title(title: str) -> None:
    """Set the process title the way model servers do (cmdline and comm); without setproctitle,
    the kernel's process name only (15 characters; see :func:`full_titles`)."""
    try:
        import setproctitle  # lazy: optional

        setproctitle.setproctitle(title)
    except ImportError:  # fall back to the kernel name only (15 characters)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, title.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def assign(gpus: list[int], memory: int, workers: int) -> list[list[tuple[int, int]]]:
    """(gpu, bytes) per worker: GPUs round-robin over workers; each GPU holds
    ``memory`` in total, split evenly when several workers share it."""
    n = max(workers, 1)
    plan: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    if n <= len(gpus):
        for j, g in enumerate(gpus):
            plan[j % n].append((g, memory))
        return plan
    sharers: dict[int, list[int]] = {}
    for i in range(n):
        sharers.setdefault(gpus[i % len(gpus)], []).append(i)
    for g, ws in sharers.items():
        share, extra = divmod(memory, len(ws))
        for k, w in enumerate(ws):
            plan[w].append((g, share + (1 if k < extra else 0)))
    return plan


class WorkerPid(NamedTuple):
    """A worker's pid in the two views a process in a PID namespace has."""

    own: int  # in the launcher's PID namespace (os.getpid()): what the launcher may signal
    shown: int  # as /proc shows it: the host's pid, unless the namespace mounted its own /proc
    control: socket.socket | None = None  # with regions: the launcher's end of the worker's control line


def split(nbytes: int, shares: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
    """``nbytes`` cut into named regions by their shares (the last takes what rounding leaves)."""
    out: list[tuple[str, int]] = []
    left = nbytes
    for i, (tag, share) in enumerate(shares):
        part = left if i == len(shares) - 1 else min(left, int(nbytes * share))
        out.append((tag, part))
        left -= part
    return out


class WorkerControls:
    """The launcher's end of workers that hold their memory in named regions (``start_workers`` with
    ``regions``): each command goes to every worker, which answers once it is done, so a caller knows
    the memory left (or came back) on every GPU before it answers anyone. Commands (one line):

    * ``release TAG...``: the regions let go (``cuMemRelease``: at once, not at exit);
    * ``acquire TAG...``: taken again (room checked: a GPU without it is a CUDA out-of-memory error,
      and the worker keeps what it had); blocks while the driver has the worker locked;
    * ``offload TAG...`` / ``drop``: take (or free) host memory as large as those regions, as a copy
      of the weights kept in CPU memory.

    Blocking: call it from a thread. Returns one error line per worker that failed (empty: all did it).
    """

    def __init__(self, workers: Sequence[WorkerPid]) -> None:
        self.workers = [w for w in workers if w.control is not None]
        self._files = [w.control.makefile("rwb") for w in self.workers if w.control is not None]

    def command(self, line: str) -> list[str]:
        errors: list[str] = []
        sent: list[int] = []
        for rank, f in enumerate(self._files):
            try:
                f.write(line.encode() + b"\n")
                f.flush()
                sent.append(rank)
            except OSError:
                errors.append(f"worker {rank} is gone")
        for rank in sent:
            try:
                reply = self._files[rank].readline(4096).decode("utf-8", "replace").strip()
            except OSError:
                reply = ""
            if reply != "ok":
                errors.append(reply[6:] if reply.startswith("error ") else f"worker {rank} is gone")
        return errors


def shown_pid() -> int:
    """This process's pid as its /proc shows it (``/proc/self``): what ``ps`` and
    tools reading that /proc see. The host's pid unless a PID namespace mounted its
    own /proc; only for telling people, never for the simulated driver's accounting,
    which finds holders from the reader's side (see :mod:`gpuslate.gpu.simhost.records`)."""
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def _hold_here(host: SimHost, held: list[tuple[int, int]], kind: str = "compute", ipc: bool = False) -> list[int]:
    """Open the device files like a CUDA context does, then allocate the memory.

    Returns the open fds, which the caller keeps for its whole life: closing
    them (exiting) releases the memory. Raises ServerFailed when a GPU has no
    room, like CUDA's out-of-memory error.
    """
    with host.dev_dir() as dev:  # walked: never another user's link, never a FIFO that would hang
        fds = [dev.open(name, os.O_RDONLY) for name in ("nvidiactl", "nvidia-uvm")]
        fds += [dev.open(host.device_path(gpu).name, os.O_RDONLY) for gpu, _ in held]
    return fds + host.allocate(held, kind=kind, ipc=ipc)


def mps_server(host: SimHost, gpus: list[int], footprint: int, *, out: IO[str] = sys.stdout) -> None:
    """Run a simulated MPS server holding ``footprint`` bytes on each GPU until it ends (module doc).

    This process forks the control daemon, which starts a session of its own, forks the server and
    then runs as ``DIR/bin/nvidia-cuda-mps-control``; the server holds the memory and then runs as
    ``DIR/bin/nvidia-cuda-mps-server`` (:meth:`SimHost.daemon_program`), the same process with the
    same fds. Once it does, this writes ``{"ready": true, "pid": SERVER, "control": CONTROL,
    "workers": []}`` to ``out``; it ends both when it gets SIGTERM or SIGINT (``quit``), and returns
    when the server has ended (then ending the control daemon). Raises ServerFailed, holding
    nothing, when a GPU lacks the room.
    """
    if not gpus:
        raise UsageError("no GPUs to serve: pass --gpus")
    if footprint <= 0:
        raise UsageError("invalid --footprint: an MPS server holds more than 0 bytes on each GPU")
    host.check_gpus(gpus)
    control_exe = host.daemon_program(MPS_CONTROL)
    server_exe = host.daemon_program(MPS_SERVER)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # a forked child must not flush the parent's buffers again
    r, w = os.pipe()  # every write end closes on an exec: end of file says both run (or one failed)
    control = os.fork()
    if control == 0:
        try:
            os.close(r)
            os.setsid()  # as nvidia-cuda-mps-control -d daemonizes
            child = os.fork()
            if child == 0:
                try:
                    fds = _hold_here(host, [(g, footprint) for g in gpus])
                    for fd in fds:  # the records, their locks and the device files stay the server's
                        os.set_inheritable(fd, True)
                    os.execv(server_exe, [MPS_SERVER, _FOREVER_S])
                except BaseException as exc:  # noqa: BLE001 - report, never fall back into the caller's stack
                    word = "permission" if isinstance(exc, (PermissionError, PermissionDenied)) else "failed"
                    os.write(w, f"{word} {' '.join(str(exc).split())}\n".encode()[:4000])
                finally:
                    os._exit(1)
            os.write(w, f"server {child}\n".encode())
            os.execv(control_exe, [MPS_CONTROL, _FOREVER_S])
        except BaseException as exc:  # noqa: BLE001
            os.write(w, f"failed {' '.join(str(exc).split())}\n".encode()[:4000])
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode("utf-8", "replace").splitlines()
    server = next((int(line.split()[1]) for line in said if line.startswith("server ")), None)
    failure = next((line for line in said if not line.startswith("server ")), None)
    if failure is not None or server is None:
        _end(control)
        os.waitpid(control, 0)
        word, _, message = (failure or "failed the control daemon did not start").partition(" ")
        raise (PermissionDenied if word == "permission" else ServerFailed)(message)

    for pid in (server, control):
        _await_exec(pid)

    def quit_server(signum: int, frame: object) -> None:
        _end(server)
        _end(control)

    signal.signal(signal.SIGTERM, quit_server)
    signal.signal(signal.SIGINT, quit_server)
    out.write(json.dumps({"ready": True, "pid": server, "control": control, "workers": []}) + "\n")
    out.flush()
    _await_exit(server)
    _end(control)
    try:
        os.waitpid(control, 0)  # retried across the signals above (PEP 475)
    except ChildProcessError:
        pass


def _end(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _await_exec(pid: int, timeout: float = 5.0) -> None:
    """Until ``pid``'s exec is done: the kernel closes its close-on-exec fds and shows the new program a
    moment before it has set up the environment (``/proc/PID/environ`` reads empty meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"{PROC}/{pid}/environ", "rb") as f:
                if f.read(1):
                    return
        except OSError:
            return  # gone, or not ours to read: nothing to wait for
        time.sleep(0.001)


def _await_exit(pid: int) -> None:
    """Until process ``pid`` (not a child of this one) has exited: its pidfd says so, else /proc."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            while not select.select([fd], [], [], None)[0]:
                pass
        finally:
            os.close(fd)
        return
    while (st := read_stat(pid)) is not None and not st.has_exited:
        time.sleep(0.05)


def check_mps_servers(host: SimHost, gpus: list[int]) -> None:
    """Raise ServerFailed unless a live simulated MPS server of this user holds each of ``gpus``:
    an MPS client's work runs in its user's server (MPS serves one user at a time)."""
    uid = os.getuid()
    served: set[int] = set()
    for h in host.survey().held:
        rec = h.record
        if not h.alive or rec.pid is None or rec.kind != "compute" or rec.gpu in served:
            continue
        try:
            owner = os.stat(f"{PROC}/{rec.pid}").st_uid
        except OSError:
            continue
        if owner == uid and program(read_exe(rec.pid)) == MPS_SERVER:
            served.add(rec.gpu)
    missing = sorted(set(gpus) - served)
    if missing:
        raise ServerFailed(f"no simulated MPS server of this user on GPU {format_gpu_list(missing)}: start one "
                           f"with 'gpuslate sim mps --gpus {format_gpu_list(missing)}'")


def _sleep_forever(main_thread_exits: bool = False) -> NoReturn:
    """Keep what this process holds until it is killed; with ``main_thread_exits``, the main
    thread calls ``pthread_exit`` and a second thread keeps the process (and its fds) alive.
    Python runs signal handlers in the main thread only: then SIGTERM either kills (its default)
    or, handled, is never acted on."""
    if main_thread_exits:
        threading.Thread(target=threading.Event().wait, name="keeper").start()
        ctypes.CDLL(None).pthread_exit(None)  # the GIL is released around the call
    while True:
        signal.pause()


def _stay(signum: int, frame: object) -> None:
    pass


def _reap(signum: int, frame: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def hold(
    host: SimHost,
    gpus: list[int],
    memory: int,
    *,
    workers: int = 0,
    orphan_workers: bool = False,
    ignore_term: bool = False,
    survive_term: bool = False,
    handles: list[int] | None = None,
    title: str | None = None,
    reap: bool = True,
    mps: bool = False,
    main_thread_exits: bool = False,
    ipc: bool = False,
    out: IO[str] = sys.stdout,
) -> NoReturn:
    """Hold ``memory`` bytes on each GPU in ``gpus`` until killed; with ``mps``, as MPS clients
    (each GPU needs a simulated MPS server of this user: :func:`check_mps_servers`).

    Prints one JSON line ``{"ready": true, "pid": ..., "workers": [...]}`` once
    all memory is held: the pids as this process's /proc shows them (see
    :func:`shown_pid`; ``status`` shows host pids, as a driver does).
    ``title`` may contain ``{rank}`` (the worker number). ``ipc``: the memory is shared through CUDA
    IPC (what the driver's checkpoint refuses). With ``main_thread_exits``
    each process holding memory ends its main thread once it holds (see :func:`_sleep_forever`).
    Raises ServerFailed, holding nothing, when a GPU lacks the room (simulated CUDA out of memory).
    """
    if not gpus:
        raise UsageError("no GPUs to hold: pass --gpus")
    host.check_gpus(gpus)
    if workers < 0 or workers > 256:
        raise UsageError(f"invalid --workers {workers}: 0 to 256")
    if handles and workers:
        raise UsageError("--handles applies to a single holder (without --workers)")
    if orphan_workers and not workers:
        raise UsageError("--orphan-workers needs --workers N")
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by every worker
    elif survive_term:
        # a handler that never exits: a server stuck in its shutdown path. Unlike
        # SIG_IGN it cannot be seen from outside, so only the grace ends it
        signal.signal(signal.SIGTERM, _stay)
    if title and not (workers and "{rank}" in title):  # a per-rank title names workers only
        set_title(title.replace("{rank}", "0"))

    if handles:
        host.check_gpus(handles)
    kind = "mps" if mps else "compute"
    if mps:
        check_mps_servers(host, gpus)
    if not workers:
        # like CUDA, which opens every device node: handles on the other GPUs, memory where it computes
        extra = [(g, 0) for g in handles or [] if g not in gpus]
        _hold_here(host, assign(gpus, memory, 1)[0] + extra, kind, ipc)  # the fds stay open for the process's life
        _announce(out, [])
        _sleep_forever(main_thread_exits)

    if reap:
        signal.signal(signal.SIGCHLD, _reap)
    out.flush()
    pids = start_workers(host, gpus, memory, workers, orphan=orphan_workers, title=title, kind=kind,
                         main_thread_exits=main_thread_exits, ipc=ipc)
    _announce(out, [w.shown for w in pids])
    _sleep_forever()


def start_workers(host: SimHost, gpus: list[int], memory: int, workers: int, *,
                  orphan: bool = False, title: str | None = None, kind: str = "compute",
                  main_thread_exits: bool = False, ipc: bool = False,
                  regions: Sequence[tuple[str, float]] | None = None) -> list[WorkerPid]:
    """Fork ``workers`` processes holding ``memory`` per GPU round-robin; return
    their pids once every one of them holds its memory (like TP ranks loading).
    With ``regions`` (name, share of the memory), each worker holds its memory as those regions
    and obeys its control line (:class:`WorkerControls`): an engine that parks.

    All or nothing: when one fails (out of memory), the others end themselves
    before the error is raised; they wait at a barrier (a pipe) that only says
    "go" when all of them hold their memory, so none is ever signaled by pid.
    """
    host.check_gpus(gpus)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # a forked child must not flush the parent's buffers again
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    intermediates: list[int] = []
    controls: dict[int, socket.socket] = {}  # rank -> the launcher's end
    try:
        for rank, held in enumerate(assign(gpus, memory, workers)):
            pair = socket.socketpair() if regions else None
            pid = os.fork()
            if pid == 0:
                os.close(go_w)
                for mine in controls.values():  # the other workers' lines are the launcher's, not ours
                    mine.close()
                if pair is not None:
                    pair[0].close()
                _worker(host, held, rank, (r, w), go_r, orphan, title, kind, main_thread_exits, ipc,
                        regions, pair[1] if pair else None)
            if pair is not None:
                pair[1].close()
                controls[rank] = pair[0]
            if orphan:
                intermediates.append(pid)
        os.close(w)
        os.close(go_r)
        for pid in intermediates:  # the middle process exits at once: collect it
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        pids, errors = _reports(r, workers)
        if errors or len(pids) != workers:
            for mine in controls.values():
                mine.close()
            raise ServerFailed(f"simulated worker failed: {errors[0]}" if errors
                               else "a simulated worker died before holding its memory")
        os.write(go_w, b"g" * workers)  # at most 256 bytes: never blocks on a pipe
        return [p._replace(control=controls.get(rank)) for rank, p in enumerate(pids)]
    finally:
        os.close(go_w)  # without "go", an end of file: every worker that held memory exits


def _reports(r: int, workers: int) -> tuple[list[WorkerPid], list[str]]:
    """(pids, errors) from the workers' lines; stops at EOF once every worker wrote or died."""
    pids: list[WorkerPid] = []
    errors: list[str] = []
    with os.fdopen(r) as reports:
        for line in reports:
            if line.startswith("error "):
                errors.append(line[6:].strip())
            else:
                own, shown = line.split()
                pids.append(WorkerPid(int(own), int(shown)))
            if len(pids) + len(errors) == workers:
                break
    return pids, errors


def _worker(host: SimHost, held: list[tuple[int, int]], rank: int, report: tuple[int, int], go: int,
            orphan: bool, title: str | None, kind: str, main_thread_exits: bool, ipc: bool = False,
            regions: Sequence[tuple[str, float]] | None = None, control: socket.socket | None = None) -> NoReturn:
    """Runs in the forked child; never returns into the launcher's code."""
    r, w = report
    tagged: dict[str, list[tuple[int, int]]] = {}  # region -> its (gpu, bytes), with ``regions``
    named: dict[str, list[tuple[str, int]]] = {}  # region -> its records, while held
    try:
        os.close(r)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if orphan and os.fork() != 0:
            os._exit(0)  # the grandchild lives on under PID 1 (or a subreaper)
        if title:
            set_title(title.replace("{rank}", str(rank)) if "{rank}" in title else title)
        if regions:
            for gpu, nbytes in held:
                for tag, part in split(nbytes, regions):
                    tagged.setdefault(tag, []).append((gpu, part))
            fds = _hold_here(host, [(g, 0) for g, _ in held], kind, ipc)  # the devices, as CUDA opens them
            named = {tag: host.allocate_named(parts, kind=kind, ipc=ipc) for tag, parts in tagged.items()}
        else:
            fds = _hold_here(host, held, kind, ipc)
        os.write(w, f"{os.getpid()} {shown_pid()}\n".encode())
        os.close(w)
        started = os.read(go, 1) == b"g"  # the other ranks failed (or the launcher died): end of file
        os.close(go)
    except BaseException as exc:  # noqa: BLE001 - report, never fall back into the launcher's stack
        try:
            os.write(w, f"error {' '.join(str(exc).split())}\n".encode())
        finally:
            os._exit(1)
    if not started:
        os._exit(1)
    del fds
    try:
        if control is not None:
            _obey(host, control, tagged, named, kind, ipc)
        _sleep_forever(main_thread_exits)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole foreground group: a rank ends quietly, its
        os._exit(130)  # launcher (or server) says so once


def _obey(host: SimHost, control: socket.socket, tagged: dict[str, list[tuple[int, int]]],
          named: dict[str, list[tuple[str, int]]], kind: str, ipc: bool) -> None:
    """A parkable worker's control loop (:class:`WorkerControls`); returns when the launcher's end
    closes (the launcher died: the worker lives on with what it holds, as orphaned ranks do)."""
    offloaded: list[int] = []
    with control.makefile("rwb") as f:
        for raw in f:
            cmd, *args = raw.decode("utf-8", "replace").split()
            try:
                if cmd == "release":
                    for tag in args:
                        host.free(named.pop(tag, []))
                elif cmd == "acquire":
                    for tag in args:
                        if tag not in named and tag in tagged:
                            named[tag] = host.allocate_named(tagged[tag], kind=kind, ipc=ipc)
                elif cmd == "offload":  # a copy of these regions in host memory
                    nbytes = sum(part for tag in args for _, part in tagged.get(tag, []))
                    offloaded.append(host.hold_host(nbytes))
                elif cmd == "drop":
                    while offloaded:
                        os.close(offloaded.pop())
                reply = "ok"
            except (ServerFailed, PermissionDenied, OSError, ValueError, IndexError) as exc:
                reply = "error " + " ".join(str(exc).split())
            f.write(reply.encode()[:4000] + b"\n")
            f.flush()


def _announce(out: IO[str], workers: list[int]) -> None:
    out.write(json.dumps({"ready": True, "pid": shown_pid(), "workers": workers}) + "\n")
    out.flush()
