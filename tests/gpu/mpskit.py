"""Helpers for the real-MPS ``gpu`` tests (test_mps_real.py, test_mps_hostile_real.py): a private MPS
control daemon with its own pipe and log folders, the torch clients started through it, and what a
test records of what the real GPU showed.

A daemon started here serves only the test's clients (``CUDA_MPS_PIPE_DIRECTORY`` and
``CUDA_MPS_LOG_DIRECTORY`` in a temporary folder); the fixtures (conftest.py: ``mps``,
``mps_daemons``) end the clients and send ``quit`` to each daemon (``echo quit |
nvidia-cuda-mps-control``) also when the test fails. They never use ``terminate_client``, which on
the H200 faulted the other client of the same server.

**Records.** :func:`record` prints one ``GPU-RECORD {json}`` line (run pytest with ``-s`` to see them
as they come) and, when ``GPUSLATE_GPU_RECORD`` names a file, appends the JSON to it: what the real
driver did, for benchmarks/results/ and for comparison with the simulated host.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuslate.proc.daemons import MPS_PIPE_VAR, env_value, read_environ
from gpuslate.proc.procfs import list_pids, read_exe, read_stat

GiB = 1024**3
MiB = 1024**2
SERVER = "nvidia-cuda-mps-server"
CONTROL = "nvidia-cuda-mps-control"
#: the file the records are appended to (JSON lines), when set
RECORD_VAR = "GPUSLATE_GPU_RECORD"

# An MPS client: holds memory, then runs a kernel on it for every line it reads ("ok N" when done).
# With a title (argv[2]), it renames itself once its memory is held, as SGLang's and vLLM's workers do
# with setproctitle: py-setproctitle where installed (SPT_NOENV unset: the title is written over the
# argument *and* environment area), else the same by hand (each variable moved to the heap with
# setenv, as setproctitle does, then the title and NULs written over that area; PR_SET_NAME for the
# kernel's name). Its environment then no longer shows its MPS pipe folder: /proc/PID/environ reads
# as NULs. "ready HOW" says how it renamed itself ("-" for none).
MPS_CLIENT = r"""
import ctypes, os, sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
how = "-"
title = sys.argv[2] if len(sys.argv) > 2 else ""


def pipe_shown():
    with open("/proc/self/environ", "rb") as f:
        return b"CUDA_MPS_PIPE_DIRECTORY=" in f.read()


if title:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    libc.setenv.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    try:
        import setproctitle
        setproctitle.setproctitle(title)
        how = "setproctitle"
    except ImportError:
        pass
    if pipe_shown():  # no setproctitle, or one that kept the environment: by hand
        for k, v in list(os.environ.items()):
            libc.setenv(k.encode(), v.encode(), 1)
        with open("/proc/self/stat", "rb") as f:
            raw = f.read()
        arg_start, _, _, env_end = (int(v) for v in raw[raw.rindex(b")") + 2:].split()[45:49])
        n = env_end - arg_start
        ctypes.memmove(arg_start, title.encode()[:n - 1].ljust(n, b"\0"), n)
        name = ctypes.create_string_buffer(title.encode()[:15])
        libc.prctl(15, ctypes.addressof(name), 0, 0, 0)  # PR_SET_NAME
        how = "by hand" if how == "-" else how + " then by hand"
    if pipe_shown():
        how = "failed: the environment still shows the pipe folder"
print("ready", how, flush=True)
for line in sys.stdin:
    x.add_(1)
    torch.cuda.synchronize()
    print("ok", int(x[0].item()), flush=True)
