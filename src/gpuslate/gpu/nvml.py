"""The NVML backend: the only module that talks to the NVIDIA driver.

Every NVML call goes through :func:`_call`, the single choke point that turns
``NVMLError`` into gpuslate errors. Optional facts (utilization, temperature,
power) that a GPU does not support are ``None``; essential facts (memory,
processes) that fail make the GPU's ``error`` field non-null, never an empty
process list.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from ..errors import BackendUnavailable, GpuQueryError, PermissionDenied
from .types import GpuProcess, GpuReading, MemoryApi, MemoryInfo

# PIDs that some drivers report for contexts they cannot attribute
_INVALID_PIDS = frozenset({0, 4294967295})
_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise BackendUnavailable(
            "the nvidia-ml-py package is not installed", hint="pip install nvidia-ml-py"
        ) from exc
    return pynvml


# nvmlInit started ahead of need (see start_early_init): (thread, [(pynvml or None, error or None)])
_early: tuple[Any, list[tuple[Any, BaseException | None]]] | None = None


def start_early_init() -> None:
    """Load the driver library and run ``nvmlInit`` on a background thread now.

    The driver's initialisation is tens of milliseconds of C code that releases
    the GIL, so it overlaps the interpreter importing the rest of the command;
    the next :class:`NvmlBackend` picks up the result instead of initialising
    again. Harmless when no backend follows (a simulated host after all): the
    thread is a daemon and a missing driver is only reported if a backend asks.
    """
    global _early
    if _early is not None:
        return
    import threading

    result: list[tuple[Any, BaseException | None]] = []

    def work() -> None:
        nv = None
        try:
            nv = _import_pynvml()
            nv.nvmlInit()
            result.append((nv, None))
        except BaseException as exc:  # handed to the backend that asks for it
            result.append((nv, exc))

    thread = threading.Thread(target=work, name="gpuslate-nvml-init", daemon=True)
    thread.start()
    _early = (thread, result)


def _take_early() -> tuple[Any, BaseException | None] | None:
    """The early initialisation's outcome, once (later backends initialise themselves)."""
    global _early
    if _early is None:
        return None
    thread, result = _early
    _early = None
    thread.join()
    return result[0] if result else None


class NvmlBackend:
    name = "nvml"

    def __init__(self) -> None:
        early = _take_early()  # (pynvml, its nvmlInit error) when start_early_init ran
        if early is not None and early[0] is None:  # pynvml itself could not be imported
            raise early[1]  # type: ignore[misc]
        self._nv = nv = early[0] if early is not None else _import_pynvml()
        try:
            if early is None:
                nv.nvmlInit()
            elif early[1] is not None:
                raise early[1]
        except nv.NVMLError as exc:
            raise BackendUnavailable(
                f"no NVIDIA driver available (NVML: {_describe(exc)})",
                hint="set GPUSLATE_SIM=DIR or pass --sim DIR to use a simulated host "
                "(create one with 'gpuslate sim init DIR')",
            ) from exc
        self._handles: dict[int, Any] = {}
        self._minors: dict[int, int | None] = {}
        self._minor_to_index: dict[int, int] | None = None
        # API versions this driver lacks are remembered so each is tried once
        self._missing: set[str] = set()
        self._version_errors = frozenset(
            getattr(nv, n) for n in ("NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
            if hasattr(nv, n)
        )
        self._memory_api: MemoryApi | None = None

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
        nv = self._nv
        if not hasattr(nv, "nvmlMemory_v2"):
            return "v1"  # an nvidia-ml-py too old to ask for v2
        try:
            if int(nv.nvmlDeviceGetCount()) == 0:
                return "v2"
            nv.nvmlDeviceGetMemoryInfo(self._handle(0), version=nv.nvmlMemory_v2)
        except (GpuQueryError, PermissionDenied):
            return "v2"
        except nv.NVMLError as exc:
            if exc.value in self._version_errors | {nv.NVML_ERROR_NOT_SUPPORTED}:
                self._missing.add("v2mem")
                return "v1"
        return "v2"

    # -- the choke point -------------------------------------------------
    def _call(self, fn_name: str, *args: Any) -> Any:
        nv = self._nv
        try:
            return getattr(nv, fn_name)(*args)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_NO_PERMISSION:
                raise PermissionDenied(f"{fn_name}: {_describe(exc)}") from exc
            raise GpuQueryError(f"{fn_name}: {_describe(exc)}") from exc

    def _optional(self, fn_name: str, *args: Any) -> Any:
        """A fact some GPUs lack: ``None`` instead of an error."""
        try:
            return self._call(fn_name, *args)
        except (GpuQueryError, PermissionDenied):
            return None

    def _first_available(self, names: Sequence[str], *args: Any) -> Any:
        """Call the newest API version this driver has (``_v3`` -> ``_v2`` -> v1)."""
        nv = self._nv
        last: BaseException | None = None
        for fn_name in names:
            if fn_name in self._missing or not hasattr(nv, fn_name):
                continue
            try:
                return getattr(nv, fn_name)(*args)
            except nv.NVMLError as exc:
                if exc.value in self._version_errors:
                    self._missing.add(fn_name)
                    last = exc
                    continue
                raise GpuQueryError(f"{fn_name}: {_describe(exc)}") from exc
        raise GpuQueryError(f"{names[-1]}: {_describe(last) if last else 'not available'}")

    # -- backend protocol ------------------------------------------------
    def driver_version(self) -> str | None:
        v = self._optional("nvmlSystemGetDriverVersion")
        return v.decode() if isinstance(v, bytes) else v

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return h

    def device_prefixes(self) -> tuple[str, ...]:
        return ("/dev/nvidia",)

    def gpu_for_path(self, path: str) -> int | None:
        m = re.fullmatch(r"/dev/nvidia(\d+)", path)
        if not m:
            return None
        if self._minor_to_index is None:
            mapping: dict[int, int] = {}
            for i in range(self.device_count()):
                minor = self._minor(i)
                if minor is not None:
                    mapping[minor] = i
            self._minor_to_index = mapping
        return self._minor_to_index.get(int(m.group(1)))

    def _minor(self, index: int) -> int | None:
        if index not in self._minors:
            try:
                self._minors[index] = int(self._call("nvmlDeviceGetMinorNumber", self._handle(index)))
            except (GpuQueryError, PermissionDenied):
                self._minors[index] = None
        return self._minors[index]

    def read(self, indices: Sequence[int] | None = None, *, full: bool = True) -> list[GpuReading]:
        if indices is None:
            indices = range(self.device_count())
        indices = list(indices)
        if len(indices) < 2:
            return [self._read_one(i, full) for i in indices]
        # NVML is thread-safe and its calls release the GIL; reading GPUs in
        # parallel keeps an 8-GPU host as fast to read as a 1-GPU host. Each
        # thread also takes its GPU's handle: the first query of a GPU can be
        # slow (an idle GPU without persistence mode is initialised by it), and
        # the threads write different keys of the handle cache.
        import threading

        out: list[GpuReading | None] = [None] * len(indices)

        def work(k: int) -> None:
            out[k] = self._read_one(indices[k], full)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(len(indices))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [r if r is not None else self._read_one(indices[k], full) for k, r in enumerate(out)]

    def _read_one(self, index: int, full: bool) -> GpuReading:
        errors: list[str] = []
        try:
            h = self._handle(index)
        except (GpuQueryError, PermissionDenied) as exc:
            return GpuReading(index, None, None, None, None, None, None, None, None, None, None, str(exc))
        memory = _guard(errors, lambda: self._memory(h))
        processes = _guard(errors, lambda: self._processes(h))
        uuid = name = pstate = None
        util = temp = None
        power = limit = None
        if full:
            uuid = _text(self._optional("nvmlDeviceGetUUID", h))
            name = _text(self._optional("nvmlDeviceGetName", h))
            rates = self._optional("nvmlDeviceGetUtilizationRates", h)
            util = int(rates.gpu) if rates is not None else None
            t = self._optional("nvmlDeviceGetTemperature", h, self._nv.NVML_TEMPERATURE_GPU)
            temp = int(t) if t is not None else None
            p = self._optional("nvmlDeviceGetPowerUsage", h)
            power = p / 1000.0 if p is not None else None
            pl = self._optional("nvmlDeviceGetEnforcedPowerLimit", h)
            limit = pl / 1000.0 if pl is not None else None
            ps = self._optional("nvmlDeviceGetPerformanceState", h)
            pstate = f"P{int(ps)}" if ps is not None and int(ps) != 32 else None
        return GpuReading(
            index=index, uuid=uuid, name=name, minor=self._minor(index) if full else None,
            memory=memory, utilization_pct=util, temperature_c=temp, power_w=power,
            power_limit_w=limit, pstate=pstate, processes=processes,
            error="; ".join(errors) if errors else None,
        )

    def _memory(self, h: Any) -> MemoryInfo:
        nv = self._nv
        # v2 separates driver-reserved memory from 'used' (v1 counts it as used)
        if "v2mem" not in self._missing and hasattr(nv, "nvmlMemory_v2"):
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
                return MemoryInfo(int(m.total), int(m.used), int(m.reserved), int(m.free))
            except nv.NVMLError as exc:
                if exc.value not in self._version_errors | {nv.NVML_ERROR_NOT_SUPPORTED}:
                    raise GpuQueryError(f"nvmlDeviceGetMemoryInfo_v2: {_describe(exc)}") from exc
                self._missing.add("v2mem")
        self._memory_api = "v1"
        m = self._call("nvmlDeviceGetMemoryInfo", h)
        return MemoryInfo(int(m.total), int(m.used), 0, int(m.free))

    def _processes(self, h: Any) -> list[GpuProcess]:
        found: dict[int, GpuProcess] = {}
        for kind, base in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            ("mps", "nvmlDeviceGetMPSComputeRunningProcesses"),
        ):
            try:
                procs = self._first_available((f"{base}_v3", f"{base}_v2", base), h)
            except GpuQueryError as exc:
                # MPS and graphics queries are unsupported on many setups;
                # a compute query failure is essential and propagates.
                if kind != "compute" and "Not Supported" in str(exc):
                    continue
                raise
            for p in procs:
                pid = int(p.pid)
                if pid in _INVALID_PIDS:
                    continue
                used = p.usedGpuMemory
                used = None if used is None or used == _NOT_AVAILABLE else int(used)
                prev = found.get(pid)
                # a process can appear as compute and as MPS; keep the larger figure
                if prev is None or (used or 0) > (prev.used_memory or 0):
                    found[pid] = GpuProcess(pid, kind, used)
        return sorted(found.values())

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._nv.NVMLError:
            pass


def _guard(errors: list[str], fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except (GpuQueryError, PermissionDenied) as exc:
        errors.append(str(exc))
        return None


def _text(v: Any) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml can fail to format unknown codes
        return repr(exc)


def nvml_library_present() -> bool:
    """Cheap check used by tests and the CLI: can the driver library be loaded?"""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
