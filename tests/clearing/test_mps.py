"""CUDA MPS on a simulated host, with real processes (issue 24, section 3): an idle MPS server is a
spared daemon whose memory is the host's baseline (shown apart, not counted), its clients are kind
``mps`` with their server's pid, the plan names the clients that share a server, and a clear of one
client leaves the other and the server alone.

The simulated server (``gpuslate sim mps``) runs as a copy of ``sleep`` named
``nvidia-cuda-mps-server``: a GPU daemon only when that copy is root's, as a real one is, so these
tests need root (CI runs as root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gpuslate
from gpuslate.host.daemons import BASELINE_CAP
from helpers import GiB, is_gone, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a simulated MPS server is a GPU daemon when root's")
MiB = 1024**2
SERVER = "nvidia-cuda-mps-server"


def alive(pid: int) -> bool:
    return not is_gone(pid)


def json_of(cli, *args: str) -> tuple[int, dict]:
    r = cli(*args, "--json")
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_an_idle_mps_server_is_a_spared_baseline_everywhere(sim_host, hold, cli):
    """wait --free and clear call a host whose only holder is an idle MPS server free; status shows
    its memory apart; the server is never signaled; status --json marks it and passes the schema."""
    server = hold("--gpus", "0,1", verb="mps")
    assert os.readlink(f"/proc/{server.pid}/exe") == str(sim_host.root / "bin" / SERVER)
    code, doc = json_of(cli, "wait", "--free", "--timeout", "5")
    assert code == 0 and doc["ok"], doc
    assert doc["baseline"] == [{"gpu": g, "pid": server.pid, "program": SERVER, "bytes": 66 * MiB} for g in (0, 1)]
    code, doc = json_of(cli, "clear", "--yes", "--timeout", "5")
    assert code == 0 and doc["status"] == "clean" and doc["targets"] == [], doc
    (s,) = doc["spared"]
    assert s["pid"] == server.pid and "GPU daemon (nvidia-cuda-mps-server)" in s["reason"]
    assert [h["gpu"] for h in doc["baseline"]] == [0, 1] and alive(server.pid)
    r = cli("status")
    assert f"GPU 0: 66.0 MiB held by {SERVER} (PID {server.pid}), spared" in r.stdout, r.stdout
    assert "compute (daemon)" in r.stdout
    code, doc = json_of(cli, "status")
    (p,) = doc["gpus"][0]["processes"]
    assert p["daemon"] == SERVER and p["kind"] == "compute" and p["mps_server"] is None
    valid_status(doc)


def valid_status(doc: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[2] / "docs" / "schemas" / "status.v1.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)


def test_clients_are_mps_with_their_server_and_the_plan_names_who_shares_it(sim_host, hold, cli):
    server = hold("--gpus", "0", verb="mps")
    a = hold("--gpus", "0", "--memory", "2GiB", "--mps")
    b = hold("--gpus", "0", "--memory", "1GiB", "--mps")
    code, doc = json_of(cli, "status", "--gpus", "0")
    procs = {p["pid"]: p for p in doc["gpus"][0]["processes"]}
    assert {procs[a.pid]["kind"], procs[b.pid]["kind"]} == {"mps"}
    assert procs[a.pid]["mps_server"] == procs[b.pid]["mps_server"] == server.pid
    valid_status(doc)
    assert f"mps (server {server.pid})" in cli("status").stdout
    code, doc = json_of(cli, "clear", "--dry-run", "--gpus", "0")
    assert code == 0, doc
    targets = {t["pid"]: t for t in doc["targets"]}
    assert set(targets) == {a.pid, b.pid}
    assert targets[a.pid]["kind"] == "mps" and targets[a.pid]["mps_server"] == server.pid
    assert targets[a.pid]["reason"].endswith(f"; shares MPS server PID {server.pid} with PID {b.pid}")
    (s,) = doc["spared"]
    assert s["pid"] == server.pid and f"the MPS server of PIDs {min(a.pid, b.pid)}, {max(a.pid, b.pid)}" in s["reason"]


def test_clear_of_one_client_leaves_the_other_and_the_server(sim_host, hold, cli):
    server = hold("--gpus", "0", verb="mps")
    a = hold("--gpus", "0", "--memory", "2GiB", "--mps")
    b = hold("--gpus", "0", "--memory", "1GiB", "--mps")
    result = gpuslate.clear(pids=[a.pid], grace=5, timeout=20)
    assert result.ok and [t.ident.pid for t in result.plan.targets] == [a.pid], result.to_json()
    assert is_gone(a.pid) and alive(b.pid) and alive(server.pid)
    assert {r.victim.ident.pid for r in result.results} == {a.pid}  # the server was never signaled
    spared = {s.pid: s for s in result.plan.spared}
    assert spared[b.pid].kind == "mps" and spared[b.pid].mps_server == server.pid
    # then the whole GPU: the other client goes, the server stays, and the GPU is clean
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "0", "--timeout", "10")
    assert code == 0 and doc["status"] == "clean" and [t["pid"] for t in doc["targets"]] == [b.pid], doc
    assert doc["after"][0]["used"] == 66 * MiB and doc["after"][0]["processes"] == [server.pid]
    assert alive(server.pid)
    text = cli("clear", "--yes", "--gpus", "0").stdout
    assert f"66.0 MiB → 66.0 MiB (66.0 MiB held by {SERVER} (PID {server.pid}), spared)" in text, text


def test_a_daemon_above_its_baseline_is_a_holder_with_a_remedy_that_works(sim_host, hold, cli):
    """An MPS server holding more than a daemon's baseline counts as used: wait says which and how to
    end it (never "run clear", which spares it); clear fails fast, and with --include-handles ends it."""
    server = hold("--gpus", "2", "--footprint", "2GiB", verb="mps")
    assert 2 * GiB > BASELINE_CAP
    code, doc = json_of(cli, "wait", "--free", "--gpus", "2", "--timeout", "0")
    assert code == 4 and doc["baseline"] == [], doc
    (p,) = doc["diagnosis"][0]["problems"]
    assert p["pid"] == server.pid and "GPU daemon (nvidia-cuda-mps-server)" in p["reason"]
    assert "echo quit | nvidia-cuda-mps-control" in p["remedy"] and "--include-handles" in p["remedy"]
    assert "run 'gpuslate clear'" not in p["remedy"]
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "2", "--timeout", "10")
    assert code == 4 and doc["status"] == "held_by_others" and alive(server.pid), doc
    (p,) = doc["diagnosis"][0]["problems"]
    assert p["pid"] == server.pid and p["remedy"] == "add --include-handles"
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "2", "--include-handles", "--timeout", "10")
    assert code == 0 and doc["baseline"] == [], doc
    # the server, and its job's launcher: the control daemon that started it, which leads its group
    roles = {t["pid"]: t["role"] for t in doc["targets"]}
    assert roles == {server.pid: "holder", server.ready["control"]: "launcher"}
    assert is_gone(server.pid)


def test_a_targeted_daemon_is_no_baseline(sim_host, hold):
    """With --include-handles an idle server is a target: its memory must go, and does."""
    server = hold("--gpus", "3", verb="mps")
    result = gpuslate.clear([3], include_handles=True, grace=5, timeout=20)
    assert result.ok and server.pid in {t.ident.pid for t in result.plan.targets}, result.to_json()
    assert result.baseline == () and result.after[0].memory.used == 0 and is_gone(server.pid)


def test_a_server_whose_program_anyone_may_write_is_no_daemon(sim_host, hold, cli):
    """The same program made group-writable is no system program: an ordinary holder, counted."""
    server = hold("--gpus", "4", verb="mps")
    exe = sim_host.root / "bin" / SERVER
    exe.chmod(0o775)
    try:
        code, doc = json_of(cli, "wait", "--free", "--gpus", "4", "--timeout", "0")
        assert code == 4 and doc["baseline"] == [], doc
        (p,) = doc["diagnosis"][0]["problems"]
        assert p["pid"] == server.pid and p["remedy"] == "end it, or run 'gpuslate clear'"
        code, doc = json_of(cli, "clear", "--dry-run", "--gpus", "4")
        assert server.pid in [t["pid"] for t in doc["targets"]]  # what clear would do, as said
    finally:
        exe.chmod(0o755)


def test_units_preflight_and_the_slurm_prolog_call_an_idle_mps_host_free(sim_host, hold, monkeypatch, capsys):
    from gpuslate.cli.main import main
    from gpuslate.gpu.simhost import SimBackend
    from gpuslate.units.preflight import check_gpus

    server = hold("--gpus", "5", verb="mps")
    snap = check_gpus(SimBackend(sim_host.root), [5], 64 * MiB, for_unit="u", owners=dict)  # raises if busy
    assert [p.pid for p in snap.gpus[0].processes] == [server.pid]
    for k, v in {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": "5",
                 "SLURMD_NODENAME": "node07"}.items():
        monkeypatch.setenv(k, v)
    assert main(["slurm", "prolog", "--timeout", "2", "--no-drain", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "clean" and alive(server.pid)


def test_a_daemon_that_is_the_runs_own_is_no_baseline_when_polling(sim_host, hold):
    """clear, down and the slurm epilog poll with their targets excluded: a daemon they were ending
    keeps the GPU busy until it is gone."""
    import time

    from gpuslate.clearing.wait import poll_until_free
    from gpuslate.gpu.simhost import SimBackend
    from gpuslate.proc.daemons import DaemonWatch

    server = hold("--gpus", "6", verb="mps")
    be = SimBackend(sim_host.root)
    assert poll_until_free(be, [6], 64 * MiB, time.monotonic())[0]
    assert not poll_until_free(be, [6], 64 * MiB, time.monotonic(), daemons=DaemonWatch(exclude={server.pid}))[0]


def test_include_handles_never_ends_a_server_under_clients_it_does_not_end(sim_host, hold, cli):
    """Ending an MPS server ends its clients' GPU work: with --include-handles the server is a target
    only when every live client of it is one too."""
    server = hold("--gpus", "0,1", verb="mps")
    a = hold("--gpus", "0", "--memory", "1GiB", "--mps")
    b = hold("--gpus", "1", "--memory", "1GiB", "--mps")
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "0", "--include-handles", "--timeout", "10")
    assert code == 0 and doc["status"] == "clean" and [t["pid"] for t in doc["targets"]] == [a.pid], doc
    spared = {s["pid"]: s["reason"] for s in doc["spared"]}
    assert spared[server.pid] == (f"an MPS server whose other clients are not targets (PID {b.pid}): ending it "
                                  "would end their GPU work; end them first, or select them too")
    assert is_gone(a.pid) and alive(b.pid) and alive(server.pid)
    assert [h["pid"] for h in doc["baseline"]] == [server.pid]  # spared, so its memory is the baseline
    code, doc = json_of(cli, "clear", "--yes", "--include-handles", "--timeout", "10")  # every client: the server too
    assert code == 0 and {b.pid, server.pid} <= {t["pid"] for t in doc["targets"]}, doc
    assert is_gone(b.pid) and is_gone(server.pid)


def test_a_renamed_client_whose_pipe_is_unknown_keeps_every_server_it_could_use(sim_host, hold, cli):
    """Issue 32: two servers (pipe folders /pa and /pb); a client of the first renamed itself, its
    title written over its environment, so its pipe folder is unknown (it was read as the default,
    matched neither, and the client was dropped: both servers were SIGTERMed under it). It could be
    either's client: `clear --gpus 0 --include-handles` ends neither while it lives."""
    a = hold("--gpus", "0,1", verb="mps", env={"CUDA_MPS_PIPE_DIRECTORY": "/pa"})
    b = hold("--gpus", "0,1", verb="mps", env={"CUDA_MPS_PIPE_DIRECTORY": "/pb"})
    client = hold("--gpus", "1", "--memory", "1GiB", "--mps", "--title", "sglang::scheduler_TP0",
                  env={"CUDA_MPS_PIPE_DIRECTORY": "/pa", "SPT_NOENV": None, "GPUSLATE_SIM": None})
    with open(f"/proc/{client.pid}/environ", "rb") as f:
        assert b"CUDA_MPS_PIPE_DIRECTORY" not in f.read()  # written over: the pipe folder is unknown
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "0", "--include-handles", "--timeout", "5")
    assert [t["pid"] for t in doc["targets"]] == [], doc
    spared = {s["pid"]: s["reason"] for s in doc["spared"]}
    for server in (a, b):
        assert spared[server.pid].startswith(f"an MPS server whose other clients are not targets (PID {client.pid})")
        assert alive(server.pid)
    assert alive(client.pid)
    # the client's pipe read (a client started plainly, of server b): it protects b alone, and a is ended
    client.kill()
    wait_for(lambda: is_gone(client.pid))
    other = hold("--gpus", "1", "--memory", "1GiB", "--mps", env={"CUDA_MPS_PIPE_DIRECTORY": "/pb"})
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "0", "--include-handles", "--timeout", "10")
    targets = {t["pid"] for t in doc["targets"]}
    assert code == 0 and a.pid in targets and b.pid not in targets, doc
    wait_for(lambda: is_gone(a.pid))
    assert alive(b.pid) and alive(other.pid)


