"""The simulated driver's bookkeeping: memory records, and which process owns each one.

A real driver knows which process owns a GPU context and reports its pid as
the host sees it, whatever PID namespace the process lives in; it never asks
the process. The simulated host must not take a holder's word either: a
holder inside ``unshare --pid --fork --mount-proc`` believes it is PID 1, and
another user's holder may write whatever it likes. So ownership comes from
kernel facts, gathered from the reader's (the host's) point of view.

The scheme, one record per context (GPU, process):

* **Creation.** A holder first opens ``dev/nvidiaN`` (as CUDA does), then
  creates ``alloc/gN.TOKEN.json`` (mode 0644) under a temporary name, takes an
  exclusive ``flock`` on it, and renames it into place. It keeps that fd, and
  so the lock, for its whole life: the record is its context.
* **Liveness** is the kernel's: a reader opens the record read-only and tries
  a shared ``flock`` without blocking. Refused means some process still has
  the record open (a ``flock`` belongs to the open file and ends when its last
  fd closes: at exit, at SIGKILL). This needs no access to anyone's ``/proc``,
  so it works for every user.
* **Owner** (:func:`owner_of`, a pure function of these facts) is first the
  process ``/proc/locks`` names for the record's lock: the kernel recorded
  which process took it and translates that pid into the reader's PID
  namespace, so a holder inside ``unshare --pid`` shows as its host pid. It
  counts when it started before the record was written (not a reused pid) and
  its fd table, read from the host's ``/proc``, holds both the record and the
  GPU's device file, or may not be read (another user's holder, a non-root
  reader). Failing that (the locker exited and a forked child kept the fds), a
  scan of every readable fd table: the process holding both that started
  first. Otherwise no process is named: the memory counts, held by no process
  that can be signaled, like a context in another container. The common case
  costs one read of ``/proc/locks`` and one fd table per holder, not a scan.
* **Claims.** The pid and start time a holder writes into its record are
  never trusted for a live record. After its death, while the driver still
  "releases" it, the owner named is the one resolved while it lived (by this
  reader), else the claim, but only when no process has that pid any more:
  a name for a dead process, never a live process it does not belong to.

Leaks (``sim leak``) are records without a process (``pid`` null): held
until the next ``sim init``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterable
from typing import Any, NamedTuple

from ..._walk import StateDir
from ...errors import PermissionDenied
from ...proc.fdscan import FdScan
from ...proc.procfs import PROC
from ..types import PROCESS_KINDS, ProcessKind

#: a record is a few dozen bytes; anything larger is not one
MAX_RECORD_BYTES = 4096
#: /proc/locks lists every lock of the host: bounded all the same
MAX_LOCKS_BYTES = 4 << 20
SUFFIX = ".json"


class Claim(NamedTuple):
    """What a record file says (the owner fields only as the holder claimed them)."""

    gpu: int
    claimed_pid: int | None  # None: a leak, held by no process
    claimed_start: int | None
    bytes: int
    kind: str
    #: shared with other processes through CUDA IPC (tensor-parallel ranks' buffers): memory the
    #: driver's checkpoint refuses (see :mod:`gpuslate.gpu.simhost.checkpoint`)
    ipc: bool = False

    @property
    def is_leak(self) -> bool:
        return self.claimed_pid is None


class RecordFile(NamedTuple):
    """A record read from disk, with the kernel facts about it."""

    name: str
    path: str  # as the reader's /proc would show it (real path)
    claim: Claim
    locked: bool  # some process still holds the record open (its flock)
    inode: tuple[int, int]  # (st_dev, st_ino), to find its lock in /proc/locks
    created: float  # its mtime: when its holder wrote it, before it locked it
    uid: int = -1  # who wrote it (the file's owner)


class Owner(NamedTuple):
    pid: int
    start_ticks: int | None


class LockFact(NamedTuple):
    """The process ``/proc/locks`` names for a record's lock, as this host sees it."""

    pid: int
    start_ticks: int | None  # None: no such process now
    started: float | None  # when it started (epoch seconds)
    targets: frozenset[str] | None  # what its fds point to; None: its fd table may not be read


#: /proc/stat's boot time is whole seconds, so a start time is known to about a second
START_SLACK = 1.5


def gpu_of_name(name: str) -> int | None:
    """The GPU a record's file name says (``gN.``), or ``None``."""
    head = name.split(".", 1)[0]
    if head[:1] == "g" and head[1:].isascii() and head[1:].isdigit() and len(head) < 6:
        return int(head[1:])
    return None


def parse_claim(data: bytes, gpus: int) -> Claim | str:
    """A record's content, or what is wrong with it (a string)."""
    try:  # bounded by MAX_RECORD_BYTES: the parser's own depth check (RecursionError) is enough, and cheaper
        rec: Any = json.loads(data)  # than parse_json's passes on every record of every status
    except (ValueError, UnicodeDecodeError, RecursionError):  # 4 KiB can still nest 2,000 deep
        return "not JSON"
    if not isinstance(rec, dict):
        return "not a record"

    def whole(key: str, low: int, high: int | None = None, *, null: bool = False) -> bool:
        v = rec.get(key)
        if v is None:
            return null
        return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)

    if not whole("gpu", 0, gpus - 1):
        return "no valid gpu"
    if not whole("bytes", 0, 1 << 60):
        return "no valid bytes"
    if not whole("pid", 1, null=True) or not whole("start_ticks", 0, null=True):
        return "no valid pid"
    if rec.get("kind") not in PROCESS_KINDS or rec.get("kind") == ProcessKind.HANDLE:
        return "no valid kind"
    if not isinstance(rec.get("ipc", False), bool):
        return "no valid ipc"
    return Claim(rec["gpu"], rec.get("pid"), rec.get("start_ticks"), rec["bytes"], rec["kind"], rec.get("ipc", False))


