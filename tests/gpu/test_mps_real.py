"""CUDA MPS on a real GPU (``pytest -m gpu`` on the device): a private MPS control daemon and two
torch clients, started by the test (issue 24, section 3).

What is checked: the clients are kind ``mps`` with their server's pid; the server is a GPU daemon
whose idle memory is a baseline (``wait --free`` succeeds with only the idle server left, and the
slurm prolog calls the GPU free); the plan names the client that shares the server; ``clear --pid``
of one client ends it and leaves the other working (it runs a kernel afterwards) and the server
alive; ``--include-handles`` never makes the server a target while a client of it is not (a dry run);
the server is never signaled (no audit entry names it, and it is the same process at the end).

The daemon has its own pipe and log folders in a temporary folder (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``), so it serves only this test's clients; the fixture ends the clients and
sends ``quit`` to it (``echo quit | nvidia-cuda-mps-control``) also when the test fails. It never
uses ``terminate_client``, which on the H200 faulted the other client of the same server.
Every clear here selects by ``--pid``: the test ends only processes it started.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpuslate
from gpuslate.clearing.plan import MPS_SHARED
from gpuslate.host.audit import AuditLog
from gpuslate.host.daemons import BASELINE_CAP
from gpuslate.proc.daemons import MPS_PIPE_VAR, env_value, read_environ
from gpuslate.proc.procfs import list_pids, read_exe, read_stat
from helpers import gpuslate_env

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
GiB = 1024**3
SERVER = "nvidia-cuda-mps-server"
CONTROL = "nvidia-cuda-mps-control"

# An MPS client: holds memory, then runs a kernel on it for every line it reads ("ok N" when done).
MPS_CLIENT = r"""
import sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    x.add_(1)
    torch.cuda.synchronize()
    print("ok", int(x[0].item()), flush=True)
