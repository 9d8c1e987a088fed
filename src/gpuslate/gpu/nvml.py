"""The NVML backend: the only module that talks to the NVIDIA driver.

It calls the driver through :mod:`.libnvml` (a small ctypes binding), and every
error NVML returns becomes a gpuslate error in one place, :func:`_error` (through
the choke point :meth:`NvmlBackend._call`, or directly where the backend chooses
between API versions). Optional facts (utilization, temperature,
power) that a GPU does not support are ``None``; essential facts (memory,
processes) that fail make the GPU's ``error`` field non-null, never an empty
process list.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import BackendUnavailable, GpuQueryError, PermissionDenied
from ..proc.procfs import read_meminfo
from .libnvml import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_NO_PERMISSION,
    ERROR_NOT_SUPPORTED,
    Handle,
    Nvml,
    NvmlError,
)
from .types import CheckpointState, GpuProcess, GpuReading, HostMemory, MemoryApi, MemoryInfo, ProcessKind

# PIDs that some drivers report for contexts they cannot attribute
_INVALID_PIDS = frozenset({0, 4294967295})
# codes meaning "this driver lacks that version of the function": try an older one
_VERSION_ERRORS = frozenset({ERROR_FUNCTION_NOT_FOUND, ERROR_ARGUMENT_VERSION_MISMATCH})
_NO_DRIVER_HINT = ("set GPUSLATE_SIM=DIR or pass --sim DIR to use a simulated host "
                   "(create one with 'gpuslate sim init DIR')")

#: how the backend gets the driver library (tests substitute a double here)
open_library: Callable[[], Nvml] = Nvml


class _Early:
    """The outcome of :func:`start_early_init`: a backend, or why there is none."""

    def __init__(self) -> None:
        self.backend: NvmlBackend | None = None
        self.error: NvmlError | None = None
        self.thread: threading.Thread | None = None


_early: _Early | None = None


def start_early_init(*, prefetch: bool = False) -> None:
    """Open the driver on a background thread now: load the library, run
    ``nvmlInit``, take every GPU's handle and, with ``prefetch``, the first full
    reading of every GPU (``status`` shows nothing else).

    Initialisation (about 11 ms on an H200 host), the first handle of each GPU
    (about 7 ms each, taken on one thread per GPU) and the reading are C calls
    that run without the GIL, so they overlap the interpreter importing the
    rest of the command; :func:`open_nvml` then returns the backend ready.
    Harmless when no backend follows (a simulated host after all): the thread is
    a daemon and a missing driver is only reported if a backend is asked for.
    """
    global _early
    if _early is not None:
        return
    early = _early = _Early()

    def work() -> None:
        try:
            lib = open_library()
            lib.init()
        except NvmlError as exc:  # reported by open_nvml, if a backend is asked for
            early.error = exc
            return
        try:
            try:
                handles = _take_handles(lib, range(lib.device_count()))
            except NvmlError:
                handles = {}  # the backend asks again, and reports it
            backend = NvmlBackend(lib, initialised=True, handles=handles)
            if prefetch:
                backend.prefetch()
            early.backend = backend
        except Exception:  # noqa: BLE001 - never a traceback from a background thread:
            pass  # open_nvml starts over on the caller's thread, where errors are reported

    early.thread = threading.Thread(target=work, name="gpuslate-nvml-init", daemon=True)
    early.thread.start()


def open_nvml() -> NvmlBackend:
    """The backend :func:`start_early_init` opened (once), else a new one."""
    global _early
    early, _early = _early, None
    if early is not None and early.thread is not None:
        early.thread.join()
    if early is not None and early.error is not None:
        raise _unavailable(early.error)
    if early is not None and early.backend is not None:
        return early.backend
    return NvmlBackend()


def _unavailable(exc: NvmlError) -> BackendUnavailable:
    return BackendUnavailable(f"no NVIDIA driver available (NVML: {exc})", hint=_NO_DRIVER_HINT)


def _take_handles(lib: Nvml, indices: Sequence[int]) -> dict[int, Handle | NvmlError]:
    """The handles of ``indices``, one thread per GPU: the first handle of a GPU is
    the slow call (the driver attaches to the device), and GPUs attach in parallel."""
    out: dict[int, Handle | NvmlError] = {}

    def take(i: int) -> None:
        try:
            out[i] = lib.handle(i)
        except NvmlError as exc:
            out[i] = exc

    _each_in_parallel(take, list(indices))
    return out


def _each_in_parallel(fn: Callable[[int], None], items: list[int]) -> None:
    """``fn(item)`` for every item, on a thread each when there are several
    (NVML is thread-safe and its calls release the GIL)."""
    if len(items) < 2:
        for i in items:
            fn(i)
        return
    threads = [threading.Thread(target=fn, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


class NvmlBackend:
    """The GPUs as NVML reports them. ``library`` is the driver library (a double
    in tests), initialised here unless ``initialised``; ``handles`` are GPU
    handles (or the errors taking them) already taken."""

    name = "nvml"

    def __init__(self, library: Nvml | None = None, *, initialised: bool = False,
                 handles: dict[int, Handle | NvmlError] | None = None) -> None:
        try:
            self._nv = library if library is not None else open_library()
            if not initialised:
                self._nv.init()
        except NvmlError as exc:
            raise _unavailable(exc) from exc
        self._handles: dict[int, Handle | NvmlError] = dict(handles or {})
        self._minors: dict[int, int | None] = {}
        self._minor_to_index: dict[int, int] | None = None
        # API versions this driver lacks are remembered so each is tried once
        self._missing: set[str] = set()
        self._memory_api: MemoryApi | None = None
        self._prefetched: list[GpuReading] | None = None
        self._ckpt: Any = None  # the checkpoint API's choke point, made on first use

    def prefetch(self) -> None:
        """Take the full reading of every GPU now; the next full read of all or
        some of them returns it (once) instead of asking the driver again."""
        self._prefetched = self.read(None, full=True)

    @property
    def memory_api(self) -> MemoryApi:
        """"v2" when 'used' excludes driver-reserved memory, "v1" on drivers before R510.

        A capability of the open backend, known before any reading (the default
        --max-used of clear, wait and up depends on it); asked of the driver on
        first use rather than in __init__, so that `status`, which never needs
        it, does not pay for a query of GPU 0."""
        if self._memory_api is None:
            self._memory_api = self._detect_memory_api()
        return self._memory_api

    def _detect_memory_api(self) -> MemoryApi:
        """Ask GPU 0 for v2 memory info once; a version error means a v1 driver.

        Any other failure (no GPU, GPU 0 broken) says nothing about the API: v2 is
        assumed and a later read of a v1 driver's GPU still falls back per call.
        """
        try:
            if self.device_count() == 0:
                return "v2"
            self._nv.memory(self._handle(0), 2)
        except (GpuQueryError, PermissionDenied):
            return "v2"
        except NvmlError as exc:
            if exc.code in _VERSION_ERRORS | {ERROR_NOT_SUPPORTED}:
                self._missing.add("v2mem")
                return "v1"
        return "v2"

    # -- the choke point -------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        """One call of the binding; NVML's errors become gpuslate's."""
        try:
            return getattr(self._nv, method)(*args)
        except NvmlError as exc:
            raise _error(exc) from exc

    def _optional(self, method: str, *args: Any) -> Any:
        """A fact some GPUs lack: ``None`` instead of an error."""
        try:
            return self._call(method, *args)
        except (GpuQueryError, PermissionDenied):
            return None

    # -- backend protocol ------------------------------------------------
    def driver_version(self) -> str | None:
        return self._optional("driver_version")

    def device_count(self) -> int:
        return int(self._call("device_count"))

    def _handle(self, index: int) -> Handle:
        h = self._handles.get(index)
        if h is None:
            try:
                h = self._nv.handle(index)
            except NvmlError as exc:
                h = exc
            self._handles[index] = h
        if isinstance(h, NvmlError):
            raise _error(h)
        return h

    def device_prefixes(self) -> tuple[str, ...]:
        return ("/dev/nvidia",)

    def gpu_for_path(self, path: str) -> int | None:
        digits = path[len("/dev/nvidia"):] if path.startswith("/dev/nvidia") else ""
        if not (digits.isascii() and digits.isdigit()):
            return None  # nvidiactl, nvidia-uvm, nvidia-caps/...: no GPU of their own
        if self._minor_to_index is None:
            mapping: dict[int, int] = {}
            for i in range(self.device_count()):
                minor = self._minor(i)
                if minor is not None:
                    mapping[minor] = i
            self._minor_to_index = mapping
        return self._minor_to_index.get(int(digits))

    def _minor(self, index: int) -> int | None:
        if index not in self._minors:
            try:
                self._minors[index] = int(self._call("minor_number", self._handle(index)))
            except (GpuQueryError, PermissionDenied):
                self._minors[index] = None
        return self._minors[index]

    def read(self, indices: Sequence[int] | None = None, *, full: bool = True) -> list[GpuReading]:
        pre, self._prefetched = self._prefetched, None
        if indices is None:
            indices = range(self.device_count())
        indices = list(indices)
        if pre is not None and full:
            by_index = {r.index: r for r in pre}
            if all(i in by_index for i in indices):
                return [by_index[i] for i in indices]
        # one thread per GPU: a slow GPU (its first query attaches the driver to an
        # idle GPU without persistence mode) delays no other, and an 8-GPU host reads
        # as fast as a 1-GPU host; the threads write different keys of the caches
        out: dict[int, GpuReading] = {}

        def work(k: int) -> None:
            out[k] = self._read_one(indices[k], full)

        _each_in_parallel(work, list(range(len(indices))))
        return [out[k] if k in out else self._read_one(indices[k], full) for k in range(len(indices))]

    def _read_one(self, index: int, full: bool) -> GpuReading:
        errors: list[str] = []
        try:
            h = self._handle(index)
        except (GpuQueryError, PermissionDenied) as exc:
            return GpuReading(index=index, error=str(exc))
        util: list[int | None] = [None]
        slow = None
        if full:
            # the utilization query is the slowest (about 3 ms on an H200) and waits on
            # the GPU, not on the other queries: it runs beside them
            slow = threading.Thread(target=lambda: util.__setitem__(0, self._optional("utilization", h)))
            slow.start()
        memory = _guard(errors, lambda: self._memory(h))
        processes = _guard(errors, lambda: self._processes(h))
        uuid = name = pstate = None
        temp = None
        power = limit = None
        if full:
            uuid = self._optional("uuid", h)
            name = self._optional("name", h)
            temp = self._optional("temperature", h)
            p = self._optional("power_usage", h)
            power = p / 1000.0 if p is not None else None
            pl = self._optional("power_limit", h)
            limit = pl / 1000.0 if pl is not None else None
            ps = self._optional("performance_state", h)
            pstate = f"P{ps}" if ps is not None and ps != 32 else None  # 32: unknown
        if slow is not None:
            slow.join()
        return GpuReading(
            index=index, uuid=uuid, name=name, minor=self._minor(index) if full else None,
            memory=memory, utilization_pct=util[0], temperature_c=temp, power_w=power,
            power_limit_w=limit, pstate=pstate, processes=processes,
            error="; ".join(errors) if errors else None,
        )

    def _memory(self, h: Handle) -> MemoryInfo:
        # v2 separates driver-reserved memory from 'used' (v1 counts it as used)
        if "v2mem" not in self._missing:
            try:
                return MemoryInfo(*self._nv.memory(h, 2))
            except NvmlError as exc:
                if exc.code not in _VERSION_ERRORS | {ERROR_NOT_SUPPORTED}:
                    raise _error(exc) from exc
                self._missing.add("v2mem")
        self._memory_api = "v1"
        return MemoryInfo(*self._call("memory", h, 1))

    def _processes(self, h: Handle) -> list[GpuProcess]:
        found: dict[int, GpuProcess] = {}
        for kind in (ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.MPS):
            try:
                procs = self._newest("processes", kind, h)
            except NvmlError as exc:
                # MPS and graphics queries are unsupported on many setups;
                # a compute query failure is essential and propagates.
                if kind != ProcessKind.COMPUTE and exc.code == ERROR_NOT_SUPPORTED:
                    continue
                raise _error(exc) from exc
            for pid, used in procs:
                if pid in _INVALID_PIDS:
                    continue
                prev = found.get(pid)
                if prev is None:
                    found[pid] = GpuProcess(pid, kind, used)
                    continue
                # an MPS client is listed as compute and as MPS (nvidia-smi's "M+C"; the
                # server is compute only): it is an MPS client, with the larger figure
                figures = [u for u in (prev.used_memory, used) if u is not None]
                found[pid] = GpuProcess(pid, ProcessKind.MPS if ProcessKind.MPS in (kind, prev.kind) else prev.kind,
                                        max(figures) if figures else None)
        return sorted(found.values())

    def _newest(self, method: str, kind: str, h: Handle) -> Any:
        """Call the newest version of a function family this driver has (3, 2, then 1)."""
        last: NvmlError | None = None
        for version in (3, 2, 1):
            key = f"{kind} v{version}"
            if key in self._missing:
                continue
            try:
                return getattr(self._nv, method)(h, kind, version)
            except NvmlError as exc:
                if exc.code not in _VERSION_ERRORS:
                    raise
                self._missing.add(key)
                last = exc
        raise last if last is not None else NvmlError(ERROR_FUNCTION_NOT_FOUND, method)

    def host_memory(self) -> HostMemory | None:
        info = read_meminfo()
        return HostMemory(*info) if info is not None else None

    # the driver's checkpoint API is not NVML's: it goes through its own choke point, gpu/checkpoint.py
    # (cuda-core, the park extra), made on first use so that no other command imports it
    def _checkpoint_api(self) -> Any:
        if self._ckpt is None:
            from .checkpoint import CudaCheckpoint  # lazy: startup (only a park imports it)

            self._ckpt = CudaCheckpoint()
        return self._ckpt

    def checkpoint_state(self, pid: int) -> CheckpointState:
        state: CheckpointState = self._checkpoint_api().state(pid)
        return state

    def checkpoint_lock(self, pid: int, *, timeout_ms: int = 0) -> None:
        self._checkpoint_api().lock(pid, timeout_ms)

    def checkpoint(self, pid: int) -> None:
        self._checkpoint_api().checkpoint(pid)

    def checkpoint_restore(self, pid: int) -> None:
        self._checkpoint_api().restore(pid)

    def checkpoint_unlock(self, pid: int) -> None:
        self._checkpoint_api().unlock(pid)

    def close(self) -> None:
        try:
            self._nv.shutdown()
        except NvmlError:
            pass


def _error(exc: NvmlError) -> GpuQueryError | PermissionDenied:
    """NVML's error as gpuslate's: the function and the driver's message."""
    if exc.code == ERROR_NO_PERMISSION:
        return PermissionDenied(f"{exc.function}: {exc}")
    return GpuQueryError(f"{exc.function}: {exc}")


def _guard(errors: list[str], fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (GpuQueryError, PermissionDenied) as exc:
        errors.append(str(exc))
        return None


def nvml_library_present() -> bool:
    """Cheap check used by tests and the CLI: can the driver library be loaded?"""
    try:
        open_library()
    except NvmlError:
        return False
    return True
