"""Against a real slurmctld + two slurmd + munge (issue 18, "Done when" 1-5).

Every GPU is a simulated one (``ROOT/sim-NODE``), held by real processes; the
jobs run as the user running the tests (root: Slurm's daemons need it). Each
test leaves the nodes idle and the simulated hosts empty.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import SlurmCluster
from gpuslate.host.audit import AuditLog
from helpers import is_gone, wait_for

pytestmark = pytest.mark.slow  # the whole file: a real munged, slurmctld and two slurmd

PY = sys.executable


def _job_done(c: SlurmCluster, job_id: int) -> bool:
    return c.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "") and \
        c.run("squeue", "-h", "-j", str(job_id), check=False).stdout.strip() == ""


def _epilog_doc(c: SlurmCluster, job_id: int, node: str) -> dict:
    path = c.hooks / f"epilog-{job_id}-{node}.json"
    wait_for(lambda: path.exists() and path.read_text().strip(), timeout=20, interval=0.05)
    return json.loads(path.read_text())


def _holder_script(c: SlurmCluster, node: str, memory: str, ready: Path, detach: bool) -> str:
    """A batch script holding its GPU: detached (setsid nohup, left behind) or in the foreground."""
    hold = (f"{PY} -m gpuslate --sim {c.sim(node).root} sim hold --gpus $SLURM_JOB_GPUS --memory {memory} "
            f"> {ready} 2>&1 < /dev/null")
    if not detach:
        return hold
    return (f"setsid nohup {hold} & "
            f"i=0; until grep -q ready {ready} 2>/dev/null || [ $i -gt 200 ]; do sleep 0.05; i=$((i+1)); done")


def _ready_pid(path: Path) -> int:
    line = wait_for(lambda: next((ln for ln in path.read_text().splitlines() if '"ready"' in ln), None)
                    if path.exists() else None, timeout=20, interval=0.05)
    return int(json.loads(line)["pid"])


@pytest.fixture
def node_clean(cluster: SlurmCluster):
    """Each test ends with its nodes idle (resumed) and their simulated GPUs empty."""
    yield cluster
    cluster.run("scancel", "--user=root", check=False)
    wait_for(lambda: cluster.run("squeue", "-h", check=False).stdout.strip() == "", timeout=20, interval=0.1)
    for n in cluster.nodes:
        for rec in cluster.sim(n).records():
            if rec.pid is not None:
                try:
                    os.kill(rec.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        cluster.reset_sim(n)
        cluster.resume(n)
    wait_for(lambda: set(cluster.states().values()) == {"idle"}, timeout=20, interval=0.1)


def test_epilog_ends_the_jobs_leftover_and_spares_another_job_of_the_same_user(node_clean):
    """(1) a job leaves a setsid nohup holder on its GPU: after the job it is gone, the node is
    idle, the audit log names the job. (2) Another job of the same user, running on another GPU
    of the node, is untouched throughout."""
    c = node_clean
    other_ready = c.root / "other.ready"
    other = c.sbatch("-w", "n1", "--gres=gpu:1", "-o", "/dev/null",
                     "--wrap", _holder_script(c, "n1", "1GiB", other_ready, detach=False))
    other_pid = _ready_pid(other_ready)
    left_ready = c.root / "left.ready"
    job = c.sbatch("-w", "n1", "--gres=gpu:1", "-o", "/dev/null",
                   "--wrap", _holder_script(c, "n1", "2GiB", left_ready, detach=True))
    left_pid = _ready_pid(left_ready)
    wait_for(lambda: _job_done(c, job), timeout=20, interval=0.05)
    doc = _epilog_doc(c, job, "n1")
    assert doc["status"] == "clean", doc
    assert left_pid in [p["pid"] for p in doc["found"]]
    assert other_pid not in [p["pid"] for p in doc["found"]]
    wait_for(lambda: is_gone(left_pid), timeout=10)
    # the node is back to serving (the other job still runs on it), not drained
    assert "DRAIN" not in c.node("n1")["State"]
    # the audit log of n1's simulated host names the job in every entry of this run
    entries = [e for e in AuditLog(c.sim("n1").root / "state" / "audit.jsonl", backend="sim").read()
               if e["target"]["pid"] == left_pid]
    assert entries and all(e["context"]["slurm_job"] == job for e in entries)
    assert entries[0]["signal"] == "SIGTERM"
    # (2): the other job of the same user is untouched, still running, still holding its GPU
    assert not is_gone(other_pid)
    assert c.job(other)["JobState"] == "RUNNING"
    assert not any(e["target"]["pid"] == other_pid
                   for e in AuditLog(c.sim("n1").root / "state" / "audit.jsonl", backend="sim").read())
    # once the other job ends too, the node is idle
    c.run("scancel", str(other))
    wait_for(lambda: c.states().get("n1") == "idle", timeout=20, interval=0.1)
    assert _epilog_doc(c, other, "n1")["status"] == "clean"


def test_epilog_drains_the_node_when_memory_stays_held_by_no_process(node_clean):
    """(3) after the job, memory held by no process (sim leak): the node drains with gpuslate's reason."""
    c = node_clean
    job = c.sbatch("-w", "n2", "--gres=gpu:1", "-o", "/dev/null",
                   "--wrap", f"{PY} -m gpuslate --sim {c.sim('n2').root} sim leak --gpu $SLURM_JOB_GPUS "
                             "--memory 3GiB")
    doc = _epilog_doc(c, job, "n2")
    assert doc["status"] == "drained" and doc["drain"]["ok"], doc
    gpu = doc["job"]["gpus"][0]
    expected = f"gpuslate: GPU {gpu} holds 3.0 GiB after job {job} (no process holds it)"
    assert doc["drain"]["reason"] == expected
    node = wait_for(lambda: (lambda n: n if "DRAIN" in n["State"] else None)(c.node("n2")), timeout=10)
    assert node["Reason"].startswith(expected)
    assert (c.hooks / f"epilog-{job}-n2.err").read_text() == ""  # no traceback, no noise


