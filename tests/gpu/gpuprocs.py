"""Helpers for the ``gpu``-marked tests: real CUDA processes started by the test itself."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

TORCH_HOLDER = r"""
import sys, torch
n = int(sys.argv[1])
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""

NVML_MONITOR = r"""
import sys, pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
print("ready", flush=True)
sys.stdin.read()
"""


class Started:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def start_python(code: str, *args: str, timeout: float = 120) -> Started:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready or proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise AssertionError("GPU helper process did not become ready")
    return Started(proc)
