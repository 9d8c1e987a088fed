"""``gpuslate sim mps`` and ``sim hold --mps``: a simulated CUDA MPS server is a real process running
a program named nvidia-cuda-mps-server (root's, when root makes it), holding its footprint as a
compute context; its clients hold MPS contexts and need their user's server on each of their GPUs.
"""

from __future__ import annotations

import os
import signal
import stat

import pytest

from gpuslate.gpu.simhost import SimBackend
from gpuslate.proc.procfs import read_stat
from helpers import is_gone, run_cli, wait_for

MiB = 1024**2
SERVER = "nvidia-cuda-mps-server"


def listed(sim_host, gpu: int) -> dict[int, tuple[str, int | None]]:
    (r,) = SimBackend(sim_host.root).read([gpu], full=False)
    return {p.pid: (p.kind, p.used_memory) for p in r.processes or []}


def test_the_server_runs_as_its_program_holds_its_footprint_and_quits_with_its_parent(sim_host, hold):
    """As on the H200 (benchmarks/results/probe-mps-h200.log): the server runs the server's program, its
    parent is the control daemon, which runs the control daemon's program in a session of its own, and
    the server's environment is the control daemon's."""
    server = hold("--gpus", "0,2", "--footprint", "100MiB", verb="mps", env={"CUDA_MPS_PIPE_DIRECTORY": "/run/x"})
    exe = sim_host.root / "bin" / SERVER
    control = server.ready["control"]
    assert os.readlink(f"/proc/{server.pid}/exe") == str(exe)
    assert os.readlink(f"/proc/{control}/exe") == str(sim_host.root / "bin" / "nvidia-cuda-mps-control")
    with open(f"/proc/{server.pid}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == SERVER.encode()
    st = os.stat(exe)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o755
    srv, ctl = read_stat(server.pid), read_stat(control)
    assert srv.ppid == control and ctl.ppid == server.proc.pid and ctl.sid == ctl.pid == srv.sid == srv.pgid
    with open(f"/proc/{server.pid}/environ", "rb") as f:
        assert b"\0CUDA_MPS_PIPE_DIRECTORY=/run/x\0" in b"\0" + f.read()
    assert listed(sim_host, 0) == {server.pid: ("compute", 100 * MiB)} == listed(sim_host, 2)
    assert listed(sim_host, 1) == {}
    os.kill(server.proc.pid, signal.SIGTERM)  # 'quit': the command ends the server and the control daemon
    assert server.proc.wait(10) == 0
    wait_for(lambda: is_gone(server.pid) and is_gone(control))
    wait_for(lambda: not listed(sim_host, 0), timeout=5)


def test_clients_hold_mps_contexts_and_need_their_users_server_on_each_gpu(sim_host, hold):
    r = run_cli("--sim", str(sim_host.root), "sim", "hold", "--mps", "--gpus", "0", "--memory", "1GiB")
    assert r.returncode == 6 and r.stderr.strip() == (
        "gpuslate: error: no simulated MPS server of this user on GPU 0: start one with "
        "'gpuslate sim mps --gpus 0'"), r.stderr
    server = hold("--gpus", "0", verb="mps")
    r = run_cli("--sim", str(sim_host.root), "sim", "hold", "--mps", "--gpus", "0-1", "--memory", "1GiB")
    assert r.returncode == 6 and "on GPU 1:" in r.stderr and listed(sim_host, 0) == {server.pid: ("compute", 66 * MiB)}
    job = hold("--mps", "--gpus", "0", "--memory", "1GiB", "--workers", "2")
    procs = listed(sim_host, 0)
    assert {pid: procs[pid] for pid in job.workers} == dict.fromkeys(job.workers, ("mps", 512 * MiB))


def test_bad_footprints_and_no_room(sim_host):
    def mps(*args: str):
        return run_cli("--sim", str(sim_host.root), "sim", "mps", *args, timeout=30)

    r = mps("--footprint", "0")
    assert r.returncode == 2 and "invalid --footprint" in r.stderr
    r = mps("--gpus", "1", "--footprint", "200GiB")
    assert r.returncode == 6 and "out of memory" in r.stderr and r.stdout == "", r.stderr
    assert listed(sim_host, 1) == {} and not sim_host.records()
    r = mps("--gpus", "9")
    assert r.returncode == 2 and "GPU 9 does not exist" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root to make")
def test_a_program_another_user_could_have_put_there_is_never_run(sim_host, hold, tmp_path):
    where = sim_host.root / "bin"
    where.mkdir()
    planted = where / SERVER
    mark = tmp_path / "ran"
    planted.write_text(f"#!/bin/sh\ntouch {mark}\nexec sleep 60\n")
    planted.chmod(0o777)  # anyone may have written it: replaced by a fresh copy, never run
    server = hold("--gpus", "3", verb="mps")
    assert not mark.exists() and planted.read_bytes()[:4] == b"\x7fELF" and not os.stat(planted).st_mode & 0o022
    server.kill()
    where.chmod(0o777)  # a folder anyone may write: refused
    r = run_cli("--sim", str(sim_host.root), "sim", "mps", "--gpus", "3", timeout=30)
    assert r.returncode == 5 and "never run from there" in r.stderr, r.stderr
    os.chown(where, 12345, -1)
    where.chmod(0o755)  # another user's folder: refused too
    r = run_cli("--sim", str(sim_host.root), "sim", "mps", "--gpus", "3", timeout=30)
    assert r.returncode == 5 and not mark.exists(), r.stderr
