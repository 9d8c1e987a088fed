"""Real NVML on a real GPU (run on the device machine: ``pytest -m gpu``).

Every process here is started by the test itself; nothing else is touched.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gpuslate
from gpuprocs import NVML_MONITOR, TORCH_HOLDER, start_python
from helpers import gpuslate_env

pytestmark = pytest.mark.gpu
GiB = 1024**3


def test_v2_memory_accounting_on_idle_gpu():
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    snap = gpuslate.status([0])
    m = snap.gpus[0].memory
    print(f"\nGPU0 {snap.gpus[0].reading.name}: v1 used={v1.used} total={v1.total}; "
          f"gpuslate used={m.used} reserved={m.reserved} free={m.free} total={m.total}")
    assert snap.backend == "nvml" and snap.gpus[0].error is None
    assert m.total == v1.total
    assert m.reserved > 0, "the v2 memory API should report driver-reserved memory"
    # v1 counts reserved memory as used; v2 splits it out
    assert abs((m.used + m.reserved) - v1.used) <= 64 * 1024**2


def test_torch_process_appears_with_pid_and_memory(started):
    p = start_python(TORCH_HOLDER, str(8 * GiB))
    started.append(p)
    snap = gpuslate.status([0])
    g = snap.gpus[0]
    mine = [q for q in g.processes if q.pid == p.pid]
    print(f"\nGPU0 used={g.memory.used} processes={[(q.pid, q.kind, q.used_memory) for q in g.processes]}")
    assert len(mine) == 1
    q = mine[0]
    assert q.kind == "compute" and q.visible and q.root_pid == p.pid
    # the allocation plus the CUDA context (a few hundred MiB)
    assert 8 * GiB <= q.used_memory <= 8 * GiB + 2 * GiB
    assert g.memory.used >= q.used_memory


def test_handle_holder_found(started):
    p = start_python(NVML_MONITOR)
    started.append(p)
    snap = gpuslate.status()
    where = [(g.index, q.kind) for g in snap.gpus for q in g.processes if q.pid == p.pid]
    where += [("host", q.kind) for q in snap.host_processes if q.pid == p.pid]
    print(f"\nNVML monitor {p.pid} seen as {where}")
    assert where and all(kind == "handle" for _, kind in where)


def test_cli_status_json(started):
    p = start_python(TORCH_HOLDER, str(2 * GiB))
    started.append(p)
    r = subprocess.run([sys.executable, "-m", "gpuslate", "status", "--json"], capture_output=True,
                       text=True, env=gpuslate_env({"GPUSLATE_SIM": ""}), timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "nvml" and doc["driver_version"]
    # on GPU 0, where it computes; CUDA opens every device node, so on a host with more GPUs the
    # same process is also listed on the others, as a handle
    gpu0 = {q["pid"]: q for q in doc["gpus"][0]["processes"]}
    assert gpu0[p.pid]["kind"] == "compute" and gpu0[p.pid]["used_memory"] >= 2 * GiB
    assert all(q["kind"] == "handle" for g in doc["gpus"][1:] for q in g["processes"] if q["pid"] == p.pid)
    r = subprocess.run([sys.executable, "-m", "gpuslate", "status"], capture_output=True, text=True,
                       env=gpuslate_env({"GPUSLATE_SIM": "", "COLUMNS": "160"}), timeout=60)
    print("\n" + r.stdout)
    assert r.returncode == 0 and str(p.pid) in r.stdout


def test_binding_agrees_with_pynvml(started):
    """gpuslate's own ctypes binding reads what NVIDIA's Python binding reads, on every GPU,
    with a process of ours holding memory on GPU 0."""
    import pynvml

    from gpuslate.gpu.libnvml import Nvml

    p = start_python(TORCH_HOLDER, str(GiB))
    started.append(p)
    pynvml.nvmlInit()
    nv = Nvml()
    nv.init()
    assert nv.device_count() == pynvml.nvmlDeviceGetCount()
    assert nv.driver_version() == pynvml.nvmlSystemGetDriverVersion()
    for i in range(nv.device_count()):
        h, ph = nv.handle(i), pynvml.nvmlDeviceGetHandleByIndex(i)
        assert nv.uuid(h) == pynvml.nvmlDeviceGetUUID(ph) and nv.name(h) == pynvml.nvmlDeviceGetName(ph)
        assert nv.minor_number(h) == pynvml.nvmlDeviceGetMinorNumber(ph)
        assert nv.power_limit(h) == pynvml.nvmlDeviceGetEnforcedPowerLimit(ph)
        total, used, reserved, _free = nv.memory(h, 2)
        m = pynvml.nvmlDeviceGetMemoryInfo(ph, version=pynvml.nvmlMemory_v2)
        assert (total, reserved) == (m.total, m.reserved) and abs(used - m.used) <= 64 * 2**20
        mine = dict(nv.processes(h, "compute", 3))
        theirs = {q.pid: q.usedGpuMemory for q in pynvml.nvmlDeviceGetComputeRunningProcesses(ph)}
        assert mine == theirs
        if i == 0:
            assert mine[p.pid] >= GiB
