"""A simulated GPU host stored in a folder.

Layout of ``DIR``::

    host.json           the host: GPU count, names, memory, release delay
    dev/nvidia0 ...     device files; holders keep them open, so the same
    dev/nvidiactl       /proc fd scan that finds real /dev/nvidia* finds them
    dev/nvidia-uvm
    stuck               (optional) a FIFO: while it exists, every read of the
                        simulated driver blocks on it until a writer opens it,
                        like an NVML call that hangs (see :meth:`SimHost.stall`)
    memory.lock         the allocation lock (flock): room is checked and
                        memory recorded under it, so holders never overcommit
    alloc/*.json        one record per (process, GPU) holding memory, kept
                        open and flock'ed by its holder; or per leaked context
    alloc/*.dead        when a holder was first seen dead (driver teardown start)
    hostmem/*.json      host memory a holder took (an engine's weights offloaded to CPU memory by a
                        sleep), recorded and locked like alloc/ (``gpu`` unused); freed at its exit
    ckpt/PID.json       the driver's checkpoint state of process PID (:mod:`.checkpoint`): locked,
                        checkpointed (its records then count in host memory, not on their GPUs)
                        or failed; honoured only while that process lives
    bin/NAME            (made by ``sim mps``) a copy of the system's ``sleep`` under a
                        GPU daemon's name, which the simulated MPS server runs as

Every file of the folder is reached through the trusted-root walk of
:mod:`gpuslate.host.statedir` under its ``Trust.SHARED`` rules (a simulated host
may be every user's, like /tmp): one component at a time, never through
another user's symbolic link, regular files only (a FIFO never hangs a
reader, ``/dev/zero`` is never read), every read bounded. ``sim init`` resets
only a folder of the caller's own (root included): it never removes or
creates anything in another user's folder, nor through a link.

Memory is held by real processes (see :mod:`gpuslate.gpu.simhost.holder`): a record
counts while its holder keeps it open, and for ``release_delay`` seconds after
it was first seen dead, like a driver tearing down a context; never instantly.
Like a driver, the host refuses memory beyond a GPU's total (an out-of-memory
error), and names each record's owner by its host pid, found from the host's
/proc and never from what the holder says (:mod:`gpuslate.gpu.simhost.records`).
Reading never fails on another user's records: one that cannot be read makes
its GPU's memory unknown, never free.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ..._document import parse_json
from ..._parse import format_size
from ..._walk import StateDir, Trust, open_dir
from ...errors import BackendUnavailable, BadDocument, PermissionDenied, ServerFailed, UsageError
from ...proc.fdscan import FdScan, read_fd_targets, scan_device_holders
from ...proc.procfs import PROC, ProcessId, identity, read_stat, ticks_to_epoch
from .records import (
    SUFFIX,
    Claim,
    LockFact,
    Owner,
    RecordFile,
    create_record,
    gpu_of_name,
    lock_owners,
    owner_of,
    read_record,
)

SCHEMA = "gpuslate.simhost.v1"
DEFAULT_NAME = "NVIDIA RTX PRO 6000 Blackwell"
DEFAULT_MEMORY = 97887 * 1024**2  # what the seed host reported per GPU
DRIVER_VERSION = "sim-580.95.05"
#: what an idle H200 reports as driver-reserved (the v1 memory API counts it as used)
V1_DEFAULT_RESERVED = 645 * 1024**2
MEMORY_APIS = ("v2", "v1")
#: the allocation lock: every holder takes it to check for room and record its memory
LOCK_NAME = "memory.lock"
#: what a simulated host has as host memory unless ``sim init --host-memory`` says otherwise: 2 TiB,
#: as an 8-GPU H200 node (HGX H200 systems ship with 2 TB)
DEFAULT_HOST_MEMORY = 2048 * 1024**3
HOSTMEM_DIR = "hostmem"
CKPT_DIR = "ckpt"
STUCK_NAME = "stuck"
DEAD_SUFFIX = ".dead"
#: 64 GPUs x 256 workers; more records than that is no host's bookkeeping
MAX_RECORDS = 64 * 256
#: host.json is a few kilobytes (64 GPUs: 5 KB); it is never read further than this
MAX_CONFIG_BYTES = 1 << 20
_WHAT = "simulated host directory"


class AllocRecord(NamedTuple):
    """A record as the simulated driver accounts for it: ``pid`` and ``start_ticks``
    name its owner as the host sees it (see :mod:`gpuslate.gpu.simhost.records`), ``None``
    for a leak or an owner no process of this host can be named for."""

    gpu: int
    pid: int | None
    start_ticks: int | None
    bytes: int
    kind: str
    path: Path
    ipc: bool = False  # shared with other processes (CUDA IPC): see Claim.ipc


class HeldMemory(NamedTuple):
    """A record as the simulated driver accounts for it right now."""

    record: AllocRecord
    alive: bool  # False: the process exited and the driver is still releasing


class Survey(NamedTuple):
    """Everything the simulated driver holds now, and what it could not read."""

    held: list[HeldMemory]
    problems: dict[int | None, list[str]]  # GPU (None: every GPU) -> records that could not be read
    #: bytes of records the driver checkpointed (left out of ``held``: they are in host memory now)
    checkpointed: int = 0


class CkptEntry(NamedTuple):
    """A process's state under the simulated driver's checkpoint API (``DIR/ckpt/PID.json``),
    as :meth:`SimHost.checkpoint_entries` found it valid: its process lives (same start), and the
    file is that process's user's (or root's)."""

    pid: int
    start_ticks: int
    state: str  # locked | checkpointed | failed (running: no file)
    records: tuple[str, ...]  # the alloc/ records the driver moved to host memory (checkpointed)
    bytes: int  # what they hold
    uid: int  # the file's owner: only records of this user are moved by it


#: a checkpoint state file is a few hundred bytes per record it names
MAX_CKPT_BYTES = 1 << 20
CKPT_STATES = ("locked", "checkpointed", "failed")


class SimHost:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.dev = self.root / "dev"
        self.alloc = self.root / "alloc"
        self._config: dict[str, Any] | None = None
        self._real_dev: str | None = None
        self._resolved: dict[str, Owner] = {}  # record path -> its owner, as last seen alive
        self._dead_seen: dict[str, float] = {}  # record name -> when this reader first saw it dead
        self._kept: list[int] = []  # fds of records held by add_record for this process

    # -- creation ---------------------------------------------------------
    @classmethod
    def init(
        cls,
        root: str | os.PathLike[str],
        *,
        gpus: int = 8,
        memory: int = DEFAULT_MEMORY,
        name: str = DEFAULT_NAME,
        release_delay: float = 0.2,
        reserved: int | None = None,
        memory_api: str = "v2",
        host_memory: int = DEFAULT_HOST_MEMORY,
    ) -> SimHost:
        """``memory_api="v1"`` simulates a driver before R510: reserved memory
        (default then 645 MiB, like an idle H200) is reported inside 'used'."""
        if memory_api not in MEMORY_APIS:
            raise UsageError(f"invalid --memory-api {memory_api!r}: v2 or v1")
        if reserved is None:
            reserved = V1_DEFAULT_RESERVED if memory_api == "v1" else 0
        if gpus < 1 or gpus > 64:
            raise UsageError(f"invalid --count {gpus}: a simulated host has 1 to 64 GPUs")
        if memory <= 0:
            raise UsageError("invalid --memory: must be more than 0")
        if reserved < 0 or reserved >= memory:
            raise UsageError("invalid --reserved: must be at least 0 and less than --memory")
        if release_delay < 0:
            raise UsageError(f"invalid --release-delay {release_delay}: must not be negative")
        if host_memory <= 0:
            raise UsageError("invalid --host-memory: must be more than 0")
        host = cls(root)
        seed = os.urandom(4).hex()  # uuid4's randomness, without importing uuid (and platform) at every start
        config = {
            "schema": SCHEMA, "name": name, "gpus": gpus, "memory": memory, "reserved": reserved,
            "release_delay": release_delay, "driver_version": DRIVER_VERSION, "memory_api": memory_api,
            "host_memory": host_memory,
            "uuids": [f"GPU-{seed}-5141-4d00-8000-{i:012x}" for i in range(gpus)],
            "created_at": time.time(),
        }
        try:
            host._make_files(gpus, json.dumps(config, indent=2).encode())
        except PermissionDenied as exc:  # a link on the way, another user's folder: refused, one line
            raise PermissionDenied(f"cannot initialise {host.root}: {exc}", hint=exc.hint) from None
        except OSError as exc:  # a read-only folder, a full disk: one line, never a traceback
            where = f" ({exc.filename})" if exc.filename else ""
            error = PermissionDenied if isinstance(exc, PermissionError) else UsageError
            raise error(f"cannot initialise {host.root}: {exc.strerror or exc}{where}") from None
        return host

    def _make_files(self, gpus: int, config: bytes) -> None:
        """Create or reset the folder, every step relative to folders walked and checked (see the
        module docstring): a folder of another user's, or a link where a folder should be, is refused
        before anything in it is removed or created."""
        with self._open(self.root, create=True) as root:
            names = root.names()
            if names and "host.json" not in names:
                raise UsageError(f"refusing to initialise {self.root}: it is not empty and not a simulated host")
            _own(root)
            with root.subdir("dev", create=True, mode=0o755) as dev, \
                    root.subdir("alloc", create=True, mode=0o755) as alloc, \
                    root.subdir(HOSTMEM_DIR, create=True, mode=0o755) as hostmem, \
                    root.subdir(CKPT_DIR, create=True, mode=0o755) as ckpt:
                for folder in (dev, alloc, hostmem, ckpt):
                    _own(folder)
                for folder in (alloc, hostmem, ckpt):  # a new host forgets leaks, records and checkpoints
                    for name in folder.names():
                        folder.unlink(name)
                # existing device files are kept: a process holding one keeps holding it
                wanted = {f"nvidia{i}" for i in range(gpus)} | {"nvidiactl", "nvidia-uvm"}
                for name in dev.names():
                    if name not in wanted:
                        dev.unlink(name)
                for folder, name in [(dev, n) for n in sorted(wanted)] + [(root, LOCK_NAME)]:
                    fd = folder.create(name, os.O_RDONLY, 0o644)  # made if missing, never touched
                    if fd is not None:
                        os.close(fd)
            root.write_atomic("host.json", config, mode=0o644)

    def _open(self, path: Path, *, create: bool = False) -> StateDir:
        """A folder of this host, walked under the ``Trust.SHARED`` rules (see the module docstring)."""
        return open_dir(path, trust=Trust.SHARED, create=create, mode=0o755, parents_mode=0o755, what=_WHAT,
                        hint=f"a simulated host is never reached through another user's link: recreate it "
                        f"with 'gpuslate sim init {self.root}'")

    # -- configuration ------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            hint = f"create one with 'gpuslate sim init {self.root}'"
            try:
                root = self._open(self.root)
            except OSError as exc:
                raise self._no_host(exc, hint) from None
            with root:
                try:
                    data = root.read("host.json", MAX_CONFIG_BYTES)
                except FileNotFoundError:
                    data = None
                except OSError as exc:  # a FIFO, a link to /dev/zero, a file of 1 GB: refused, never read
                    raise BackendUnavailable(f"cannot read {self.root}/host.json: {exc}") from None
                if self._real_dev is None:  # the same walk finds the device folder (real_dev says why not)
                    try:
                        with root.subdir("dev") as dev:
                            self._real_dev = dev.real_path()
                    except OSError:
                        pass
            if data is None:
                raise BackendUnavailable(f"no simulated host at {self.root}", hint=hint)
            try:
                cfg = parse_json(data, max_bytes=MAX_CONFIG_BYTES)
            except BadDocument:
                raise BackendUnavailable(f"{self.root}/host.json is not a gpuslate simulated host") from None
            problem = _config_problem(cfg)
            if problem:
                raise BackendUnavailable(f"{self.root}/host.json is not a valid gpuslate simulated host: {problem}",
                                         hint=f"recreate it with 'gpuslate sim init {self.root}'")
            cfg.setdefault("memory_api", "v2")  # hosts made before the option existed
            cfg.setdefault("host_memory", DEFAULT_HOST_MEMORY)
            self._config = cfg
        return self._config

    def _no_host(self, exc: OSError, hint: str) -> BackendUnavailable:
        """Why the folder is no simulated host, in the words people expect (missing, not a folder),
        else what the walk refused (another user's link on the way)."""
        try:
            is_dir = self.root.is_dir()
        except OSError as err:  # a name too long, a path through a file: not a host either
            return BackendUnavailable(f"no simulated host at {self.root}: {err.strerror}", hint=hint)
        if not is_dir:
            what = "does not exist" if not os.path.lexists(self.root) else "is not a folder"
            return BackendUnavailable(f"no simulated host at {self.root}: it {what}", hint=hint)
        return BackendUnavailable(f"cannot use {self.root}: {exc}")

    @property
    def memory_api(self) -> str:
        return str(self.config["memory_api"])

    @property
    def gpu_count(self) -> int:
        return int(self.config["gpus"])

    @property
    def release_delay(self) -> float:
        return float(self.config["release_delay"])

    def device_path(self, gpu: int) -> Path:
        return self.dev / f"nvidia{gpu}"

    def dev_dir(self) -> StateDir:
        """The device files' folder, walked (never through another user's link) and held open."""
        return self._open(self.dev)

    def alloc_dir(self) -> StateDir:
        """The records' folder, walked like :meth:`dev_dir`."""
        return self._open(self.alloc)

    def subdir(self, name: str, *, create: bool = False) -> StateDir:
        """``DIR/NAME`` (``hostmem``, ``ckpt``), walked like :meth:`dev_dir`; made (as the host's
        other folders) when ``create`` and missing, for hosts made before it existed."""
        return self._open(self.root / name, create=create)

    @property
    def host_memory_total(self) -> int:
        return int(self.config["host_memory"])
    def root_dir(self) -> StateDir:
        """The host's folder, walked like :meth:`dev_dir` (one walk for :meth:`stall` and :meth:`survey`)."""
        return self._open(self.root)

    @property
    def real_dev(self) -> str:
        """The device folder as /proc shows the files opened in it (every trusted link resolved):
        what an fd table is matched against. Found by the walk, so that a ``dev`` that another user
        made a link (to ``/dev``, whose real GPUs' holders would then pass for simulated ones) is
        refused, not followed (:class:`BackendUnavailable`)."""
        if self._real_dev is None:
            try:
                with self.dev_dir() as dev:
                    self._real_dev = dev.real_path()
            except FileNotFoundError:
                self._real_dev = os.path.realpath(self.dev)  # no device folder: nothing can hold it
            except OSError as exc:
                raise BackendUnavailable(f"cannot use {self.dev}: {exc}") from None
        return self._real_dev

    def check_gpus(self, gpus: list[int]) -> None:
        bad = [g for g in gpus if g < 0 or g >= self.gpu_count]
        if bad:
            raise UsageError(
                f"GPU {bad[0]} does not exist: this simulated host has {self.gpu_count} GPUs (0-{self.gpu_count - 1})"
            )

    # -- GPU daemons ----------------------------------------------------------
    def daemon_program(self, name: str) -> str:
        """``DIR/bin/NAME``: a copy of the system's ``sleep``, for a simulated GPU daemon to run as
        (made once). A GPU daemon is told by its program, a system program of that name: the copy
        is one when root makes it (root's file), and an ordinary user's own program otherwise.

        Only a folder and a file of this user's (or root's), writable by no one else, is run:
        never a program another user of a shared host could have put there. The folder is opened
        once and everything is done relative to it; the path returned goes through that open
        folder (``/proc/self/fd/N/NAME``, the kernel shows the program as ``DIR/bin/NAME``), so a
        folder swapped meanwhile is never the one run from."""
        where = self.root / "bin"
        try:
            where.mkdir(mode=0o755, exist_ok=True)
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise _os_failure(f"cannot open {where} (a folder, not a link)", exc) from None
        me = os.geteuid()
        st = os.fstat(fd)
        if st.st_uid not in (me, 0) or st.st_mode & 0o022:
            os.close(fd)
            raise PermissionDenied(f"{where} is not a folder of this user's that only it may write: "
                                   "a simulated daemon's program is never run from there")
        try:
            try:
                fst = os.stat(name, dir_fd=fd, follow_symlinks=False)
                usable = (stat.S_ISREG(fst.st_mode) and fst.st_uid in (me, 0) and not fst.st_mode & 0o022
                          and bool(fst.st_mode & 0o111))
            except FileNotFoundError:
                usable = False
            if not usable:
                self._copy_sleep(fd, name)
        except OSError as exc:
            os.close(fd)
            raise _os_failure(f"cannot make {where / name}", exc) from None
        except BaseException:
            os.close(fd)
            raise
        self._kept.append(fd)
        return f"/proc/self/fd/{fd}/{name}"

    @staticmethod
    def _copy_sleep(dir_fd: int, name: str) -> None:
        import shutil  # lazy: startup (with bz2 and lzma, 10 ms of every simulated command; only a daemon needs it)

        source = shutil.which("sleep", path="/usr/bin:/bin")
        if source is None:
            raise ServerFailed("no 'sleep' program in /usr/bin or /bin for a simulated daemon to run as")
        tmp = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700, dir_fd=dir_fd)
        try:
            with open(os.path.realpath(source), "rb") as src:
                while chunk := src.read(1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            os.fchmod(out, 0o755)
        finally:
            os.close(out)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    # -- a driver that hangs --------------------------------------------------
    def stall(self, root: StateDir | None = None) -> None:
        """Block while ``DIR/stuck`` is a FIFO of the host's owner, until a writer opens
        it and closes it: a simulated driver call that hangs, for tests of timeouts.

        Deliberate and visible, unlike a record that is a FIFO (never waited on: see
        :func:`~gpuslate.gpu.simhost.records.read_record`); another user's FIFO is ignored.
        """
        if root is None:
            try:
                with self.root_dir() as walked:
                    self.stall(walked)
            except OSError:
                pass
            return
        try:
            st = root.lstat(STUCK_NAME)
            owner = root.lstat("host.json").st_uid
        except OSError:
            return
        if not stat.S_ISFIFO(st.st_mode) or st.st_uid != owner:
            return
        try:  # blocks until a writer opens it: the one open that may, on purpose
            fd = os.open(STUCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root.fd)
        except OSError:
            return
        try:
            while os.read(fd, 4096):
                pass
        finally:
            os.close(fd)

    # -- memory -------------------------------------------------------------
    def allocate(self, held: Sequence[tuple[int, int]], *, kind: str = "compute", ipc: bool = False) -> list[int]:
        """Hold memory for the calling process: ``(gpu, bytes)`` each, one context per GPU.

        Like a driver, and atomically against every other holder of this host (a
        lock in the folder): when any GPU lacks the room, nothing is held and
        :class:`~gpuslate.errors.ServerFailed` says which, like CUDA's
        out-of-memory error. The caller must already hold each GPU's
        device file open. Returns the fds that keep the memory held: it is released
        when they close (at exit at the latest), after the release delay. ``ipc``: the memory is
        shared with other processes through CUDA IPC (see :attr:`Claim.ipc`). Like any CUDA call of
        a process the driver locked, it waits until the process is unlocked.
        """
        self.wait_running(os.getpid())
        return [fd for _, fd in self._allocate(held, kind, identity(os.getpid()), ipc)]

    def allocate_named(self, held: Sequence[tuple[int, int]], *, kind: str = "compute",
                       ipc: bool = False) -> list[tuple[str, int]]:
        """:meth:`allocate`, returning each record's (name, fd): what :meth:`free` takes back, for a
        holder that lets part of its memory go while it lives (an engine's sleep)."""
        self.wait_running(os.getpid())
        return self._allocate(held, kind, identity(os.getpid()), ipc)

    def free(self, held: Sequence[tuple[str, int]]) -> None:
        """Let records of this process go now, as ``cuMemRelease`` does while the process lives: the
        record leaves the folder before its fd closes, so no reader sees it being torn down."""
        with self.alloc_dir() as alloc:
            for name, fd in held:
                _unlink_quietly(alloc, name)
                os.close(fd)

    def _allocate(self, held: Sequence[tuple[int, int]], kind: str,
                  claim_of: ProcessId | None, ipc: bool = False) -> list[tuple[str, int]]:
        """:meth:`allocate`, returning each record's (name, fd); ``claim_of`` is what the
        record says about its holder (a claim: see :mod:`gpuslate.gpu.simhost.records`)."""
        wanted = [(g, n) for g, n in held if n > 0]
        self.check_gpus([g for g, _ in wanted])
        made: list[tuple[str, int]] = []
        with self._memory_lock():
            self._check_room(wanted)
            try:
                for gpu, nbytes in wanted:
                    claim = Claim(gpu, claim_of.pid if claim_of else os.getpid(),
                                  claim_of.start_ticks if claim_of else None, nbytes, kind, ipc)
                    name = f"g{gpu}.{os.urandom(8).hex()}{SUFFIX}"
                    made.append((name, self._create(name, claim)))
            except BaseException:
                with self.alloc_dir() as alloc:
                    for name, fd in made:  # all or nothing: what was recorded never held memory
                        _unlink_quietly(alloc, name)
                        os.close(fd)
                raise
        return made

    def leak(self, gpu: int, nbytes: int) -> Path:
        """Leave memory held by no process (an orphaned context) until the next init."""
        self.check_gpus([gpu])
        with self._memory_lock():
            self._check_room([(gpu, nbytes)])
            name = f"g{gpu}.leak.{os.urandom(8).hex()}{SUFFIX}"
            os.close(self._create(name, Claim(gpu, None, None, nbytes, "compute")))
        return self.alloc / name

    def _create(self, name: str, claim: Claim) -> int:
        try:
            with self.alloc_dir() as alloc:
                return create_record(alloc, name, claim)
        except OSError as exc:  # a folder this user may not write, a full disk: one line
            raise _os_failure(f"cannot record memory in {self.alloc}", exc) from None

    def _check_room(self, wanted: Sequence[tuple[int, int]]) -> None:
        cfg = self.config
        total, reserved = int(cfg["memory"]), int(cfg["reserved"])
        used: dict[int, int] = {}
        survey = self.survey(owners=False)
        for h in survey.held:  # memory still being released is not free yet, as on a real GPU
            used[h.record.gpu] = used.get(h.record.gpu, 0) + h.record.bytes
        asked: dict[int, int] = {}
        for gpu, nbytes in wanted:
            asked[gpu] = asked.get(gpu, 0) + nbytes
        for gpu, nbytes in sorted(asked.items()):
            problems = survey.problems.get(gpu, []) + survey.problems.get(None, [])
            if problems:
                raise ServerFailed(f"simulated GPU {gpu}: its free memory is unknown ({problems[0]})")
            free = total - reserved - used.get(gpu, 0)
            if nbytes > free:
                raise ServerFailed(
                    f"simulated GPU {gpu} is out of memory: tried to allocate {format_size(nbytes)}; "
                    f"{format_size(total)} total, {format_size(used.get(gpu, 0) + reserved)} in use, "
                    f"{format_size(max(free, 0))} free")

    @contextmanager
    def _memory_lock(self, timeout: float = 10.0) -> Iterator[None]:
        """The host's allocation lock (``memory.lock``, a ``flock``: read access is enough)."""
        path = self.root / LOCK_NAME
        try:
            with self._open(self.root) as root:
                # read access is enough for a flock; a host made before the lock existed gets it now
                fd = root.open(LOCK_NAME, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError as exc:  # not a regular file, not ours to create: one line
            raise _os_failure(f"cannot open {path}", exc) from None
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ServerFailed(f"the simulated host is busy: {path} stayed locked "
                                           f"for {timeout:g} s") from None
                    time.sleep(0.005)  # allocations hold the lock for milliseconds
            yield
        finally:
            os.close(fd)  # releases the lock

    # -- what is held ---------------------------------------------------------
    def add_record(self, gpu: int, ident: ProcessId | None, nbytes: int, kind: str = "compute") -> Path:
        """Hold memory for the calling process, whatever ``ident`` (what the record claims
        about its holder: only ever a claim), or leak it (``ident=None``); the record stays
        held for this process's life. For tests and scripts; holders use :meth:`allocate`."""
        if ident is None:
            return self.leak(gpu, nbytes)
        if nbytes <= 0:
            raise UsageError("add_record holds more than 0 bytes")
        ((name, fd),) = self._allocate([(gpu, nbytes)], kind, ident)
        self._kept.append(fd)
        return self.alloc / name

    def records(self) -> list[AllocRecord]:
        """Every record that holds memory now, live or being released (owners as in :meth:`survey`)."""
        return [h.record for h in self.held()]

    def held(self, now: float | None = None) -> list[HeldMemory]:
        """Records that still hold memory now, after applying the release delay."""
        return self.survey(now).held

    def survey(self, now: float | None = None, *, owners: bool = True, root: StateDir | None = None) -> Survey:
        """What the simulated driver holds now (see :mod:`gpuslate.gpu.simhost.records`).

        Never raises for a record: one that cannot be read is a problem of its GPU
        (its memory is then unknown, never free). ``owners=False`` skips naming the
        owners (the /proc scan), for the allocation check.
        """
        now = time.time() if now is None else now
        problems: dict[int | None, list[str]] = {}
        try:
            alloc = root.subdir("alloc") if root is not None else self.alloc_dir()
        except FileNotFoundError:
            return Survey([], problems)
        except OSError as exc:  # another user's link, not a folder: every GPU's memory is unknown
            problems[None] = [f"{self.alloc} cannot be read: {exc}"]
            return Survey([], problems)
        with alloc:
            return self._survey(alloc, now, owners, problems, self.checkpoint_entries(root))

    def _survey(self, alloc: StateDir, now: float, owners: bool, problems: dict[int | None, list[str]],
                ckpt: dict[int, CkptEntry]) -> Survey:
        files = self._read_records(alloc, problems)
        moved = {name: e.uid for e in ckpt.values() if e.state == "checkpointed" for name in e.records}
        checkpointed = 0
        live = [f for f in files if f.locked]
        resolved: dict[str, Owner] = {}
        if owners and live:
            resolved = self._owners(live)
            self._resolved.update(resolved)
        files = _once_per_inode(files, resolved)
        out: list[HeldMemory] = []
        for f in files:
            c = f.claim
            path = self.alloc / f.name
            if f.locked and moved.get(f.name, -2) == f.uid:  # the driver holds it in host memory now
                checkpointed += c.bytes
                continue
            if c.is_leak or f.locked:
                owner = resolved.get(f.path)
                out.append(HeldMemory(AllocRecord(c.gpu, owner.pid if owner else None,
                                                  owner.start_ticks if owner else None, c.bytes, c.kind, path,
                                                  c.ipc), True))
                continue
            if now < self._dead_since(alloc, f.name, now) + self.release_delay:
                owner = self._dead_owner(f)
                out.append(HeldMemory(AllocRecord(c.gpu, owner.pid if owner else None,
                                                  owner.start_ticks if owner else None, c.bytes, c.kind, path,
                                                  c.ipc), False))
            elif _unlink_quietly(alloc, f.name):  # released: collected, with its marker, when we may
                _unlink_quietly(alloc, f.name[: -len(SUFFIX)] + DEAD_SUFFIX)
                self._dead_seen.pop(f.name, None)
                self._resolved.pop(f.path, None)
            # else another user's record in a shared folder: its marker stays, so every
            # reader agrees it is released, until its owner's next read collects it
        return Survey(out, problems, checkpointed)

    # -- the driver's checkpoint state and host memory ----------------------------
    def checkpoint_entries(self, root: StateDir | None = None) -> dict[int, CkptEntry]:
        """The valid ``ckpt/`` entries by pid (see :class:`CkptEntry`); a stale one (its process gone
        or another one under its pid) is removed when this user may. Never raises: an entry that
        cannot be read is no entry (its process then reads as running, its memory as on its GPUs,
        where the records still are: never hidden on a doubt)."""
        try:
            folder = root.subdir(CKPT_DIR) if root is not None else self.subdir(CKPT_DIR)
        except OSError:  # none yet (a host made before checkpoints), or not ours to read
            return {}
        out: dict[int, CkptEntry] = {}
        with folder:
            try:
                names = folder.names()
            except OSError:
                return {}
            for name in names:
                entry = _read_ckpt(folder, name)
                if entry is None:
                    continue
                st = read_stat(entry.pid)
                if st is None or st.has_exited or st.start_ticks != entry.start_ticks:
                    _unlink_quietly(folder, name)  # its process is gone: so is its CUDA state
                    continue
                try:
                    proc_uid = os.stat(f"{PROC}/{entry.pid}").st_uid
                except OSError:
                    continue
                if entry.uid in (proc_uid, 0):
                    out[entry.pid] = entry
        return out

    def write_checkpoint_entry(self, entry: CkptEntry | None, pid: int) -> None:
        """Record (or, ``None``: forget, the process running again) ``pid``'s checkpoint state."""
        with self.subdir(CKPT_DIR, create=True) as folder:
            if entry is None:
                _unlink_quietly(folder, f"{pid}.json")
                return
            folder.write_atomic(f"{pid}.json", json.dumps({
                "pid": entry.pid, "start_ticks": entry.start_ticks, "state": entry.state,
                "records": list(entry.records), "bytes": entry.bytes}).encode(), mode=0o644)

    def restore_records(self, entry: CkptEntry) -> None:
        """Bring a checkpointed process's records back onto their GPUs (the entry then says locked):
        under the allocation lock, like any allocation, and only when every GPU has the room
        (ServerFailed, nothing changed, otherwise)."""
        with self._memory_lock():
            wanted: list[tuple[int, int]] = []
            with self.alloc_dir() as alloc:
                real = alloc.real_path()
                for name in entry.records:
                    got = read_record(alloc, name, real, self.gpu_count)
                    if isinstance(got, RecordFile) and got.locked:
                        wanted.append((got.claim.gpu, got.claim.bytes))
            self._check_room(wanted)
            self.write_checkpoint_entry(entry._replace(state="locked", records=(), bytes=0), entry.pid)

    def wait_running(self, pid: int, poll: float = 0.01) -> None:
        """Block while ``pid`` is locked or checkpointed, as a CUDA call of a locked process blocks
        until it is unlocked; ServerFailed once its CUDA state failed."""
        while True:
            entry = self.checkpoint_entries().get(pid)
            if entry is None:
                return
            if entry.state == "failed":
                raise ServerFailed("CUDA error: the process's CUDA state failed in a checkpoint "
                                   "(CU_PROCESS_STATE_FAILED): it can no longer use the GPU")
            time.sleep(poll)

    def host_memory(self) -> tuple[int, int]:
        """``(total, available)`` bytes of the simulated host's memory: its ``host_memory`` less what
        holders took (``hostmem/``) and what the driver checkpointed."""
        total = self.host_memory_total
        used = self._host_held() + self.survey(owners=False).checkpointed
        return total, max(0, total - used)

    def _host_held(self) -> int:
        try:
            folder = self.subdir(HOSTMEM_DIR)
        except OSError:
            return 0
        held = 0
        with folder:
            try:
                real = folder.real_path()
                names = [n for n in folder.names() if not n.startswith(".") and n.endswith(SUFFIX)]
            except OSError:
                return 0
            for name in names:
                got = read_record(folder, name, real, 1)
                if isinstance(got, str) or got is None:
                    continue
                if got.locked:
                    held += got.claim.bytes
                else:  # its holder exited: host memory is freed at once
                    _unlink_quietly(folder, name)
        return held

    def hold_host(self, nbytes: int) -> int:
        """Take ``nbytes`` of host memory for the calling process (an engine's weights offloaded by a
        sleep); returns the fd that keeps it: closing it (or exiting) frees it. ServerFailed when the
        host lacks the room."""
        with self._memory_lock():
            total, available = self.host_memory()
            if nbytes > available:
                raise ServerFailed(f"simulated host is out of memory: tried to allocate {format_size(nbytes)} of "
                                   f"host memory; {format_size(total)} total, {format_size(available)} available")
            name = f"h.{os.urandom(8).hex()}{SUFFIX}"
            try:
                with self.subdir(HOSTMEM_DIR, create=True) as folder:
                    return create_record(folder, name, Claim(0, os.getpid(), None, nbytes, "compute"))
            except OSError as exc:
                raise _os_failure(f"cannot record host memory in {self.root / HOSTMEM_DIR}", exc) from None

    def _read_records(self, alloc: StateDir, problems: dict[int | None, list[str]]) -> list[RecordFile]:
        try:
            real = alloc.real_path()
            names = [n for n in sorted(alloc.names())  # not: being written, or a dead marker
                     if not n.startswith(".") and n.endswith(SUFFIX)]
            if len(names) > MAX_RECORDS:
                problems.setdefault(None, []).append(f"{self.alloc} has {len(names)} records, more than a "
                                                     f"host of {self.gpu_count} GPUs can hold ({MAX_RECORDS})")
                return []
            files: list[RecordFile] = []
            for name in names:
                got = read_record(alloc, name, real, self.gpu_count)
                if isinstance(got, str):
                    problems.setdefault(gpu_of_name(name), []).append(got)
                elif got is not None:
                    files.append(got)
            return files
        except OSError as exc:
            problems.setdefault(None, []).append(f"{self.alloc} cannot be read: {exc.strerror}")
            return []

    def _owners(self, live: list[RecordFile]) -> dict[str, Owner]:
        """The owner of each live record, from the host's /proc (see :func:`owner_of`):
        the lock owners first; the whole fd scan only for records they do not explain."""
        real_dev = self.real_dev
        locks = lock_owners(f.inode for f in live)
        facts: dict[int, LockFact] = {}
        for pid in set(locks.values()):
            st = read_stat(pid)
            targets = read_fd_targets(pid)
            wanted = {p for f in live if locks.get(f.inode) == pid for p in (f.path, f"{real_dev}/nvidia{f.claim.gpu}")}
            if targets is not None and not wanted <= targets:  # a thread with a file table of its own holds it?
                targets = read_fd_targets(pid, threads=True)  # the driver names the process, whichever thread
            facts[pid] = LockFact(pid, st.start_ticks if st else None, ticks_to_epoch(st.start_ticks) if st else None,
                                  targets)
        out: dict[str, Owner] = {}
        scan: FdScan | None = None
        starts: dict[int, int | None] = {}
        for f in live:
            device = f"{real_dev}/nvidia{f.claim.gpu}"
            lock = facts.get(locks.get(f.inode, 0))
            owner = owner_of(f, device, lock, None, starts)
            if owner is None:
                if scan is None:  # once, and only when needed
                    real_alloc = os.path.dirname(live[0].path)  # the walked folder's real path (read_record)
                    scan = scan_device_holders((real_alloc + "/", real_dev + "/nvidia"))
                    for pid in scan.holders:
                        st = read_stat(pid)
                        starts[pid] = st.start_ticks if st is not None else None
                owner = owner_of(f, device, lock, scan, starts)
            if owner is not None:
                out[f.path] = owner
        return out

    def _dead_owner(self, f: RecordFile) -> Owner | None:
        """Whom to name for memory still being released: never a process that is alive
        and not the one that held it (a reused pid, a false claim)."""
        seen = self._resolved.get(f.path)
        for pid, start in (seen or (None, None), (f.claim.claimed_pid, f.claim.claimed_start)):
            if pid is None:
                continue
            st = read_stat(pid)
            if st is None or (st.has_exited and st.start_ticks == start):
                return Owner(pid, start)
        return None

    def _dead_since(self, alloc: StateDir, name: str, now: float) -> float:
        """When the driver started releasing a dead holder's record: fixed by its first
        observer in a marker file; a reader that may not write one remembers it itself."""
        marker = name[: -len(SUFFIX)] + DEAD_SUFFIX
        seen = self._dead_seen.setdefault(name, now)
        try:
            fd = alloc.create(marker, os.O_WRONLY, 0o644)
        except OSError:  # another user's shared host: not ours to write
            return seen
        if fd is None:
            return min(_read_time(alloc, marker, seen), now)  # a time to come is no teardown start
        try:
            os.write(fd, repr(seen).encode())
        except OSError:  # a full disk: readers that find it empty use their own first sighting
            pass
        finally:
            os.close(fd)
        return seen


def _read_ckpt(folder: StateDir, name: str) -> CkptEntry | None:
    """One ``ckpt/`` file, or None when it is not one (bounded, never through a link)."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    try:
        fd = folder.open(name, os.O_RDONLY)
    except OSError:  # gone, a link, a FIFO: no entry
        return None
    try:
        uid = os.fstat(fd).st_uid
        data = os.read(fd, MAX_CKPT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_CKPT_BYTES:
        return None
    try:
        d = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    pid, start, state, records, nbytes = (d.get(k) for k in ("pid", "start_ticks", "state", "records", "bytes"))
    if (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or name != f"{pid}.json"
            or not isinstance(start, int) or isinstance(start, bool) or state not in CKPT_STATES
            or not isinstance(records, list) or not all(isinstance(r, str) for r in records)
            or not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0):
        return None
    return CkptEntry(pid, start, state, tuple(records), nbytes, uid)


def _config_problem(cfg: object) -> str | None:
    """What is wrong with a parsed ``host.json``, or ``None``: every field is
    checked here so that no later read can fail on a hand-edited or torn file."""
    if not isinstance(cfg, dict) or cfg.get("schema") != SCHEMA:
        return f"schema is not {SCHEMA}"

    def whole(key: str, low: int, high: int | None = None) -> bool:
        v = cfg.get(key)
        return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)

    if not whole("gpus", 1, 64):
        return "gpus must be a whole number from 1 to 64"
    if not whole("memory", 1):
        return "memory must be a positive number of bytes"
    if not whole("reserved", 0) or cfg["reserved"] >= cfg["memory"]:
        return "reserved must be a number of bytes below memory"
    delay = cfg.get("release_delay")
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 1e7:
        return "release_delay must be a number of seconds"
    for key in ("name", "driver_version"):
        if not isinstance(cfg.get(key), str):
            return f"{key} must be a string"
    uuids = cfg.get("uuids")
    if not isinstance(uuids, list) or len(uuids) != cfg["gpus"] or not all(isinstance(u, str) for u in uuids):
        return "uuids must list one string per GPU"
    if cfg.get("memory_api", "v2") not in MEMORY_APIS:
        return "memory_api must be v2 or v1"
    if "host_memory" in cfg and not whole("host_memory", 1):
        return "host_memory must be a positive number of bytes"
    return None


def _once_per_inode(files: list[RecordFile], resolved: dict[str, Owner]) -> list[RecordFile]:
    """A hard link to a record is the same memory: kept once, under the name its holder opened."""
    out: list[RecordFile] = []
    seen: set[tuple[int, int]] = set()
    for f in sorted(files, key=lambda f: f.path not in resolved):  # stable: named ones first
        if f.inode not in seen:
            seen.add(f.inode)
            out.append(f)
    return out


def _os_failure(what: str, exc: OSError) -> ServerFailed | PermissionDenied:
    """An OS refusal while holding memory, as one line: permission (5), else a failed start (6)."""
    why = exc.strerror or str(exc)  # a refusal of the walk (PermissionDenied) has its own message
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"{what}: {why}")
    return ServerFailed(f"{what}: {why}")


def _own(folder: StateDir) -> None:
    """``sim init`` resets only the caller's own folder: root too is refused another user's, whose
    contents (or links) that user chose."""
    uid = os.fstat(folder.fd).st_uid
    if uid != os.geteuid():
        raise PermissionDenied(f"{folder.path} is owned by uid {uid}, not by you (uid {os.geteuid()}): a simulated "
                               "host is reset only by the user who owns its folders",
                               hint="run 'gpuslate sim init' as that user, or use a folder of your own")


def _unlink_quietly(alloc: StateDir, name: str) -> bool:
    """Remove a file of the folder; ``False`` when it is not ours to remove (a sticky shared folder)."""
    try:
        alloc.unlink(name)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _read_time(alloc: StateDir, name: str, default: float) -> float:
    try:
        value = float(alloc.read(name, 64) or default)
    except (OSError, ValueError):  # not a regular file, more than a time, not a number
        return default
    return value if math.isfinite(value) else default
