"""CUDA MPS on a real GPU (``pytest -m gpu`` on the device): a private MPS control daemon and two
torch clients, started by the test (issue 24, section 3).

What is checked: the clients are kind ``mps`` with their server's pid; the server is a GPU daemon
whose idle memory is a baseline (``wait --free`` succeeds with only the idle server left, and the
slurm prolog calls the GPU free); the plan names the client that shares the server; ``clear --pid``
of one client ends it and leaves the other working (it runs a kernel afterwards) and the server
alive; ``--include-handles`` never makes the server a target while a client of it is not (a dry run);
the server is never signaled (no audit entry names it, and it is the same process at the end).

The daemon has its own pipe and log folders in a temporary folder (``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_LOG_DIRECTORY``), so it serves only this test's clients; the fixture (conftest.py, with
mpskit.py) ends the clients and sends ``quit`` to it (``echo quit | nvidia-cuda-mps-control``) also
when the test fails. It never uses ``terminate_client``, which on the H200 faulted the other client
of the same server.
Every clear here selects by ``--pid``: the test ends only processes it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuslate
from gpuslate.clearing.plan import MPS_SHARED
from gpuslate.host.audit import AuditLog
from gpuslate.host.daemons import BASELINE_CAP
from gpuslate.proc.procfs import read_stat
from helpers import gpuslate_env
from mpskit import SERVER, GiB, gone

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


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
