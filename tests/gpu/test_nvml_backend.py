"""The NVML backend's choke point against a driver double.

These tests pin the behaviour a real driver cannot be made to show on demand:
API-version fallbacks, invalid PIDs, a failing query on one GPU. The real
driver is exercised by the ``gpu``-marked tests in test_nvml_real.py.
"""

from __future__ import annotations

import inspect
import threading

import pytest

from gpuslate.errors import BackendUnavailable
from gpuslate.gpu import nvml
from gpuslate.gpu.libnvml import Nvml, NvmlError
from gpuslate.gpu.nvml import NvmlBackend

GiB = 1024**3
NOT_FOUND, NOT_SUPPORTED, LIBRARY_NOT_FOUND, UNKNOWN, NO_PERMISSION = 13, 3, 12, 999, 4
MESSAGES = {13: "Function Not Found", 3: "Not Supported", 12: "NVML Shared Library Not Found",
            999: "Unknown Error", 4: "Insufficient Permissions"}


def err(code: int, fn: str) -> NvmlError:
    return NvmlError(code, fn, MESSAGES.get(code))


class FakeNvml:
    """A driver double with the binding's interface (see test_double_matches_the_binding)."""

    def __init__(self, gpus: int = 2, *, v2_memory: bool = True, v3_procs: bool = True,
                 broken: frozenset[int] = frozenset(), init_error: int | None = None) -> None:
        self.gpus, self.v2_memory, self.v3_procs = gpus, v2_memory, v3_procs
        self.broken, self.init_error = broken, init_error
        self.calls: list[str] = []
        self.inits: list[str] = []

    def init(self) -> None:
        if self.init_error is not None:
            raise err(self.init_error, "nvmlInit_v2")
        self.inits.append(threading.current_thread().name)

    def shutdown(self) -> None:
        pass

    def driver_version(self) -> str:
        return "580.159.03"

    def device_count(self) -> int:
        return self.gpus

    def handle(self, index: int) -> int:
        return index

    def minor_number(self, h: int) -> int:
        return h

    def uuid(self, h: int) -> str:
        return f"GPU-{h}"

    def name(self, h: int) -> str:
        return "NVIDIA H200"

    def utilization(self, h: int) -> int:
        return 7

    def temperature(self, h: int) -> int:
        return 30

    def power_usage(self, h: int) -> int:
        raise err(NOT_SUPPORTED, "nvmlDeviceGetPowerUsage")  # an optional fact, not an error

    def power_limit(self, h: int) -> int:
        return 700000

    def performance_state(self, h: int) -> int:
        return 0

    def memory(self, h: int, version: int) -> tuple[int, int, int, int]:
        self.calls.append(f"mem v{version}")
        if version == 2:
            if not self.v2_memory:
                raise err(NOT_FOUND, "nvmlDeviceGetMemoryInfo_v2")
            return 140 * GiB, 0, 645 * 1024**2, 140 * GiB - 645 * 1024**2
        return 140 * GiB, 645 * 1024**2, 0, 140 * GiB - 645 * 1024**2

    def processes(self, h: int, kind: str, version: int) -> list[tuple[int, int | None]]:
        self.calls.append(f"{kind} v{version}")
        if h in self.broken and kind == "compute":
            raise err(UNKNOWN, "nvmlDeviceGetComputeRunningProcesses_v3")
        if version == 3 and not self.v3_procs:
            raise err(NOT_FOUND, f"{kind}_v3")
        if kind == "compute":
            return [(1234, 10 * GiB), (0, GiB), (4294967295, GiB)]
        if kind == "mps":
            return [(777, None)]
        raise err(NOT_SUPPORTED, kind)


def test_double_matches_the_binding():
    """The double has exactly the binding's public methods, with the same parameters."""
    def methods(cls: type) -> dict[str, list[str]]:
        return {n: list(inspect.signature(f).parameters) for n, f in vars(cls).items()
                if callable(f) and not n.startswith("_")}

    assert methods(FakeNvml) == methods(Nvml)


def backend(monkeypatch, **kw) -> tuple[NvmlBackend, FakeNvml]:
    nv = FakeNvml(**kw)
    return NvmlBackend(nv), nv  # type: ignore[arg-type]


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