EXEC_AS_DAEMON = r"""
import os, sys
sys.path.insert(0, sys.argv[3])
from gpuslate.gpu.simhost.host import SimHost
host = SimHost(sys.argv[1])
with host.dev_dir() as dev:
    fds = [dev.open(n, os.O_RDONLY) for n in ("nvidiactl", "nvidia-uvm", host.device_path(int(sys.argv[2])).name)]
fds += host.allocate([(int(sys.argv[2]), 1 << 30)])
if sys.argv[5:] != ["driver"]:  # else the descriptors as the driver opens them: close-on-exec
    for fd in fds:
        os.set_inheritable(fd, True)  # kept across the exec: the memory stays held
os.execv(sys.argv[4], ["nvidia-cuda-mps-server", "600"])
"""


def test_an_exec_with_the_drivers_descriptors_as_opened_releases_the_memory(sim_host, cli):
    """The driver's descriptors are close-on-exec (libcuda opens its context's device files with
    O_CLOEXEC), so a holder that execs a daemon's program without clearing FD_CLOEXEC holds nothing
    after the exec and is no longer listed: only one that clears it (the test below) keeps its memory.
    tests/gpu/test_mps_hostile_real.py records what the real driver does in both shapes."""
    from gpuslate.gpu.simhost.host import SimHost
    from gpuslate.proc.procfs import read_exe
    from helpers import SRC

    SimHost(sim_host.root).daemon_program(SERVER)  # root's program, as the driver's package installs it
    program = str(sim_host.root / "bin" / SERVER)
    p = subprocess.Popen([sys.executable, "-c", EXEC_AS_DAEMON, str(sim_host.root), "3", SRC, program, "driver"],
                         start_new_session=True)
    try:
        wait_for(lambda: read_exe(p.pid) == program)
        code, doc = json_of(cli, "wait", "--free", "--gpus", "3", "--timeout", "10")
        assert code == 0 and doc["baseline"] == [], doc
        status = json_of(cli, "status", "--gpus", "3")[1]
        assert all(pr["pid"] != p.pid for g in status["gpus"] for pr in g["processes"]), status
        assert alive(p.pid)
    finally:
        p.kill()
        p.wait()