def read_record(alloc: StateDir, name: str, real_dir: str, gpus: int) -> RecordFile | str | None:
    """Read one record of the ``alloc`` folder (walked and held open): a regular file only, never
    through a symlink, never blocking on a FIFO, never more than :data:`MAX_RECORD_BYTES`.

    Returns the record, a one-line problem, or ``None`` when it vanished (collected).
    """
    try:
        fd = alloc.open(name, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except PermissionDenied:  # a FIFO, a link, a device: never opened
        return f"record {name!r} is not a regular file"
    except OSError as exc:
        return f"record {name!r} cannot be read: {os.strerror(exc.errno or 0) or exc}"
    try:
        st = os.fstat(fd)
        data = os.read(fd, MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            return f"record {name!r} is too large"
        claim = parse_claim(data, gpus)
        if isinstance(claim, str):
            return f"record {name!r} is invalid: {claim}"
        locked = False
        if not claim.is_leak:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                locked = True  # its holder still has it open
            except OSError as exc:
                return f"record {name!r}: its holder cannot be checked: {os.strerror(exc.errno or 0)}"
            # else: nobody holds it; our own shared lock ends when we close the fd
        return RecordFile(name, os.path.join(real_dir, name), claim, locked, (st.st_dev, st.st_ino), st.st_mtime,
                          st.st_uid)
    except OSError as exc:
        return f"record {name!r} cannot be read: {os.strerror(exc.errno or 0) or exc}"
    finally:
        os.close(fd)


def owner_of(record: RecordFile, device_path: str, lock: LockFact | None, scan: FdScan | None,
             starts: dict[int, int | None]) -> Owner | None:
    """Who owns a live record, from kernel facts only (see the module docstring); never
    a pid the record names.

    First the process the kernel lists for the record's lock (it took the lock when
    it created the context), if it started before the record was written and holds
    both the record and ``device_path``, or may not be inspected. Else, from a scan
    of every inspectable fd table (``scan``; ``None``: not taken), the process that
    holds both and started first (a fork inherits the fds). Else nobody.
    ``starts`` gives the scanned holders' start ticks (``None``: gone since).
    """
    if (lock is not None and lock.start_ticks is not None and lock.started is not None
            and lock.started <= record.created + START_SLACK  # a pid reused since is not the locker
            and (lock.targets is None or (record.path in lock.targets and device_path in lock.targets))):
        return Owner(lock.pid, lock.start_ticks)
    if scan is None:
        return None
    candidates = [pid for pid, targets in scan.holders.items()
                  if record.path in targets and device_path in targets]
    if not candidates:
        return None

    def age(pid: int) -> tuple[int, int]:
        s = starts.get(pid)
        return (s if s is not None else 1 << 62, pid)

    first = min(candidates, key=age)
    return Owner(first, starts.get(first))


def lock_owners(inodes: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """The pid ``/proc/locks`` names for the FLOCK on each inode (the kernel gives it in
    the reader's PID namespace). Inodes without a (visible) lock are left out."""
    wanted = {(os.major(dev), os.minor(dev), ino): (dev, ino) for dev, ino in inodes}
    if not wanted:
        return {}
    try:
        with open(f"{PROC}/locks", "rb") as f:
            text = f.read(MAX_LOCKS_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    out: dict[tuple[int, int], int] = {}
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 9494 fe:00:2146328 0 EOF"; waiters have "->" after the number
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, ino = parts[5].split(":")
            key = (int(major, 16), int(minor, 16), int(ino))
            pid = int(parts[4])
        except ValueError:
            continue
        if key in wanted and pid > 0:
            out[wanted[key]] = pid
    return out


def create_record(alloc: StateDir, name: str, claim: Claim) -> int:
    """Write a record into the ``alloc`` folder (walked and held open) and hold it (see the module
    docstring); returns the fd that keeps it (not inherited by a program the holder runs).

    The record appears under its final name only once it is locked, so no reader
    ever sees a record of a living holder unlocked.
    """
    tmp = f".{name}.{os.getpid()}.tmp"
    fields: dict[str, Any] = {"gpu": claim.gpu, "pid": claim.claimed_pid, "start_ticks": claim.claimed_start,
                              "bytes": claim.bytes, "kind": claim.kind}
    if claim.ipc:
        fields["ipc"] = True
    body = json.dumps(fields).encode()
    fd = alloc.create(tmp, os.O_RDWR, 0o644)  # whatever the umask: every user's status reads it
    if fd is None:
        raise FileExistsError(errno.EEXIST, f"a file {tmp} is in the way", str(alloc.path / tmp))
    try:
        if os.write(fd, body) != len(body):
            raise OSError(errno.ENOSPC, "short write")
        if not claim.is_leak:
            fcntl.flock(fd, fcntl.LOCK_EX)
        alloc.rename(tmp, name)
    except BaseException:
        os.close(fd)
        try:
            alloc.unlink(tmp)
        except OSError:
            pass
        raise
    return fd
