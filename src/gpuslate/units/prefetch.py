"""Weight prefetch: read the next server's model files into the page cache while the
old server still serves, so that the new one's start reads memory, not disk.

A swap's downtime (nothing serves) runs from stopping the old server until the
new one is ready, and a model server's start is often mostly reading its
weights. Reading them *before* the old server is stopped moves that time out
of the downtime. The files come from the unit's ``prefetch`` list or, without
one, from its command: the value of ``--model-path`` / ``--model`` /
``--model-dir`` (SGLang, vLLM) or a positional folder holding weights (``vllm
serve DIR``, ``transformers serve DIR``), when it exists on this host.

The page cache is only a cache: prefetching more than the host's available
memory (``MemAvailable``) would evict the first files before the server reads
them, and push out the memory of running processes' files. Such a prefetch is
skipped, with a warning, rather than done in part.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .._document import Fields
from .._parse import format_size
from .._time import iso_time
from ..proc.procfs import read_meminfo

#: options whose value names the model (SGLang, vLLM, TGI, llama.cpp-style servers)
MODEL_OPTIONS = ("--model-path", "--model", "--model-dir", "--model-id", "--weights")
#: files that make a folder named positionally a model folder
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz")
#: fraction of MemAvailable a prefetch may fill: the rest stays for everything else on the host
FIT_FRACTION = 0.9
CHUNK = 16 * 1024 * 1024  # large sequential reads: what disks and readahead like best

class PrefetchStatus(str, Enum):
    DONE = "done"
    SKIPPED = "skipped"
    PARTIAL = "partial"
    FAILED = "failed"
    NONE = "none"


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefetchPlan:
    """What a prefetch would read, and whether it may (a pure decision on gathered facts)."""

    paths: list[str]  # the folders/files named by the unit
    files: list[tuple[str, int]]  # (file, size), each once
    total: int
    available: int | None  # bytes the page cache may take (MemAvailable, or the injected bound)
    fits: bool
    warning: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefetchReport:
    status: PrefetchStatus
    plan: PrefetchPlan
    read_bytes: int
    started_at: float | None  # epoch
    finished_at: float | None
    error: str | None

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    def to_json(self) -> dict[str, Any]:
        p = self.plan
        return {"status": PrefetchStatus(self.status).value, "paths": p.paths, "files": len(p.files), "bytes": p.total,
                "read_bytes": self.read_bytes, "available": p.available, "warning": p.warning,
                "error": self.error,
                "started_at": iso_time(self.started_at) if self.started_at else None,
                "finished_at": iso_time(self.finished_at) if self.finished_at else None,
                "seconds": round(self.seconds, 4) if self.seconds is not None else None}

    @classmethod
    def from_json(cls, d: object) -> PrefetchReport:
        """The prefetch of a swap document: its files are counted there, not named (placeholders here:
        as many as it counts, at most :data:`MAX_FILES_SHOWN`); every field checked."""
        f = Fields(d)
        warning = f.opt_text("warning")
        plan = PrefetchPlan(paths=f.texts("paths"), files=[("", 0)] * f.integer("files", 0, MAX_FILES_SHOWN),
                            total=f.size("bytes"), available=f.opt_size("available"), fits=warning is None,
                            warning=warning)
        return cls(status=f.choice("status", PrefetchStatus), plan=plan, read_bytes=f.size("read_bytes"),
                   started_at=f.opt_time("started_at"), finished_at=f.opt_time("finished_at"),
                   error=f.opt_text("error"))


#: the most files a prefetch read back from a document may count (a count, not a list: a peer's
#: 10**18 would otherwise be a list that long)
MAX_FILES_SHOWN = 1_000_000


def model_paths(command: Sequence[str], *, exists: Callable[[str], bool],
                is_model_dir: Callable[[str], bool]) -> list[str]:
    """The model locations a server command names: the value of a :data:`MODEL_OPTIONS`
    option when it exists, and any argument (or ``--option=value``) that is a folder
    holding weight files (``vllm serve DIR``, a draft model's folder). Pure: the file
    system is asked only through ``exists`` and ``is_model_dir``."""
    found: list[str] = []
    args = list(command)

    def add(p: str) -> None:
        if p not in found:
            found.append(p)

    for i, arg in enumerate(args[1:], start=1):  # args[0] is the program
        name, eq, inline = arg.partition("=")
        if name in MODEL_OPTIONS:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if value and exists(value):
                add(value)
        elif arg.startswith("-"):
            if eq and inline and is_model_dir(inline):
                add(inline)
        elif is_model_dir(arg):
            add(arg)
    return found


def _is_model_dir(path: str) -> bool:
    try:
        return os.path.isdir(path) and any(n.endswith(WEIGHT_SUFFIXES) for n in os.listdir(path))
    except OSError:
        return False


def _files_of(paths: Iterable[str]) -> list[tuple[str, int]]:
    """Every regular file under ``paths`` (symlinks followed, as a server reading them does: the
    Hugging Face cache links snapshot files to blobs), each real file once."""
    seen: set[str] = set()
    out: list[tuple[str, int]] = []

    def add(path: str) -> None:
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
        except OSError:
            return
        if real not in seen and os.path.isfile(real):
            seen.add(real)
            out.append((real, st.st_size))

    for p in paths:
        if os.path.isdir(p):
            for dirpath, _dirs, names in os.walk(p, followlinks=True):
                for n in sorted(names):
                    add(os.path.join(dirpath, n))
        else:
            add(p)
    return out


def mem_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes: what can be cached without swapping."""
    info = read_meminfo()
    return info[1] if info is not None else None


def decide(paths: list[str], files: list[tuple[str, int]], available: int | None) -> PrefetchPlan:
    """Prefetch only what fits in the page cache as a whole (a partial prefetch evicts itself)."""
    total = sum(size for _, size in files)
    if not files:
        return PrefetchPlan(paths=paths, files=files, total=total, available=available, fits=False, warning=None)
    if available is None:
        return PrefetchPlan(paths=paths, files=files, total=total, available=None, fits=False,
                            warning="prefetch skipped: the available memory is unknown (/proc/meminfo)")
    if total > FIT_FRACTION * available:
        return PrefetchPlan(paths=paths, files=files, total=total, available=available, fits=False,
                            warning=f"prefetch skipped: {format_size(total)} of weights would not fit in the page "
                            f"cache ({format_size(available)} available)")
    return PrefetchPlan(paths=paths, files=files, total=total, available=available, fits=True, warning=None)


def plan_prefetch(command: Sequence[str], explicit: Sequence[str] | None, *, cwd: str | None = None,
                  available: int | None = None) -> PrefetchPlan:
    """Gather the facts (which files, how much memory) and decide. ``explicit`` (the unit's
    ``prefetch`` list) replaces detection; ``[]`` turns it off. Relative paths are taken
    from the unit's working directory, as the server itself would. ``available`` overrides
    MemAvailable (tests; hosts that want a tighter bound)."""
    base = cwd or os.getcwd()

    def full(p: str) -> str:
        return os.path.join(base, os.path.expanduser(p))

    if explicit is not None:
        paths = [full(p) for p in explicit if os.path.exists(full(p))]
    else:
        paths = [full(p) for p in model_paths(command, exists=lambda p: os.path.exists(full(p)),
                                              is_model_dir=lambda p: _is_model_dir(full(p)))]
    files = _files_of(paths)
    return decide(paths, files, available if available is not None else mem_available())


class Prefetch:
    """Reads a plan's files in a background thread; :meth:`wait` returns the report."""

    def __init__(self, plan: PrefetchPlan) -> None:
        self.plan = plan
        self._read = 0
        self._error: str | None = None
        self._started: float | None = None
        self._finished: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if plan.fits:
            # a daemon: a prefetch never keeps a process alive that has finished its swap
            self._thread = threading.Thread(target=self._run, name="gpuslate-prefetch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        self._started = time.time()
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        path = ""
        try:
            for path, _size in self.plan.files:  # let the kernel start reading every file at once
                fd = _open_regular(path)
                try:
                    if hasattr(os, "posix_fadvise"):
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
            for path, _size in self.plan.files:  # then read every byte, so that all of it is cached
                fd = _open_regular(path)
                try:
                    while not self._stop.is_set():
                        n = os.readv(fd, [view])
                        if n <= 0:
                            break
                        self._read += n
                finally:
                    os.close(fd)
                if self._stop.is_set():
                    break
        except OSError as exc:
            self._error = f"{path}: {exc.strerror or exc}"
        finally:
            self._finished = time.time()

    def wait(self, timeout: float | None = None) -> PrefetchReport:
        """Wait up to ``timeout`` seconds; a prefetch still running then is reported ``partial``
        and goes on in the background (what it has read still helps)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.report()

    def cancel(self) -> None:
        self._stop.set()

    def report(self) -> PrefetchReport:
        p = self.plan
        if self._thread is None:
            status = PrefetchStatus.SKIPPED if p.warning else PrefetchStatus.NONE
        elif self._error:
            status = PrefetchStatus.FAILED
        elif self._thread.is_alive() or self._read < p.total:
            status = PrefetchStatus.PARTIAL
        else:
            status = PrefetchStatus.DONE
        return PrefetchReport(status=status, plan=p, read_bytes=self._read, started_at=self._started,
                              finished_at=None if self._thread is not None and self._thread.is_alive()
                              else self._finished, error=self._error)


def _open_regular(path: str) -> int:
    """A model file, opened to be read: never blocking (a FIFO swapped in after the plan was made),
    and only a regular file (a device would never end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd
