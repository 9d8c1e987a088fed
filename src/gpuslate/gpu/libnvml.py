"""The NVIDIA Management Library through ctypes: the calls gpuslate makes, and no others.

Why not ``nvidia-ml-py`` (``pynvml``): it binds the whole library in one 8,000-line
module. Importing it is 10-20 ms with its bytecode cached and about 100 ms
without (a read-only image, ``PYTHONDONTWRITEBYTECODE``), and every ``status``
and ``clear`` would pay that before its first NVML call. This module binds about
twenty functions and costs only the import of ``ctypes``.

Each method is one NVML function (or one family of versions of it, chosen by the
``version`` argument), returns plain Python values and raises :class:`NvmlError`
with the driver's return code. Which version to try, and what a failure means,
is decided by the backend (:mod:`.nvml`), the one place that interprets them.

The structure layouts are those of ``nvml.h`` (R510 and later for the ``_v2``
and ``_v3`` functions, earlier drivers for the unversioned ones).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from ctypes import Structure, byref, c_char_p, c_int, c_uint, c_ulonglong, c_void_p
from typing import Any

#: return codes of nvml.h used by gpuslate (the others are reported by number and message)
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_INSUFFICIENT_SIZE = 7
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

#: messages for codes the library cannot describe itself (it is not loaded, or is too old)
_MESSAGES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 8: "Insufficient External Power",
    9: "Driver Not Loaded", 10: "Timeout", 11: "Interrupt Request Issue", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 14: "Corrupted infoROM", 15: "GPU is lost", 16: "GPU requires restart",
    17: "The operating system has blocked the request", 18: "RM has detected an NVML/RM version mismatch",
    19: "In use by another client", 20: "Insufficient Memory", 21: "No data", 25: "Argument version mismatch",
    27: "Not Ready", 28: "GPU not found", 999: "Unknown Error",
}

TEMPERATURE_GPU = 0
#: the driver's "not available" for a 64-bit figure (a process's memory on some setups)
VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF
_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE, the largest of the string buffers used here

#: process kinds -> the NVML function family that lists them
PROCESS_FUNCTIONS = {
    "compute": "nvmlDeviceGetComputeRunningProcesses",
    "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
    "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
}


class NvmlError(Exception):
    """An NVML function returned ``code``; ``function`` is its name."""

    def __init__(self, code: int, function: str, message: str | None = None) -> None:
        super().__init__(code, function)
        self.code = code
        self.function = function
        self.message = message or _MESSAGES.get(code, f"error {code}")

    def __str__(self) -> str:
        return self.message


class _Memory(Structure):  # nvmlMemory_t
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class _MemoryV2(Structure):  # nvmlMemory_v2_t: 'used' excludes driver-reserved memory
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong),
                ("free", c_ulonglong), ("used", c_ulonglong)]


_MEMORY_V2 = ctypes.sizeof(_MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2) = 0x02000028


class _ProcessV1(Structure):  # nvmlProcessInfo_v1_t (the unversioned functions)
    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong)]


class _ProcessV2(Structure):  # nvmlProcessInfo_v2_t, also what the _v3 functions fill
    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong), ("gpuInstanceId", c_uint),
                ("computeInstanceId", c_uint)]


class _Utilization(Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


Handle = c_void_p


class Nvml:
    """``libnvidia-ml.so.1``, loaded. Thread-safe as NVML is: ctypes releases the
    GIL around every call, so calls on several GPUs run in parallel."""

    def __init__(self, path: str = "libnvidia-ml.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvmlError(ERROR_LIBRARY_NOT_FOUND, "dlopen", f"NVML Shared Library Not Found ({exc})") from exc
        self._functions: dict[str, Callable[..., int]] = {}

    def _fn(self, name: str) -> Callable[..., int]:
        fn = self._functions.get(name)
        if fn is None:
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise NvmlError(ERROR_FUNCTION_NOT_FOUND, name) from None
            fn.restype = c_int
            self._functions[name] = fn
        return fn

    def _check(self, name: str, *args: Any) -> None:
        rc = self._fn(name)(*args)
        if rc != SUCCESS:
            raise NvmlError(rc, name, self._describe(rc))

    def _describe(self, code: int) -> str | None:
        try:
            fn = self._lib.nvmlErrorString
        except AttributeError:
            return None
        fn.restype = c_char_p
        text = fn(c_int(code))
        return text.decode(errors="replace") if text else None

    # -- the library -----------------------------------------------------
    def init(self) -> None:
        try:
            self._check("nvmlInit_v2")
        except NvmlError as exc:
            if exc.code != ERROR_FUNCTION_NOT_FOUND:
                raise
            self._check("nvmlInit")  # drivers before the _v2 entry point (R319)

    def shutdown(self) -> None:
        self._check("nvmlShutdown")

    def driver_version(self) -> str:
        return self._string("nvmlSystemGetDriverVersion")

    def device_count(self) -> int:
        n = c_uint()
        self._check("nvmlDeviceGetCount_v2", byref(n))
        return n.value

    def handle(self, index: int) -> Handle:
        h = Handle()
        self._check("nvmlDeviceGetHandleByIndex_v2", c_uint(index), byref(h))
        return h

    # -- one device --------------------------------------------------------
    def minor_number(self, h: Handle) -> int:
        return self._uint("nvmlDeviceGetMinorNumber", h)

    def uuid(self, h: Handle) -> str:
        return self._string("nvmlDeviceGetUUID", h)

    def name(self, h: Handle) -> str:
        return self._string("nvmlDeviceGetName", h)

    def utilization(self, h: Handle) -> int:
        u = _Utilization()
        self._check("nvmlDeviceGetUtilizationRates", h, byref(u))
        return int(u.gpu)

    def temperature(self, h: Handle) -> int:
        t = c_uint()
        self._check("nvmlDeviceGetTemperature", h, c_int(TEMPERATURE_GPU), byref(t))
        return t.value

    def power_usage(self, h: Handle) -> int:
        """Milliwatts."""
        return self._uint("nvmlDeviceGetPowerUsage", h)

    def power_limit(self, h: Handle) -> int:
        """Milliwatts."""
        return self._uint("nvmlDeviceGetEnforcedPowerLimit", h)

    def performance_state(self, h: Handle) -> int:
        """0-15 (P0-P15); 32 is "unknown"."""
        return self._uint("nvmlDeviceGetPerformanceState", h)

    def memory(self, h: Handle, version: int) -> tuple[int, int, int, int]:
        """(total, used, reserved, free) in bytes. Version 1 counts driver-reserved
        memory as used and reports no reserved figure (0)."""
        if version == 2:
            m2 = _MemoryV2(version=_MEMORY_V2)
            self._check("nvmlDeviceGetMemoryInfo_v2", h, byref(m2))
            return int(m2.total), int(m2.used), int(m2.reserved), int(m2.free)
        m = _Memory()
        self._check("nvmlDeviceGetMemoryInfo", h, byref(m))
        return int(m.total), int(m.used), 0, int(m.free)

    def processes(self, h: Handle, kind: str, version: int) -> list[tuple[int, int | None]]:
        """(pid, used bytes or None when the driver does not say) of each process of
        ``kind`` (compute, graphics, mps) with a context on the GPU, through the
        function family's ``_v3``, ``_v2`` or unversioned (1) entry point."""
        base = PROCESS_FUNCTIONS[kind]
        name = base if version == 1 else f"{base}_v{version}"
        struct = _ProcessV1 if version == 1 else _ProcessV2
        fn = self._fn(name)
        count = c_uint(0)
        buf: Any = None
        rc = fn(h, byref(count), None)  # how many (SUCCESS with 0: none)
        for _ in range(8):  # the list can grow between two calls: ask again with more room
            if rc == SUCCESS and (buf is not None or count.value == 0):
                break
            if rc not in (SUCCESS, ERROR_INSUFFICIENT_SIZE):
                raise NvmlError(rc, name, self._describe(rc))
            count.value = count.value * 2 + 5  # room for processes started meanwhile
            buf = (struct * count.value)()
            rc = fn(h, byref(count), buf)
        else:
            raise NvmlError(ERROR_INSUFFICIENT_SIZE, name, self._describe(ERROR_INSUFFICIENT_SIZE))
        if buf is None:
            return []
        out = []
        for i in range(count.value):
            used = int(buf[i].usedGpuMemory)
            out.append((int(buf[i].pid), None if used == VALUE_NOT_AVAILABLE else used))
        return out

    # -- helpers -------------------------------------------------------------
    def _uint(self, name: str, *args: Any) -> int:
        v = c_uint()
        self._check(name, *args, byref(v))
        return v.value

    def _string(self, name: str, *args: Any) -> str:
        buf = ctypes.create_string_buffer(_BUFFER)
        self._check(name, *args, buf, c_uint(_BUFFER))
        return buf.value.decode(errors="replace")