def test_another_users_process_that_execs_roots_daemon_program_is_no_baseline(shared_host, other_user, cli):
    """Issue 32: another user allocates 1 GiB, then execs root's nvidia-cuda-mps-server keeping its
    descriptors. It runs a GPU daemon's system program, so clear spares it; but it is not proven the
    daemon (no control daemon started it), so its memory is held: root's `wait --free` does not return
    0 and `clear --all-users` does not say clean."""
    from gpuslate.gpu.simhost.host import SimHost
    from gpuslate.proc.procfs import read_exe
    from helpers import SRC
    from otheruser import SYSTEM_PYTHON

    SimHost(shared_host.root).daemon_program(SERVER)  # root's program, as the driver's package installs it
    program = str(shared_host.root / "bin" / SERVER)
    py = SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable
    p = subprocess.Popen([py, "-c", EXEC_AS_DAEMON, str(shared_host.root), "3", SRC, program],
                         user=other_user.pw_uid, group=other_user.pw_gid, extra_groups=[], cwd="/",
                         start_new_session=True, env={"PATH": "/usr/bin:/bin"})
    try:
        wait_for(lambda: read_exe(p.pid) == program and open(f"/proc/{p.pid}/environ", "rb").read(1) != b"")
        code, doc = json_of(cli, "wait", "--free", "--gpus", "3", "--timeout", "0")
        assert code == 4 and doc["baseline"] == [], doc
        (problem,) = doc["diagnosis"][0]["problems"]
        assert problem["pid"] == p.pid and "not proven that daemon" in problem["reason"]
        assert "its parent is not the nvidia-cuda-mps-control" in problem["reason"], problem
        assert f"gpuslate clear --pid {p.pid} --include-handles" in problem["remedy"]
        code, doc = json_of(cli, "clear", "--yes", "--all-users", "--gpus", "3", "--timeout", "5")
        assert code == 4 and doc["status"] == "held_by_others" and doc["targets"] == [] and doc["baseline"] == []
        assert alive(p.pid)
        status = json_of(cli, "status", "--gpus", "3")[1]
        (proc,) = status["gpus"][0]["processes"]
        assert proc["daemon"] == SERVER and "its parent is not" in proc["daemon_unproven"]
        valid_status(status)
    finally:
        p.kill()
        p.wait()