"""


def gone(pid: int) -> bool:
    st = read_stat(pid)
    return st is None or st.state == "Z"


class Client:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.pid = proc.pid

    def work(self, timeout: float = 60) -> str:
        """Run one kernel in the client; its answer ("ok N"), or what went wrong."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline().strip() if ready else "no answer"

    def stop(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


class Mps:
    """A private MPS control daemon (started by the fixture) and the clients started through it."""

    def __init__(self, control: str, root: Path) -> None:
        self.control = control
        self.pipe = root / "pipe"
        self.log = root / "log"
        self.pipe.mkdir()
        self.log.mkdir()
        self.env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        self.env.update({MPS_PIPE_VAR: str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)})
        self.clients: list[Client] = []

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

    def client(self, nbytes: int) -> Client:
        proc = subprocess.Popen([sys.executable, "-c", MPS_CLIENT, str(nbytes)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=self.env, start_new_session=True)
        c = Client(proc)
        self.clients.append(c)
        ready, _, _ = select.select([proc.stdout], [], [], 180)
        line = proc.stdout.readline().strip() if ready and proc.stdout else ""
        assert line == "ready", f"MPS client did not become ready; MPS log: {self.log_tail()}"
        return c

    def log_tail(self) -> str:
        parts = []
        for name in ("control.log", "server.log"):
            f = self.log / name
            if f.exists():
                parts.append(f"{name}: {f.read_text(errors='replace')[-1500:]}")
        return " | ".join(parts) or "(no log)"


@pytest.fixture
def mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mps]:
    control = shutil.which(CONTROL)
    if control is None:
        pytest.skip(f"{CONTROL} is not installed")
    monkeypatch.delenv("GPUSLATE_SIM", raising=False)
    monkeypatch.setenv("GPUSLATE_STATE_DIR", str(tmp_path / "state"))  # this test's audit log
    m = Mps(control, tmp_path)
    subprocess.run([control, "-d"], env=m.env, check=True, timeout=60)
    try:
        yield m
    finally:
        for c in m.clients:  # first the clients: quit waits for them
            c.stop()
        left = m.controls() + m.servers()
        subprocess.run([control], input="quit\n", text=True, env=m.env, timeout=60, check=False)
        deadline = time.monotonic() + 60
        while any(not gone(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:  # ours (our pipe folder): never left running
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_mps_clients_their_server_and_its_baseline_on_a_real_gpu(mps):
    a = mps.client(2 * GiB)
    b = mps.client(GiB)
    servers = mps.servers()
    assert len(servers) == 1, f"MPS servers of this test's control daemon: {servers}; {mps.log_tail()}"
    (server,) = servers
    server_start = read_stat(server).start_ticks  # type: ignore[union-attr]

    # status: the clients are MPS clients of that server; the server is a GPU daemon
    procs = {p.pid: p for p in gpuslate.status([0]).gpus[0].processes}
    print(f"\nMPS: server {server} {procs[server].kind} {procs[server].used_memory} B; clients "
          f"{[(p.pid, p.kind, p.used_memory, p.mps_server) for p in procs.values() if p.pid in (a.pid, b.pid)]}")
    assert procs[server].daemon == SERVER and procs[server].kind == "compute"
    for c in (a, b):
        assert procs[c.pid].kind == "mps" and procs[c.pid].mps_server == server, procs[c.pid]

    # the plan names the client that shares the server, and spares the server
    plan = gpuslate.clear([0], pids=[a.pid], dry_run=True).plan
    (t,) = plan.targets
    assert t.ident.pid == a.pid and t.kind == "mps" and t.mps_server == server
    assert f"shares MPS server PID {server} with PID {b.pid}" in t.reason, t.reason
    # even with --include-handles the server is no target while its clients are not (a dry run)
    plan = gpuslate.clear([0], pids=[server], include_handles=True, dry_run=True).plan
    assert plan.targets == [] and any(s.pid == server and s.reason.startswith(MPS_SHARED) for s in plan.spared)

    # clear --pid of one client: it ends, the other keeps working, the server lives
    assert b.work().startswith("ok"), "the other client could not run a kernel before the clear"
    r = gpuslate.clear([0], pids=[a.pid], grace=10, timeout=60)
    print(f"clear --pid {a.pid}: status={r.status} timings={r.timings}")
    assert r.ok and [v.victim.ident.pid for v in r.results] == [a.pid], r.to_json()
    assert gone(a.pid) and not gone(b.pid) and not gone(server)
    answer = b.work()
    assert answer.startswith("ok"), f"the other client of the server failed after the clear: {answer}"

    # the last client too; then only the idle server is left: free, its memory a baseline apart
    r = gpuslate.clear([0], pids=[b.pid], grace=10, timeout=60)
    assert r.ok and gone(b.pid) and not gone(server), r.to_json()
    w = gpuslate.wait_free([0], timeout=30)
    print(f"idle server: ok={w.ok} used={w.readings[0].memory.used} baseline={w.baseline}")
    assert w.ok, w.to_json()
    (h,) = w.baseline
    assert h.pid == server and h.program == SERVER and 0 < h.bytes <= BASELINE_CAP
    cli = subprocess.run([sys.executable, "-m", "gpuslate", "wait", "--free", "--gpus", "0", "--timeout", "30",
                          "--json"], capture_output=True, text=True, env=gpuslate_env({"GPUSLATE_SIM": ""}),
                         timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout)["baseline"][0]["pid"] == server, cli.stdout + cli.stderr
    env = gpuslate_env({"GPUSLATE_SIM": "", "SLURM_JOB_ID": "77", "SLURM_JOB_UID": str(os.getuid()),
                        "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "gpuslate-test"})
    prolog = subprocess.run([sys.executable, "-m", "gpuslate", "slurm", "prolog", "--no-drain", "--timeout", "30",
                             "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert prolog.returncode == 0 and json.loads(prolog.stdout)["status"] == "clean", prolog.stdout + prolog.stderr
    plan = gpuslate.clear([0], dry_run=True).plan  # nothing signaled: a dry run of the whole GPU
    assert any(s.pid == server and "GPU daemon" in s.reason for s in plan.spared)
    assert server not in {t.ident.pid for t in plan.targets}

    # never signaled: the same process, and no audit entry names it
    st = read_stat(server)
    assert st is not None and st.start_ticks == server_start and not gone(server)
    entries = AuditLog(Path(os.environ["GPUSLATE_STATE_DIR"]) / "audit.jsonl", backend="nvml").read()
    assert entries and server not in {e["target"]["pid"] for e in entries}
    assert {e["target"]["pid"] for e in entries} == {a.pid, b.pid}