"""


def gone(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.state == "Z"


def record(test: str, **facts: Any) -> None:
    """Print what the real GPU showed (one ``GPU-RECORD`` line) and append it to ``$GPUSLATE_GPU_RECORD``."""
    line = json.dumps({"test": test, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **facts}, default=str)
    print(f"\nGPU-RECORD {line}", flush=True)
    path = os.environ.get(RECORD_VAR)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def nvml_view(gpu: int = 0) -> dict[str, Any]:
    """What NVML itself lists for ``gpu`` (pynvml, as nvidia-smi shows it; gpuslate's own reading where
    pynvml is not installed): used memory, and the pids of the compute and MPS lists with their memory;
    ``error`` when neither can be read."""
    try:
        import pynvml  # lazy: optional (nvidia-ml-py, on the GPU host)
    except ImportError:
        return _gpuslate_view(gpu)
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        out: dict[str, Any] = {"source": "pynvml", "used": pynvml.nvmlDeviceGetMemoryInfo(h).used}
        for key, call in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                          ("mps", pynvml.nvmlDeviceGetMPSComputeRunningProcesses)):
            try:
                out[key] = sorted((p.pid, p.usedGpuMemory) for p in call(h))
            except pynvml.NVMLError as e:
                out[key] = f"error: {e}"
        return out
    except Exception as e:  # a record, not a check: say what failed
        return {"source": "pynvml", "error": repr(e)}


def _gpuslate_view(gpu: int) -> dict[str, Any]:
    import gpuslate  # lazy: startup (conftest imports this module on every run)

    try:
        r = gpuslate.status([gpu]).gpus[0].reading
    except Exception as e:  # a record, not a check: say what failed
        return {"source": "gpuslate", "error": repr(e)}
    out: dict[str, Any] = {"source": "gpuslate"}
    if r.memory is not None:
        out["used"] = r.memory.used
    for key in ("compute", "mps"):
        out[key] = sorted((p.pid, p.used_memory) for p in r.processes or [] if p.kind == key)
    return out


class Client:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.how = "-"  # how it renamed itself (MPS_CLIENT's "ready HOW")

    def work(self, timeout: float = 60) -> str:
        """Run one kernel in the client; its answer ("ok N"), or what went wrong."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except OSError as e:
            return f"cannot ask: {e}"
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else "no answer"

    def stop(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


class Mps:
    """A private MPS control daemon (started by a fixture) and the clients started through it."""

    def __init__(self, control: str, root: Path) -> None:
        self.control = control
        self.pipe = root / "pipe"
        self.log = root / "log"
        self.pipe.mkdir(parents=True)
        self.log.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SPT_NOENV")}
        self.env.update({MPS_PIPE_VAR: str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)})
        self.clients: list[Client] = []

    def start(self) -> None:
        subprocess.run([self.control, "-d"], env=self.env, check=True, timeout=60)

    def controls(self) -> list[int]:
        """Our control daemon: the program, with our pipe folder in its environment."""
        out = []
        for pid in list_pids():
            exe = read_exe(pid) or ""
            env = read_environ(pid)
            if exe.rsplit("/", 1)[-1] == CONTROL and env is not None and env_value(env, MPS_PIPE_VAR) == str(self.pipe):
                out.append(pid)
        return out

    def servers(self) -> list[int]:
        """Our MPS servers: the program, started by our control daemon (or with our pipe folder)."""
        controls = set(self.controls())
        out = []
        for pid in list_pids():
            st = read_stat(pid)
            if st is None or (read_exe(pid) or "").rsplit("/", 1)[-1] != SERVER:
                continue
            env = read_environ(pid)
            if st.ppid in controls or (env is not None and env_value(env, MPS_PIPE_VAR) == str(self.pipe)):
                out.append(pid)
        return out

    def client(self, nbytes: int, title: str = "") -> Client:
        """A torch client of this daemon holding ``nbytes``; with ``title``, renamed once it holds them."""
        args = [sys.executable, "-c", MPS_CLIENT, str(nbytes)] + ([title] if title else [])
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env,
                                start_new_session=True)
        c = Client(proc)
        self.clients.append(c)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline().strip() if ready else ""
        assert line.startswith("ready"), f"MPS client did not become ready ({line!r}); MPS log: {self.log_tail()}"
        c.how = line.removeprefix("ready").strip()
        return c

    def quit(self) -> None:
        """End the clients, then the daemon and its servers (``quit``; SIGKILL for what outlives it)."""
        for c in self.clients:  # first the clients: quit waits for them
            c.stop()
        left = self.controls() + self.servers()
        if not left:
            return
        subprocess.run([self.control], input="quit\n", text=True, env=self.env, timeout=60, check=False)
        deadline = time.monotonic() + 60
        while any(not gone(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:  # ours (our pipe folder): never left running
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)

    def log_tail(self) -> str:
        parts = []
        for name in ("control.log", "server.log"):
            f = self.log / name
            if f.exists():
                parts.append(f"{name}: {f.read_text(errors='replace')[-1500:]}")
        return " | ".join(parts) or "(no log)"