def test_prolog_drains_and_requeues_then_the_job_runs_once_resumed(node_clean):
    """(4) the prolog finds the job's GPU held: the node drains, the job is requeued; once the GPU
    is freed and the node resumed, the job runs."""
    c = node_clean
    squatter = subprocess.Popen([PY, "-m", "gpuslate", "--sim", str(c.sim("n2").root), "sim", "hold",
                                 "--gpus", "0-1", "--memory", "1GiB"], stdout=subprocess.PIPE, text=True,
                                env=c.env, start_new_session=True)
    try:
        assert "ready" in squatter.stdout.readline()
        out = c.root / "requeued.out"
        job = c.sbatch("-w", "n2", "--gres=gpu:1", "-o", str(out), "--wrap", "echo ran on $SLURMD_NODENAME")
        wait_for(lambda: int(c.job(job).get("Restarts", "0")) >= 1, timeout=20, interval=0.1)
        node = c.node("n2")
        assert "DRAIN" in node["State"]
        assert node["Reason"].startswith("gpuslate: GPU ") and f"before job {job}" in node["Reason"]
        assert f"pid {squatter.pid}" in node["Reason"]
        wait_for(lambda: c.job(job)["JobState"] == "PENDING", timeout=20, interval=0.1)  # requeued, not held
        assert not is_gone(squatter.pid)  # the prolog signals nothing
        # Slurm runs the refused job's epilog: the node stays drained, with the prolog's reason
        epilog = _epilog_doc(c, job, "n2")
        assert epilog["status"] == "drained" and epilog["drain"]["already"]
        assert f"before job {job}" in c.node("n2")["Reason"]
    finally:
        os.killpg(squatter.pid, signal.SIGKILL)
        squatter.wait()
    c.resume("n2")
    c.run("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)
    # slurmctld's next scheduling pass: seconds, longer with other test files running beside this one
    wait_for(lambda: _job_done(c, job), timeout=90, interval=0.1)
    assert c.job(job)["JobState"] == "COMPLETED"
    assert "ran on n2" in out.read_text()


def test_a_command_across_a_two_node_allocation_gives_one_fleet_document(node_clean):
    """(5) inside a two-node allocation, --slurm runs the command on each node through srun:
    one gpuslate.fleet.v1 document, and exit 7 when one node fails and the other does not."""
    c = node_clean
    env = {"GPUSLATE_REMOTE_COMMAND": str(c.hooks / "gpuslate-on-node")}
    p = c.run("salloc", "-N2", "-w", "n[1-2]", "--gres=gpu:1", PY, "-m", "gpuslate", "--slurm", "status",
              "--json", env=env, check=False, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "gpuslate.fleet.v1"
    assert [h["host"] for h in doc["hosts"]] == ["n1", "n2"]
    assert [len(h["result"]["gpus"]) for h in doc["hosts"]] == [4, 2]  # each node's own GPUs
    # GPU 3 exists on n1 only: n2 fails with its own usage error, the whole run is partial
    p = c.run("salloc", "-N2", "-w", "n[1-2]", PY, "-m", "gpuslate", "--slurm", "wait", "--free", "--gpus", "3",
              "--timeout", "0", "--json", env=env, check=False, timeout=60)
    assert p.returncode == 7, p.stderr
    doc = json.loads(p.stdout)
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["n1"]["ok"] and by["n1"]["exit_code"] == 0
    assert not by["n2"]["ok"] and by["n2"]["exit_code"] == 2 and "GPU 3" in by["n2"]["error"]["message"]


# -- renamed leftovers (issue 24): found by their GPUs where the environment says nothing ------

def _environ(pid: int) -> bytes:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return f.read()


def _renamed_holder(c: SlurmCluster, node: str, gpus: str, memory: str, ready: Path, title: str,
                    detach: bool) -> str:
    """A holder renamed with setproctitle where TaskProlog's SPT_NOENV does not reach (``env -u``:
    a site without it, a library that writes over the environment anyway): its environment then
    reads as the title's padding, no SLURM_JOB_ID."""
    hold = (f"env -u SPT_NOENV {PY} -m gpuslate --sim {c.sim(node).root} sim hold --gpus {gpus} --memory {memory} "
            f"--title {title} > {ready} 2>&1 < /dev/null")
    if not detach:
        return hold
    return f"setsid nohup {hold} & until grep -q ready {ready} 2>/dev/null; do sleep 0.02; done"


def _started(pid: int) -> float:
    from gpuslate.proc.procfs import read_stat, ticks_to_epoch

    st = read_stat(pid)
    assert st is not None
    return ticks_to_epoch(st.start_ticks)


def test_epilog_ends_a_renamed_leftover_by_its_gpu_and_spares_a_renamed_job_of_the_same_user(node_clean):
    """The issue's reproduction: a job leaves `setsid nohup gpuslate sim hold ... --title escaped`
    whose environment no longer shows SLURM_JOB_ID, and ends: the epilog ends it, found by its GPU,
    at once (not after the timeout, not a drain). A second job of the same user, started after the
    leftover, renamed as well, on another GPU, runs on untouched. TaskProlog gave every task
    SPT_NOENV=1."""
    c = node_clean
    go, env_file, left_ready = c.root / "renamed.go", c.root / "renamed.env", c.root / "renamed-left.ready"
    job = c.sbatch("-w", "n1", "--gres=gpu:1", "-o", "/dev/null", "--wrap",
                   f"echo \"$SPT_NOENV $CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS\" > {env_file}; "
                   + _renamed_holder(c, "n1", "$CUDA_VISIBLE_DEVICES", "7GiB", left_ready, "escaped", detach=True)
                   + f"; until [ -e {go} ]; do sleep 0.02; done")
    left = _ready_pid(left_ready)
    noenv, visible, gpus = env_file.read_text().split()
    assert noenv == "1" and visible == gpus  # TaskProlog's export reached the job; GRES index = CUDA index
    assert b"SLURM_JOB_ID" not in _environ(left) and open(f"/proc/{left}/comm").read().strip() == "escaped"
    # the other job starts after the leftover did, by more than the second Slurm counts in and the clock
    # margin (leftover.CLOCK_MARGIN_S): it cannot have started it
    wait_for(lambda: time.time() >= int(_started(left)) + 2.05, timeout=4, interval=0.02)
    other_ready = c.root / "renamed-other.ready"
    other = c.sbatch("-w", "n1", "--gres=gpu:1", "-o", "/dev/null", "--wrap",
                     _renamed_holder(c, "n1", "$CUDA_VISIBLE_DEVICES", "1GiB", other_ready, "renamed-other",
                                     detach=False))
    other_pid = _ready_pid(other_ready)
    assert b"SLURM_JOB_ID" not in _environ(other_pid)
    go.touch()
    wait_for(lambda: _job_done(c, job), timeout=20, interval=0.05)
    doc = _epilog_doc(c, job, "n1")
    assert doc["status"] == "clean" and doc["unproven"] == [], doc
    assert {"pid": left, "found_by": "gpu"} in doc["found"] and other_pid not in [f["pid"] for f in doc["found"]]
    assert doc["timings"]["total_s"] < 2.0, doc["timings"]  # ended and verified, not the 3 s timeout
    wait_for(lambda: is_gone(left), timeout=10)
    assert "DRAIN" not in c.node("n1")["State"]
    log = AuditLog(c.sim("n1").root / "state" / "audit.jsonl", backend="sim").read()
    assert [e["target"]["pid"] for e in log if e["context"]["slurm_job"] == job] == [left]
    assert not is_gone(other_pid) and c.job(other)["JobState"] == "RUNNING"
    assert not any(e["target"]["pid"] == other_pid for e in log)


def test_epilog_drains_naming_a_renamed_holder_of_a_gpu_another_job_holds(node_clean):
    """The shared-GPU case: the ended job's renamed leftover holds its GPU and the GPU of another
    running job of the same user. Exclusivity cannot be shown: nothing is signaled, the node drains
    naming the holder, the document says why it was not taken for the job's."""
    c = node_clean
    other_ready = c.root / "sharing-other.ready"
    other = c.sbatch("-w", "n2", "--gres=gpu:1", "-o", "/dev/null", "--wrap",
                     f"{PY} -m gpuslate --sim {c.sim('n2').root} sim hold --gpus $SLURM_JOB_GPUS --memory 1GiB "
                     f"> {other_ready} 2>&1 < /dev/null")
    other_pid = _ready_pid(other_ready)
    other_gpu = next(h.record.gpu for h in c.sim("n2").held() if h.record.pid == other_pid)
    left_ready = c.root / "sharing-left.ready"
    job = c.sbatch("-w", "n2", "--gres=gpu:1", "-o", "/dev/null", "--wrap",
                   _renamed_holder(c, "n2", f"$SLURM_JOB_GPUS,{other_gpu}", "2GiB", left_ready, "escaped",
                                   detach=True))
    left = _ready_pid(left_ready)
    doc = _epilog_doc(c, job, "n2")
    assert doc["status"] == "drained" and doc["found"] == [] and doc["clear"] is None, doc
    assert doc["unproven"] == [{"pid": left, "reason": f"GPU {other_gpu} is job {other}'s"}]
    assert f"pid {left} escaped" in doc["drain"]["reason"] and f"after job {job}" in doc["drain"]["reason"]
    assert not is_gone(left) and not is_gone(other_pid) and c.job(other)["JobState"] == "RUNNING"
    assert not any(e["target"]["pid"] in (left, other_pid)
                   for e in AuditLog(c.sim("n2").root / "state" / "audit.jsonl", backend="sim").read())
