"""Real GPU memory holders for the benchmarks: torch processes, started quickly and killed exactly.

Each benchmark round needs fresh holders, and starting a Python process that
imports torch takes seconds. A fork server imports torch once (without
initialising CUDA) and forks every holder from it: a holder then only creates
its CUDA context and allocates (``torch.empty(..., device=f"cuda:{i}")``).

* ``each``: one process per GPU, each in its own session (a job of its own).
* ``tree``: a launcher in its own session that holds no GPU memory, with N
  workers in its process group spread over the GPUs (like tensor-parallel ranks).

Holders never exit by themselves; :meth:`Holders.kill` SIGKILLs their process
groups. If the fork server cannot start a holder, fresh ``python -c`` processes
are used instead (slower, same processes as far as any tool can tell).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import NamedTuple

GiB = 1024**3

FORKSERVER = r"""
import os, signal, sys
import torch  # once; CUDA is initialised only in the forked holders
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # holders are reaped by the kernel: no zombies

def hold(gpu, nbytes, wfd):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    x = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}"); x.fill_(1); torch.cuda.synchronize()
    os.write(wfd, b"ok\n"); os.close(wfd)
    while True:
        signal.pause()

def read_line(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 256)
        if not chunk:
            return None
        data += chunk
    return data

def fork(fn):
    # a child running fn(w); returns (pid, the read end of its readiness pipe)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r); fn(w)
        finally:
            os._exit(1)
    os.close(w)
    return pid, r

def ready(r):
    line = read_line(r); os.close(r)
    return line

def tree(n, nbytes, ngpu, w):
    os.setsid()
    kids = [fork(lambda w2, i=i: hold(i % ngpu, nbytes, w2)) for i in range(n)]  # all at once
    if all(ready(r) is not None for _, r in kids):
        os.write(w, (" ".join(str(k) for k, _ in kids) + "\n").encode())
    os.close(w)
    while True:
        signal.pause()

print("server", flush=True)
for line in sys.stdin:
    cmd, *a = line.split()
    if cmd == "each":  # one process per GPU, each in its own session, started at once
        ngpu, nbytes = int(a[0]), int(a[1])
        kids = [fork(lambda w, g=g: (os.setsid(), hold(g, nbytes, w))) for g in range(ngpu)]
        ok = [ready(r) is not None for _, r in kids]
        print("ready " + " ".join(str(k) for k, _ in kids) if all(ok) else "failed", flush=True)
    elif cmd == "tree":
        n, nbytes, ngpu = int(a[0]), int(a[1]), int(a[2])
        pid, r = fork(lambda w: tree(n, nbytes, ngpu, w))
        kids = ready(r)
        print(f"ready {pid} {kids.decode().strip()}" if kids else "failed", flush=True)
"""

HOLDER = r"""
import signal, sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device=f"cuda:{sys.argv[2]}"); x.fill_(1)
torch.cuda.synchronize(); print("ready", flush=True)
while True:
    signal.pause()
"""
TREE = r"""
import signal, subprocess, sys
n, each, ngpu = int(sys.argv[1]), sys.argv[2], int(sys.argv[4])
kids = [subprocess.Popen([sys.executable, "-c", sys.argv[3], each, str(i % ngpu)], stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True) for i in range(n)]
for k in kids:
    assert k.stdout.readline().strip() == "ready"
print("ready", " ".join(str(k.pid) for k in kids), flush=True)
while True:
    signal.pause()
