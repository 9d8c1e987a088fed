"""Helpers for the ``gpu``-marked tests: real CUDA processes started by the test itself."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

TORCH_HOLDER = r"""
import signal, sys, torch
n = int(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
x = torch.empty(n, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""

# A holder whose main thread exits (pthread_exit) once its memory is held, while a second thread keeps
# the process: /proc/PID/stat says Z, NVML lists PID (the process: the tgid) with its memory (issue 24)
TORCH_LEADER_EXITS = r"""
import ctypes, sys, threading, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
threading.Thread(target=sys.stdin.read).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""

# A launcher with N torch workers in its process group (like tensor-parallel ranks)
TORCH_TREE = r"""
import subprocess, sys
n, each = int(sys.argv[1]), sys.argv[2]
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[3], each], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True) for _ in range(n)]
for k in kids:
    assert k.stdout.readline().strip() == "ready"
print("ready", " ".join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
"""

# A tensor-parallel job: a launcher and one worker per listed GPU (rank r on cuda:GPUS[r]).
# CUDA opens every device node, so each worker also holds a handle on the other GPUs.
TORCH_TP = r"""
import subprocess, sys
gpus, each = sys.argv[1].split(","), sys.argv[2]
worker = (
    "import sys, torch\n"
    "torch.cuda.set_device(int(sys.argv[1]))  # a context on this GPU only, as a TP rank has\n"
    "x = torch.empty(int(sys.argv[2]), dtype=torch.uint8, device='cuda')\n"
    "x.fill_(1); torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()\n")
kids = [subprocess.Popen([sys.executable, "-c", worker, g, each], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True) for g in gpus]
for k in kids:
    assert k.stdout.readline().strip() == "ready"
print("ready", " ".join(str(k.pid) for k in kids), flush=True)
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
        self.children: list[int] = []

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        # the workers are reparented once the launcher is gone: wait until their contexts are torn
        # down too, so the next test starts on free GPUs
        import pynvml

        pynvml.nvmlInit()
        deadline = time.monotonic() + 30
        mine = {self.pid, *self.children}
        while time.monotonic() < deadline:
            listed = {p.pid for i in range(pynvml.nvmlDeviceGetCount())
                      for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
            if not listed & mine:
                break
            time.sleep(0.05)


def start_python(code: str, *args: str, timeout: float = 120) -> Started:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().split() if ready else []
    if not line or line[0] != "ready":
        proc.kill()
        raise AssertionError("GPU helper process did not become ready")
    started = Started(proc)
    started.children = [int(x) for x in line[1:]]
    return started