def test_a_server_with_ld_preload_is_no_baseline(sim_host, hold, cli):
    """The real program with code of someone else's preloaded into it (LD_PRELOAD, even naming a system
    library): spared, never the host's baseline."""
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6") if os.path.exists(p))
    server = hold("--gpus", "4", verb="mps", env={"LD_PRELOAD": libc})
    code, doc = json_of(cli, "wait", "--free", "--gpus", "4", "--timeout", "0")
    assert code == 4 and doc["baseline"] == [], doc
    (problem,) = doc["diagnosis"][0]["problems"]
    assert problem["pid"] == server.pid and "LD_PRELOAD or LD_AUDIT in its environment" in problem["reason"]
    code, doc = json_of(cli, "clear", "--yes", "--gpus", "4", "--timeout", "5")
    assert code == 4 and doc["status"] == "held_by_others" and alive(server.pid), doc


def test_daemons_together_are_allowed_the_cap_per_gpu_not_each(sim_host, hold, cli):
    """Issue 32: the allowance was per daemon, so four daemons on one GPU hid four times it. Four
    proven servers of 200 MiB on one GPU: together they are allowed 256 MiB, so one is the baseline and
    the GPU is not free, each of the others named."""
    servers = [hold("--gpus", "5", "--footprint", "200MiB", verb="mps") for _ in range(4)]
    code, doc = json_of(cli, "wait", "--free", "--gpus", "5", "--timeout", "0")
    assert code == 4, doc
    assert [h["bytes"] for h in doc["baseline"]] == [200 * MiB] and 200 * MiB <= BASELINE_CAP < 400 * MiB
    named = {p["pid"] for p in doc["diagnosis"][0]["problems"]}
    assert named == {s.pid for s in servers} - {doc["baseline"][0]["pid"]}
    assert all("more than GPU daemons may hold together on a GPU (256.0 MiB)" in p["reason"]
               for p in doc["diagnosis"][0]["problems"])
    for s in servers[1:]:
        s.kill()
    wait_for(lambda: json_of(cli, "wait", "--free", "--gpus", "5", "--timeout", "0")[0] == 0, timeout=10)


def test_a_replaced_program_file_is_no_baseline(sim_host, hold, cli):
    """A daemon whose program file was replaced since it started (an upgrade, or a swap) runs what is no
    longer the system's file: not proven."""
    server = hold("--gpus", "6", verb="mps")
    exe = sim_host.root / "bin" / SERVER
    tmp = exe.with_name(".new")
    shutil.copy(exe, tmp)
    os.replace(tmp, exe)
    code, doc = json_of(cli, "wait", "--free", "--gpus", "6", "--timeout", "0")
    assert code == 4 and doc["baseline"] == [], doc
    assert "its program file was replaced or deleted" in doc["diagnosis"][0]["problems"][0]["reason"]
    assert alive(server.pid)