"""


class Job(NamedTuple):
    """One started job: its session leader and the processes holding GPU memory."""

    leader: int  # the holder itself (hold) or the launcher (tree); leader of its session and group
    holders: list[int]

    @property
    def pids(self) -> list[int]:
        return list(dict.fromkeys([self.leader, *self.holders]))


class Holders:
    """Starts jobs; remembers them so that :meth:`kill` ends exactly those."""

    def __init__(self, use_forkserver: bool = True) -> None:
        self.jobs: list[Job] = []
        self._spawned: list[subprocess.Popen[str]] = []
        self.server: subprocess.Popen[str] | None = None
        if use_forkserver:
            self.server = subprocess.Popen([sys.executable, "-c", FORKSERVER], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, start_new_session=True)
            if self._readline(self.server, 120) != "server":
                self._stop_server()

    @staticmethod
    def _readline(p: subprocess.Popen[str], timeout: float) -> str:
        r, _, _ = select.select([p.stdout], [], [], timeout)
        return p.stdout.readline().strip() if r else ""  # type: ignore[union-attr]

    def _ask(self, line: str) -> list[int] | None:
        if self.server is None:
            return None
        self.server.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.server.stdin.flush()  # type: ignore[union-attr]
        reply = self._readline(self.server, 180).split()
        if not reply or reply[0] != "ready":
            self._stop_server()  # from now on: fresh processes
            return None
        return [int(x) for x in reply[1:]]

    def _stop_server(self) -> None:
        if self.server is not None:
            try:
                os.killpg(self.server.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.server.wait()
            self.server = None

    def each(self, ngpu: int, nbytes: int) -> list[Job]:
        """One holder per GPU, each a job of its own (own session)."""
        got = self._ask(f"each {ngpu} {nbytes}")
        if got:
            jobs = [Job(p, [p]) for p in got]
        else:
            procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(nbytes), str(g)], stdout=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, start_new_session=True)
                     for g in range(ngpu)]
            self._spawned += procs
            for g, p in enumerate(procs):
                if self._readline(p, 300) != "ready":
                    raise RuntimeError(f"holder on GPU {g} did not start")
            jobs = [Job(p.pid, [p.pid]) for p in procs]
        self.jobs += jobs
        return jobs

    def tree(self, workers: int, nbytes: int, ngpu: int) -> Job:
        got = self._ask(f"tree {workers} {nbytes} {ngpu}")
        if got:
            job = Job(got[0], got[1:])
        else:
            p = subprocess.Popen([sys.executable, "-c", TREE, str(workers), str(nbytes), HOLDER, str(ngpu)],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            self._spawned.append(p)
            line = self._readline(p, 300).split()
            if not line or line[0] != "ready":
                raise RuntimeError("launcher + workers did not start")
            job = Job(p.pid, [int(x) for x in line[1:]])
        self.jobs.append(job)
        return job

    def kill(self) -> None:
        """SIGKILL every job started (their process groups, and each pid in case it left the group)."""
        for job in self.jobs:
            for target in (lambda: os.killpg(job.leader, signal.SIGKILL),
                           *(lambda p=p: os.kill(p, signal.SIGKILL) for p in job.pids)):
                try:
                    target()
                except (ProcessLookupError, PermissionError):
                    pass
        self.jobs = []
        for p in self._spawned:
            p.wait()
        self._spawned = []

    def close(self) -> None:
        self.kill()
        self._stop_server()

    def server_pids(self) -> set[int]:
        return {self.server.pid} if self.server is not None else set()


def exit_on_sigterm() -> None:
    """A time limit's SIGTERM ends the benchmark through its ``finally`` blocks, so the
    holders (in sessions of their own, out of reach of the limit) are killed too."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def device_holders() -> dict[int, set[str]]:
    """Every process holding a /dev/nvidia* file open (what `fuser /dev/nvidia*` finds)."""
    out: dict[int, set[str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                t = os.readlink(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("/dev/nvidia"):
                out.setdefault(int(name), set()).add(t)
    return out


def descends_from(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or below one of them."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid in ancestors:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


CHECK = r"""
import sys, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    out.append(f"{m.used}:{len(pynvml.nvmlDeviceGetComputeRunningProcesses(h))}")
print(" ".join(out))
"""


def gpu_usage() -> list[tuple[int, int]]:
    """(used bytes, compute processes) per GPU, from a separate process (this one holds no NVML handle)."""
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True).stdout.split()
    return [(int(u), int(n)) for u, n in (x.split(":") for x in out)]


def wait_all_free(limit: int = 64 * 2**20, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(u <= limit and n == 0 for u, n in gpu_usage()):
            return True
        time.sleep(0.05)
    return False


def visible_gpus() -> int:
    return len(gpu_usage())
