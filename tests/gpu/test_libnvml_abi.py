"""The ctypes binding against a C library with NVML's ABI.

A small ``libnvidia-ml`` double is compiled from C with the structure layouts of
``nvml.h``, so the binding's ``ctypes.Structure`` layouts, version words and
the two-call ``INSUFFICIENT_SIZE`` protocol are checked by the C compiler's
idea of the ABI, not by Python's. The real driver is exercised by the
``gpu``-marked tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gpuslate.errors import GpuQueryError
from gpuslate.gpu.libnvml import Nvml, NvmlError
from gpuslate.gpu.nvml import NvmlBackend

GiB = 1024**3

FAKE_NVML = r"""
#include <string.h>
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
#define GiB (1024ULL * 1024 * 1024)
static int inited, asked;
static char devs[2];

int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int rc) {
    return rc == 3 ? "Not Supported" : rc == 7 ? "Insufficient Size" : rc == 25 ? "Argument version mismatch"
         : rc == 1 ? "Uninitialized" : "Unknown Error";
}
int nvmlSystemGetDriverVersion(char *buf, unsigned int n) { strncpy(buf, "580.159.04", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    if (i > 1) return 2;
    *h = &devs[i]; return 0;
}
static int idx(nvmlDevice_t h) { return (char *)h - devs; }
int nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *m) { *m = 4 + idx(h); return 0; }
int nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned int n) {
    strncpy(buf, idx(h) ? "GPU-bbbb" : "GPU-aaaa", n); return 0;
}
int nvmlDeviceGetName(nvmlDevice_t h, char *buf, unsigned int n) { strncpy(buf, "NVIDIA H200", n); return 0; }
int nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) { u->gpu = 37; u->memory = 5; return 0; }
int nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *t) { *t = sensor == 0 ? 41 : 0; return 0; }
int nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) { return 3; }
int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t h, unsigned int *mw) { *mw = 700000; return 0; }
int nvmlDeviceGetPerformanceState(nvmlDevice_t h, unsigned int *p) { *p = 32; return 0; }
int nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    m->total = 140 * GiB; m->used = 645ULL << 20; m->free = m->total - m->used; return 0;
}
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    if (m->version != 0x02000028) return 25;
    if (idx(h) == 1) return 3;  /* GPU 1 answers only the v1 query */
    m->total = 140 * GiB; m->reserved = 645ULL << 20; m->used = 60 * GiB + 1; m->free = 80 * GiB; return 0;
}
/* three processes, and a fourth appears between the sizing call and the filling call */
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_v2_t *p) {
    unsigned int have = asked++ ? 4 : 3, i;
    if (idx(h) == 1) { *n = 0; return 0; }
    if (p == 0 || *n < have) { *n = have; return 7; }
    for (i = 0; i < have; i++) {
        p[i].pid = 1000 + i; p[i].usedGpuMemory = (i + 1) * GiB; p[i].gpuInstanceId = 0xFFFFFFFF;
        p[i].computeInstanceId = 0xFFFFFFFF;
    }
    p[2].usedGpuMemory = 0xFFFFFFFFFFFFFFFFULL;  /* "not available" */
    *n = have; return 0;
}
/* graphics: no _v3 or _v2 entry point in this "old" library; the v1 one is not supported */
int nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_v1_t *p) { return 3; }
/* MPS: only the unversioned function, with the v1 structure (16 bytes a process) */
int nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t h, unsigned int *n, nvmlProcessInfo_v1_t *p) {
    if (idx(h) == 1) { *n = 0; return 0; }
    if (p == 0 || *n < 2) { *n = 2; return 7; }
    p[0].pid = 1000; p[0].usedGpuMemory = 9 * GiB; p[1].pid = 2000; p[1].usedGpuMemory = 2 * GiB;
    *n = 2; return 0;
}
"""


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:  # CI installs one (.ci/run): there a missing compiler fails
        (pytest.fail if os.environ.get("CI") else pytest.skip)("no C compiler to build the NVML double")
    d = tmp_path_factory.mktemp("nvml")
    src = d / "fake_nvml.c"
    src.write_text(FAKE_NVML)
    lib = d / "libnvidia-ml-fake.so.1"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    return str(lib)


def test_binding_reads_the_abi(fake_library: str):
    nv = Nvml(fake_library)
    with pytest.raises(NvmlError) as exc:
        nv.device_count()  # before init: the library's own error, with its message
    assert exc.value.code == 1 and str(exc.value) == "Uninitialized" and exc.value.function == "nvmlDeviceGetCount_v2"
    nv.init()
    assert nv.device_count() == 2 and nv.driver_version() == "580.159.04"
    h0, h1 = nv.handle(0), nv.handle(1)
    assert (nv.minor_number(h0), nv.minor_number(h1)) == (4, 5)
    assert (nv.uuid(h1), nv.name(h0)) == ("GPU-bbbb", "NVIDIA H200")
    readings = (nv.utilization(h0), nv.temperature(h0), nv.power_limit(h0), nv.performance_state(h0))
    assert readings == (37, 41, 700000, 32)
    assert nv.memory(h0, 2) == (140 * GiB, 60 * GiB + 1, 645 << 20, 80 * GiB)
    assert nv.memory(h0, 1) == (140 * GiB, 645 << 20, 0, 140 * GiB - (645 << 20))
    # the list grew between the calls: asked again with more room, all four read
    assert nv.processes(h0, "compute", 3) == [(1000, GiB), (1001, 2 * GiB), (1002, None), (1003, 4 * GiB)]
    assert nv.processes(h0, "mps", 1) == [(1000, 9 * GiB), (2000, 2 * GiB)]  # the 16-byte v1 layout
    assert nv.processes(h1, "compute", 3) == []
    with pytest.raises(NvmlError) as exc:
        nv.processes(h0, "graphics", 3)
    assert exc.value.code == 13 and exc.value.function == "nvmlDeviceGetGraphicsRunningProcesses_v3"
    with pytest.raises(NvmlError) as exc:
        nv.power_usage(h0)
    assert exc.value.code == 3 and str(exc.value) == "Not Supported"
    with pytest.raises(NvmlError) as exc:
        nv.handle(7)
    assert exc.value.code == 2
    nv.shutdown()


def test_backend_over_the_abi(fake_library: str):
    b = NvmlBackend(Nvml(fake_library))
    assert b.memory_api == "v2" and b.driver_version() == "580.159.04"
    (r0,) = b.read([0])
    (r1,) = b.read([1])  # after GPU 0: its v1 fallback applies to later reads only
    assert r0.error is None and r0.memory.used == 60 * GiB + 1 and r0.memory.reserved == 645 << 20
    # compute and MPS merged per pid (the larger figure kept); graphics unsupported is no error
    assert [(p.pid, p.kind, p.used_memory) for p in r0.processes] == [
        (1000, "mps", 9 * GiB), (1001, "compute", 2 * GiB), (1002, "compute", None), (1003, "compute", 4 * GiB),
        (2000, "mps", 2 * GiB)]
    assert r0.utilization_pct == 37 and r0.power_w is None and r0.power_limit_w == 700.0 and r0.pstate is None
    assert r1.error is None and r1.processes == [] and r1.memory.reserved == 0  # GPU 1: the v1 memory query
    assert b.gpu_for_path("/dev/nvidia5") == 1 and b.gpu_for_path("/dev/nvidia0") is None
    with pytest.raises(GpuQueryError, match="nvmlDeviceGetHandleByIndex_v2"):
        b._handle(9)
