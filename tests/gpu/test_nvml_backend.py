"""The NVML backend's choke point against a driver double.

These tests pin the behaviour a real driver cannot be made to show on demand:
API-version fallbacks, invalid PIDs, a failing query on one GPU. The real
driver is exercised by the ``gpu``-marked tests in test_nvml_real.py.
"""

from __future__ import annotations

import sys
import types

import pytest

from gpuslate.errors import BackendUnavailable
from gpuslate.gpu.nvml import NvmlBackend

GiB = 1024**3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {13: "Function Not Found", 3: "Not Supported", 12: "Library Not Found",
                999: "Unknown Error", 4: "Insufficient Permissions"}.get(self.value, str(self.value))


def fake_pynvml(gpus: int = 2, *, v2_memory: bool = True, v3_procs: bool = True, broken: set[int] = frozenset(),
                init_error: int | None = None) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_ERROR_NO_PERMISSION = 4
    nv.NVML_ERROR_FUNCTION_NOT_FOUND = 13
    nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
    nv.NVML_ERROR_NOT_SUPPORTED = 3
    nv.NVML_TEMPERATURE_GPU = 0
    nv.nvmlMemory_v2 = 0x02000028
    calls: list[str] = []
    nv.calls = calls

    def init():
        if init_error is not None:
            raise NVMLError(init_error)

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: "580.159.03"
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetMinorNumber = lambda h: h
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=7, memory=1)
    nv.nvmlDeviceGetTemperature = lambda h, s: 30

    def power(h):
        raise NVMLError(3)  # not supported: an optional fact, not an error

    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    nv.nvmlDeviceGetPerformanceState = lambda h: 0

    def memory(h, version=None):
        calls.append(f"mem v{2 if version else 1}")
        if version:
            if not v2_memory:
                raise NVMLError(13)
            return types.SimpleNamespace(total=140 * GiB, used=0, reserved=645 * 1024**2, free=140 * GiB - 645 * 1024**2)
        return types.SimpleNamespace(total=140 * GiB, used=645 * 1024**2, free=140 * GiB - 645 * 1024**2)

    nv.nvmlDeviceGetMemoryInfo = memory

    def procs(kind, version):
        def fn(h):
            calls.append(f"{kind} {version}")
            if h in broken and kind == "compute":
                raise NVMLError(999)
            if version == "v3" and not v3_procs:
                raise NVMLError(13)
            if kind == "compute":
                return [types.SimpleNamespace(pid=1234, usedGpuMemory=10 * GiB),
                        types.SimpleNamespace(pid=0, usedGpuMemory=GiB),
                        types.SimpleNamespace(pid=4294967295, usedGpuMemory=GiB)]
            if kind == "mps":
                return [types.SimpleNamespace(pid=777, usedGpuMemory=None)]
            raise NVMLError(3)

        return fn

    for kind, base in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                       ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
                       ("mps", "nvmlDeviceGetMPSComputeRunningProcesses")):
        setattr(nv, f"{base}_v3", procs(kind, "v3"))
        setattr(nv, f"{base}_v2", procs(kind, "v2"))
        setattr(nv, base, procs(kind, "v1"))
    return nv


def backend(monkeypatch, **kw) -> tuple[NvmlBackend, types.ModuleType]:
    nv = fake_pynvml(**kw)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    return NvmlBackend(), nv


def test_v2_memory_separates_reserved(monkeypatch):
    b, _ = backend(monkeypatch)
    (r,) = b.read([0])
    assert r.memory.used == 0 and r.memory.reserved == 645 * 1024**2
    assert r.error is None and r.name == "NVIDIA H200" and r.pstate == "P0"
    assert r.power_w is None and r.power_limit_w == 700.0  # unsupported power is not an error


def test_v1_memory_fallback(monkeypatch):
    b, nv = backend(monkeypatch, v2_memory=False)
    b.read([0, 1])
    (r,) = b.read([0])
    assert r.memory.used == 645 * 1024**2 and r.memory.reserved == 0
    assert nv.calls.count("mem v2") == 1  # the missing API is tried once, then remembered


def test_memory_api_is_known_when_the_backend_opens(monkeypatch):
    from gpuslate.host.session import DEFAULT_MAX_USED_V1, DEFAULT_MAX_USED_V2, default_max_used

    old, nv = backend(monkeypatch, v2_memory=False)
    # before any read: the default --max-used of clear/wait/up is decided from this
    assert old.memory_api == "v1" and default_max_used(old) == DEFAULT_MAX_USED_V1
    assert nv.calls == ["mem v2"]
    new, nv = backend(monkeypatch)
    assert new.memory_api == "v2" and default_max_used(new) == DEFAULT_MAX_USED_V2
    none, _ = backend(monkeypatch, gpus=0)
    assert none.memory_api == "v2"


def test_process_api_fallback_and_invalid_pids(monkeypatch):
    b, nv = backend(monkeypatch, v3_procs=False)
    (r,) = b.read([0])
    pids = {p.pid: p for p in r.processes}
    assert set(pids) == {1234, 777}  # 0 and 4294967295 rejected
    assert pids[1234].used_memory == 10 * GiB and pids[1234].kind == "compute"
    assert pids[777].kind == "mps" and pids[777].used_memory is None
    assert "compute v2" in nv.calls
    nv.calls.clear()
    b.read([1])
    assert "compute v3" not in nv.calls  # remembered as missing


def test_failed_process_query_is_an_error_not_empty(monkeypatch):
    b, _ = backend(monkeypatch, broken={1})
    r0, r1 = b.read([0, 1])
    assert r0.error is None and r0.processes
    assert r1.processes is None and "Unknown Error" in r1.error  # one broken GPU hides no other
    assert r1.memory is not None


def test_no_driver(monkeypatch):
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver available .*Library Not Found"):
        backend(monkeypatch, init_error=12)


def test_device_paths(monkeypatch):
    b, _ = backend(monkeypatch)
    assert b.device_prefixes() == ("/dev/nvidia",)
    assert b.gpu_for_path("/dev/nvidia1") == 1
    assert b.gpu_for_path("/dev/nvidiactl") is None
    assert b.gpu_for_path("/dev/nvidia-uvm") is None
    assert b.gpu_for_path("/dev/nvidia9") is None


def test_early_init_overlaps_and_is_used_once(monkeypatch):
    """start_early_init runs nvmlInit on its own thread while the caller goes on; the next
    backend takes that result (one nvmlInit), a later one initialises itself."""
    import threading

    from gpuslate.gpu import nvml

    nv = fake_pynvml()
    inits: list[str] = []
    release = threading.Event()

    def slow_init():
        release.wait(10)  # the driver "initialising": the caller is not held up meanwhile
        inits.append(threading.current_thread().name)

    nv.nvmlInit = slow_init
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()
    nvml.start_early_init()  # a second call starts nothing more
    assert inits == []  # returned at once
    release.set()
    b = NvmlBackend()
    assert inits == ["gpuslate-nvml-init"]
    assert b.read([0])[0].error is None
    NvmlBackend()
    assert inits == ["gpuslate-nvml-init", threading.current_thread().name]


def test_early_init_failure_is_reported_by_the_backend(monkeypatch):
    from gpuslate.gpu import nvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=12))
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()  # fails quietly on its thread
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver available .*Library Not Found"):
        NvmlBackend()