class MpsNvml(FakeNvml):
    """As measured on an H200 (driver 580): an MPS client is in the compute and the MPS lists
    (nvidia-smi's "M+C"), the server in the compute list only ("C")."""

    def __init__(self, mps_error: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.mps_error = mps_error

    def processes(self, h: int, kind: str, version: int) -> list[tuple[int, int | None]]:
        if kind == "compute":
            return [(500, 66 * 1024**2), (501, 2 * GiB), (502, None)]
        if kind == "mps":
            if self.mps_error is not None:
                raise err(self.mps_error, "nvmlDeviceGetMPSComputeRunningProcesses_v3")
            return [(501, 2 * GiB), (502, GiB)]
        return []


def test_an_mps_client_is_kind_mps_and_its_server_compute():
    b = NvmlBackend(MpsNvml())  # type: ignore[arg-type]
    (r,) = b.read([0])
    kinds = {p.pid: (p.kind, p.used_memory) for p in r.processes}
    assert kinds == {500: ("compute", 66 * 1024**2), 501: ("mps", 2 * GiB), 502: ("mps", GiB)}


def test_a_failed_mps_query_is_an_error_not_clean():
    """Unsupported: the clients show as compute (nothing is known of MPS); any other failure: an error."""
    (r,) = NvmlBackend(MpsNvml(mps_error=NOT_SUPPORTED)).read([0])  # type: ignore[arg-type]
    assert r.error is None and {p.kind for p in r.processes} == {"compute"}
    for code in (UNKNOWN, NO_PERMISSION):
        (r,) = NvmlBackend(MpsNvml(mps_error=code)).read([0])  # type: ignore[arg-type]
        assert r.processes is None and r.error and "MPSCompute" in r.error


def test_failed_process_query_is_an_error_not_empty(monkeypatch):
    b, _ = backend(monkeypatch, broken={1})
    r0, r1 = b.read([0, 1])
    assert r0.error is None and r0.processes
    assert r1.processes is None and "Unknown Error" in r1.error  # one broken GPU hides no other
    assert r1.memory is not None


def test_no_driver(monkeypatch):
    with pytest.raises(BackendUnavailable, match=r"no NVIDIA driver available .*Library Not Found"):
        backend(monkeypatch, init_error=LIBRARY_NOT_FOUND)


def test_no_library(monkeypatch):
    """No libnvidia-ml.so.1 at all: the binding says so, the backend says no driver."""
    monkeypatch.setattr(nvml, "open_library", lambda: Nvml("libnvidia-ml-absent.so.1"))
    monkeypatch.setattr(nvml, "_early", None)
    with pytest.raises(BackendUnavailable, match=r"no NVIDIA driver available .*Library Not Found"):
        nvml.open_nvml()


def test_permission_error_is_permission_denied(monkeypatch):
    b, nv = backend(monkeypatch)
    nv.handle = lambda i: (_ for _ in ()).throw(err(NO_PERMISSION, "nvmlDeviceGetHandleByIndex_v2"))
    (r,) = b.read([0])
    assert r.memory is None and "Insufficient Permissions" in r.error


def test_device_paths(monkeypatch):
    b, _ = backend(monkeypatch)
    assert b.device_prefixes() == ("/dev/nvidia",)
    assert b.gpu_for_path("/dev/nvidia1") == 1
    assert b.gpu_for_path("/dev/nvidiactl") is None
    assert b.gpu_for_path("/dev/nvidia-uvm") is None
    assert b.gpu_for_path("/dev/nvidia-caps/nvidia-cap1") is None
    assert b.gpu_for_path("/dev/nvidia9") is None
    assert b.gpu_for_path("/dev/nvidia١") is None  # a non-ASCII digit is no minor number


def test_early_init_overlaps_and_is_used_once(monkeypatch):
    """start_early_init runs nvmlInit and takes the handles on its own thread while the
    caller goes on; the next backend takes that result (one nvmlInit), a later one
    initialises itself."""
    nv = FakeNvml()
    release = threading.Event()
    init = nv.init

    def slow_init() -> None:
        release.wait(10)  # the driver "initialising": the caller is not held up meanwhile
        init()

    handles: list[str] = []
    nv.init = slow_init  # type: ignore[method-assign]
    nv.handle = lambda i: handles.append(threading.current_thread().name) or i  # type: ignore[method-assign]
    monkeypatch.setattr(nvml, "open_library", lambda: nv)
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()
    nvml.start_early_init()  # a second call starts nothing more
    assert nv.inits == []  # returned at once
    release.set()
    b = nvml.open_nvml()
    assert nv.inits == ["gpuslate-nvml-init"]
    assert len(handles) == 2 and "gpuslate-nvml-init" not in handles  # one thread per GPU
    assert b.read([0, 1])[1].error is None and len(handles) == 2  # the early handles are used
    nvml.open_nvml()
    assert nv.inits == ["gpuslate-nvml-init", threading.current_thread().name]


def test_prefetched_reading_is_returned_once(monkeypatch):
    """status: the first full reading is taken on the early thread; the next full
    read of all or some GPUs returns it, later reads ask the driver."""
    nv = FakeNvml()
    monkeypatch.setattr(nvml, "open_library", lambda: nv)
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init(prefetch=True)
    b = nvml.open_nvml()
    assert sorted(nv.calls) == ["compute v3", "compute v3", "graphics v3", "graphics v3", "mem v2", "mem v2",
                                "mps v3", "mps v3"]
    nv.calls.clear()
    (r1,) = b.read([1])
    assert nv.calls == [] and r1.index == 1 and r1.name == "NVIDIA H200"  # the prefetched one
    b.read([1])
    assert "mem v2" in nv.calls  # asked again


def test_early_init_failure_is_reported_by_the_backend(monkeypatch):
    monkeypatch.setattr(nvml, "open_library", lambda: FakeNvml(init_error=LIBRARY_NOT_FOUND))
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()  # fails quietly on its thread
    with pytest.raises(BackendUnavailable, match=r"no NVIDIA driver available .*Library Not Found"):
        nvml.open_nvml()


def test_early_handle_error_is_the_gpus_error(monkeypatch):
    nv = FakeNvml()
    nv.handle = lambda i: (_ for _ in ()).throw(err(UNKNOWN, "nvmlDeviceGetHandleByIndex_v2")) if i == 1 else i
    monkeypatch.setattr(nvml, "open_library", lambda: nv)
    monkeypatch.setattr(nvml, "_early", None)
    nvml.start_early_init()
    r0, r1 = nvml.open_nvml().read([0, 1])
    assert r0.error is None and r1.memory is None and "Unknown Error" in r1.error
