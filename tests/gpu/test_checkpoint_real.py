"""The driver's checkpoint API through cuda-core on a real GPU (``pytest -m gpu`` on the device machine).

Needs a driver of R570 or later and the ``park`` extra. Every process is started by the test
(``started`` ends it); the backend is the one gpuslate opens on a real host, so what NVML lists
is what a park would prove with. What these tests pin down is what the simulated driver
(:mod:`gpuslate.gpu.simhost.checkpoint`) plays: the process leaves NVML's list when checkpointed,
comes back on the same GPU with the same contents, and the state rules refuse out of order.
"""

from __future__ import annotations

import os

import pytest

from gpuprocs import start_python
from gpuslate.errors import CheckpointError
from gpuslate.gpu import CheckpointState, open_backend

pytestmark = pytest.mark.gpu
GiB = 1024**3

# holds N bytes of known contents on GPU 0; each line on stdin: are they still the same?
TORCH_CHECKED = r"""
import sys, torch
x = torch.arange(int(sys.argv[1]) // 8, dtype=torch.int64, device="cuda")
want = int(x.sum().item())
print("ready", flush=True)
for line in sys.stdin:
    print("same" if int(x.sum().item()) == want else "changed", flush=True)
"""


def listed(be, pid: int) -> bool:
    return any(p.pid == pid for r in be.read(None, full=False) for p in r.processes or [])


def ask(p) -> str:
    p.proc.stdin.write("check\n")
    p.proc.stdin.flush()
    return p.proc.stdout.readline().strip()


def test_checkpoint_and_restore_a_torch_process(started):
    be = open_backend()
    p = start_python(TORCH_CHECKED, str(4 * GiB))
    started.append(p)
    assert listed(be, p.pid) and ask(p) == "same"
    host_before = be.host_memory()
    assert be.checkpoint_state(p.pid) is CheckpointState.RUNNING
    with pytest.raises(CheckpointError) as info:
        be.checkpoint(p.pid)  # running: the driver wants it locked first
    assert info.value.driver_code == "CUDA_ERROR_ILLEGAL_STATE", info.value
    be.checkpoint_lock(p.pid, timeout_ms=10_000)
    assert be.checkpoint_state(p.pid) is CheckpointState.LOCKED
    be.checkpoint(p.pid)
    assert be.checkpoint_state(p.pid) is CheckpointState.CHECKPOINTED
    assert not listed(be, p.pid), "a checkpointed process is on no GPU's list"
    host_after = be.host_memory()
    print(f"\nhost MemAvailable {host_before} -> {host_after}")
    assert host_before is not None and host_after is not None and host_after.available < host_before.available
    be.checkpoint_restore(p.pid)
    assert be.checkpoint_state(p.pid) is CheckpointState.LOCKED and listed(be, p.pid)
    be.checkpoint_unlock(p.pid)
    assert be.checkpoint_state(p.pid) is CheckpointState.RUNNING
    assert ask(p) == "same", "the memory came back with its contents"


def test_a_process_without_cuda_is_refused():
    be = open_backend()
    with pytest.raises(CheckpointError) as info:
        be.checkpoint_state(os.getpid())  # pytest itself holds no CUDA context
    print(f"\n{info.value.driver_code}: {info.value}")
    assert info.value.driver_code in ("CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_NOT_FOUND",
                                      "CUDA_ERROR_NOT_SUPPORTED")
