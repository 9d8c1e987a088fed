"""``gpuslate slurm epilog/prolog`` without Slurm: the job-finding rule, the gate and
bad environments, with real processes on a simulated host (the environment Slurm
would give a hook is set by hand; a stand-in ``scontrol`` records what it is asked).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslate.cli.main import main
from gpuslate.gpu.simhost.host import SimHost
from gpuslate.host.audit import AuditLog
from gpuslate.proc.procfs import read_cmdline
from helpers import GiB, count_host_opens, is_gone, run_cli, wait_for

FAKE_SCONTROL = """#!/bin/sh
# stands in for Slurm's scontrol: shows the jobs of $FAKE_JOBS (a file), the node as $FAKE_STATE with
# $FAKE_GRES (or prints $FAKE_NODE instead, when set); records an update's arguments, one a line
if [ "$1 $2 $3" = "-o -d show" ]; then if [ -n "$FAKE_JOBS" ]; then cat "$FAKE_JOBS"; fi; exit 0; fi
if [ "$1 $2 $3" = "-o show partition" ]; then echo "PartitionName=test OverSubscribe=NO"; exit 0; fi
if [ "$1" = "-o" ]; then
  if [ -n "${{FAKE_NODE+set}}" ]; then printf '%s' "$FAKE_NODE"; exit 0; fi
  echo "NodeName=$4 Gres=${{FAKE_GRES:-gpu:4}} Partitions=test State=${{FAKE_STATE:-IDLE}} Reason=$FAKE_REASON"
  exit 0
fi
printf '%s\\n' "$@" > "{out}"
"""


@pytest.fixture
def slurm_env(sim_host: SimHost, tmp_path: Path) -> dict[str, str]:
    """A hook's environment as Slurm sets it (no PATH of its own: a stand-in scontrol on ours)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(FAKE_SCONTROL.format(out=tmp_path / "scontrol.args"))
    fake.chmod(0o755)
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": "1",
            "SLURMD_NODENAME": "node07", "PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.fixture
def job_hold(sim_host: SimHost) -> Iterator[Callable[..., dict]]:
    """A real holder started with a given environment (its SLURM_JOB_ID, or none); returns its ready line."""
    started: list[subprocess.Popen[str]] = []

    def start(job: str | None, *args: str, shell: str | None = None, verb: str = "hold") -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
        if job is not None:
            env["SLURM_JOB_ID"] = job
        hold = [sys.executable, "-m", "gpuslate", "--sim", str(sim_host.root), "sim", verb, *args]
        argv = ["sh", "-c", shell.format(hold=" ".join(hold))] if shell else hold
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        started.append(p)
        ready, _, _ = select.select([p.stdout], [], [], 20)
        line = p.stdout.readline() if ready else ""
        assert line, "holder did not become ready"
        doc = json.loads(line)
        doc["popen"] = p
        return doc

    yield start
    for p in started:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(5)


def _hook(hook: str, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("slurm", hook, "--timeout", "2", *extra, "--json", env=env)


def test_epilog_ends_only_the_ended_jobs_processes(sim_host, slurm_env, job_hold, tmp_path):
    mine = job_hold("42", "--gpus", "1", "--memory", "2GiB", "--workers", "2")
    other_job = job_hold("43", "--gpus", "2", "--memory", "1GiB")  # same user, another job
    no_job = job_hold(None, "--gpus", "3", "--memory", "1GiB")  # same user, no job at all
    p = _hook("epilog", slurm_env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "gpuslate.slurm.v1" and doc["status"] == "clean"
    assert set(mine["workers"]) <= {f["pid"] for f in doc["found"]}  # the holders of the job
    assert {mine["pid"], *mine["workers"]} == {t["pid"] for t in doc["clear"]["targets"]}  # and their launcher
    assert all(f["found_by"] == "environment" for f in doc["found"])
    for pid in (mine["pid"], *mine["workers"]):
        assert is_gone(pid)
    for pid in (other_job["pid"], no_job["pid"]):
        assert not is_gone(pid)
    entries = AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()
    assert entries and {e["target"]["pid"] for e in entries} <= {mine["pid"], *mine["workers"]}
    assert all(e["context"] == {"slurm_job": 42, "slurm_hook": "epilog", "slurm_node": "node07"} for e in entries)
    assert not (tmp_path / "scontrol.args").exists()  # clean: nothing drained


def test_epilog_opens_one_host_backend_lock_and_audit_log(sim_host, slurm_env, job_hold, tmp_path, monkeypatch,
                                                          capsys):
    """In process, counted: finding the job's holders, clearing them (plan, lock, signals, audit)
    and verifying the GPUs all go through the one Host the hook opened; the job marks its entries."""
    mine = job_hold("42", "--gpus", "1", "--memory", "2GiB", "--workers", "2")
    for k, v in slurm_env.items():
        monkeypatch.setenv(k, v)
    counts = count_host_opens(monkeypatch)
    assert main(["slurm", "epilog", "--timeout", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "clean" and doc["clear"]["status"] == "clean", doc
    assert counts == {"backend": 1, "lock": 1, "audit": 1}, counts
    for pid in (mine["pid"], *mine["workers"]):
        assert is_gone(pid)
    entries = AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()
    assert entries and all(e["context"]["slurm_job"] == 42 for e in entries)


def test_epilog_refuses_a_plan_that_reaches_outside_the_job(sim_host, slurm_env, job_hold, tmp_path):
    """The job's holder was started by a launcher that is not in the job (no SLURM_JOB_ID), in
    its process group: clear would end the whole group, so nothing is signaled; the node drains."""
    held = job_hold(None, shell="env SLURM_JOB_ID=42 {hold} --gpus 1 --memory 2GiB & wait")
    launcher = held["popen"].pid
    p = _hook("epilog", slurm_env)
    assert p.returncode == 4, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "drained" and "beyond the job" in doc["refused"]
    assert not is_gone(held["pid"]) and not is_gone(launcher)
    assert not AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()
    args = (tmp_path / "scontrol.args").read_text().splitlines()
    assert args[:3] == ["update", "nodename=node07", "state=drain"]
    assert args[3] == f"reason=gpuslate: GPU 1 holds 2.0 GiB after job 42 (pid {held['pid']} " \
        f"{os.path.basename(sys.executable)} of {doc['diagnosis'][0]['problems'][0]['user']})"


def test_prolog_drains_naming_the_holder_and_signals_nothing(sim_host, slurm_env, job_hold, tmp_path):
    squatter = job_hold("41", "--gpus", "1", "--memory", "3GiB")
    p = _hook("prolog", {**slurm_env, "SLURM_JOB_ID": "43"})
    assert p.returncode == 4
    doc = json.loads(p.stdout)
    assert doc["hook"] == "prolog" and doc["status"] == "drained" and doc["found"] == []
    assert not is_gone(squatter["pid"])
    reason = (tmp_path / "scontrol.args").read_text().splitlines()[3]
    assert reason.startswith("reason=gpuslate: GPU 1 holds 3.0 GiB before job 43 (pid ")
    assert p.stderr == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="a simulated MPS server is a GPU daemon when root's")
def test_an_mps_host_is_clean_after_the_jobs_client_ends_and_free_for_the_next(sim_host, slurm_env, job_hold, hold,
                                                                           tmp_path):
    """The job's MPS client is ended; the idle MPS server it leaves (a spared daemon's baseline) is no
    reason to drain, after the job or before the next."""
    server = hold("--gpus", "1", verb="mps")
    client = job_hold("42", "--gpus", "1", "--memory", "2GiB", "--mps")
    p = _hook("epilog", slurm_env)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "clean" and [t["pid"] for t in doc["clear"]["targets"]] == [client["pid"]]
    assert is_gone(client["pid"]) and not is_gone(server.pid)
    p = _hook("prolog", {**slurm_env, "SLURM_JOB_ID": "43"})
    assert p.returncode == 0 and json.loads(p.stdout)["status"] == "clean", p.stdout
    assert not (tmp_path / "scontrol.args").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a simulated MPS server is a GPU daemon when root's")
def test_an_mps_server_the_job_started_is_the_jobs_leftover(sim_host, slurm_env, job_hold, tmp_path):
    """A per-job MPS daemon (started inside the job, so with its SLURM_JOB_ID) is no host baseline:
    the epilog ends it with its control daemon, and the GPU is verified free without it."""
    server = job_hold("42", "--gpus", "1", verb="mps")
    p = _hook("epilog", slurm_env)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "clean" and server["pid"] in {f["pid"] for f in doc["found"]}
    assert {t["pid"] for t in doc["clear"]["targets"]} == {server["pid"], server["control"]}
    assert is_gone(server["pid"]) and doc["clear"]["baseline"] == []


def test_a_drained_node_keeps_its_reason(sim_host, slurm_env, tmp_path):
    """An administrator's (or a prolog's) drain reason is not overwritten."""
    sim_host.leak(1, 3 * GiB)
    env = {**slurm_env, "FAKE_STATE": "IDLE+DRAIN", "FAKE_REASON": "disk swap [admin@2026-12-01T10:00:00]"}
    p = _hook("prolog", env)
    assert p.returncode == 4
    drain = json.loads(p.stdout)["drain"]
    assert drain["ok"] and drain["already"] and drain["reason"] == "disk swap [admin@2026-12-01T10:00:00]"
    assert not (tmp_path / "scontrol.args").exists()


def test_no_drain_reports_without_draining(sim_host, slurm_env, tmp_path):
    sim_host.leak(1, 3 * GiB)
    p = _hook("epilog", slurm_env, "--no-drain")
    assert p.returncode == 4 and json.loads(p.stdout)["status"] == "not_free"
    assert not (tmp_path / "scontrol.args").exists()


@pytest.mark.parametrize("change,code,message", [
    ({"SLURM_JOB_ID": None}, 2, "SLURM_JOB_ID is not set"),
    ({"SLURM_JOB_ID": "4x2"}, 2, "invalid SLURM_JOB_ID"),
    ({"SLURM_JOB_UID": None}, 2, "SLURM_JOB_UID is not set"),
    ({"SLURM_JOB_GPUS": "1,99"}, 2, "GPU 99 does not exist"),
    ({"SLURM_JOB_GPUS": "GPU-4f2a"}, 2, "cannot read the job's GPUs from SLURM_JOB_GPUS"),
    ({"SLURM_JOB_UID": "12345"}, 5, "must run as root"),
])
def test_bad_environments(sim_host, slurm_env, job_hold, tmp_path, change, code, message):
    """One line, a documented exit, never a traceback, nothing signaled."""
    if code == 5 and os.geteuid() == 0:
        pytest.skip("root may end any user's job: the refusal is for a non-root epilog")
    mine = job_hold("42", "--gpus", "1", "--memory", "2GiB")
    env = {k: v for k, v in {**slurm_env, **change}.items() if v is not None}
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for hook in ("epilog", "prolog"):
        p = subprocess.run([sys.executable, "-m", "gpuslate", "slurm", hook], capture_output=True, text=True,
                           env={**full, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), **env},
                           timeout=60)
        if hook == "prolog" and code == 5:
            continue  # the prolog signals nothing: it needs no root
        assert p.returncode == code, (hook, p.stderr)
        assert p.stderr.count("\n") == 1 and message in p.stderr and "Traceback" not in p.stderr
        assert p.stdout == ""
    assert not is_gone(mine["pid"])
    assert not AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()


def test_scontrol_missing(sim_host, slurm_env, job_hold, tmp_path):
    """Clean: scontrol is not needed (exit 0). Not clean: one line, exit 8 (Slurm then drains
    with its own reason); nothing outside the job is signaled."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**slurm_env, "PATH": str(empty)}
    assert _hook("epilog", env).returncode == 0
    bystander = job_hold(None, "--gpus", "2", "--memory", "1GiB")
    sim_host.leak(1, 3 * GiB)
    p = run_cli("slurm", "epilog", "--timeout", "1", env=env)
    assert p.returncode == 8
    assert p.stderr.strip().splitlines() == [
        f"gpuslate: error: node node07 not drained: scontrol not found on PATH ({empty}): install slurm-client "
        "or set PATH"]
    assert "GPU 1" in p.stdout and not is_gone(bystander["pid"])


def test_a_held_host_lock_ends_in_a_drain_not_a_wait_past_the_timeout(sim_host, slurm_env, job_hold, tmp_path):
    """Another gpuslate holds the host lock for longer than the epilog may take: nothing is
    signaled, and the node drains naming the job's holder."""
    from gpuslate.host.lock import HostLock, default_lock_dir

    mine = job_hold("42", "--gpus", "1", "--memory", "2GiB")
    lock = HostLock(default_lock_dir(str(sim_host.root)) / "host.lock", purpose="swap")
    lock.acquire(timeout=0)
    try:
        p = _hook("epilog", slurm_env)
    finally:
        lock.release()
    assert p.returncode == 4, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "drained" and "host lock" in doc["refused"]
    assert not is_gone(mine["pid"])
    assert not AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()


@pytest.fixture
def job_cgroups() -> Iterator[Callable[[int], Path]]:
    """Slurm-like job cgroups (``.../job_N``) in the cgroup v1 pids hierarchy, removed afterwards."""
    base = Path("/sys/fs/cgroup/pids") / f"gpuslate-test-{os.getpid()}-{os.urandom(3).hex()}"
    try:
        base.mkdir()
    except OSError as exc:
        pytest.skip(f"no writable cgroup v1 pids hierarchy here ({exc.strerror})")
    made: list[Path] = []

    def make(job_id: int) -> Path:
        d = base / f"uid_{os.getuid()}" / f"job_{job_id}"
        d.mkdir(parents=True)
        made.append(d)
        return d

    yield make
    root_procs = Path("/sys/fs/cgroup/pids/cgroup.procs")
    for d in made:
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                root_procs.write_text(pid)
            except OSError:
                pass
        wait_for(lambda d=d: not (d / "cgroup.procs").read_text().split(), timeout=5)  # exiting processes
        d.rmdir()
    for parent in dict.fromkeys(d.parent for d in made):
        parent.rmdir()
    base.rmdir()


def test_epilog_finds_the_job_by_its_cgroup(job_cgroups, sim_host, slurm_env, job_hold):
    """A job process without SLURM_JOB_ID (it cleared its environment) in the job's cgroup is
    found by the cgroup; one in another job's cgroup is not."""
    mine, theirs = job_cgroups(42), job_cgroups(43)
    cleared_env = job_hold(None, "--gpus", "1", "--memory", "2GiB")
    other = job_hold(None, "--gpus", "2", "--memory", "1GiB")
    (mine / "cgroup.procs").write_text(str(cleared_env["pid"]))
    (theirs / "cgroup.procs").write_text(str(other["pid"]))
    p = _hook("epilog", slurm_env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["found"] == [{"pid": cleared_env["pid"], "found_by": "cgroup"}]
    assert is_gone(cleared_env["pid"]) and not is_gone(other["pid"])


def _jobs_file(tmp_path: Path, *jobs: tuple[int, float, float | None]) -> str:
    """``scontrol -o -d show job`` lines for jobs (id, start, end) of this user on node07, each
    on GPU 0 of it but job 42 (the ended one, whose detail Slurm has cleared)."""
    lines = []
    for job_id, start, end in jobs:
        gres = "" if job_id == 42 else "gpu:1(IDX:0)"
        lines.append(f"JobId={job_id} UserId=me({os.getuid()}) JobState={'COMPLETING' if job_id == 42 else 'RUNNING'} "
                     f"StartTime={int(start)} EndTime={'Unknown' if end is None else int(end)} NodeList=node07 "
                     f"Nodes=node07 CPU_IDs=0 Mem=0 GRES={gres}")
    path = tmp_path / "jobs.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _renamed(job_hold) -> dict:
    """A holder of job 42 on GPU 1 titled with setproctitle, no SPT_NOENV: the title is written over
    its whole environment (GPUSLATE_SIM left out: the holder would set it again, and a variable set
    again ends the run setproctitle writes over, leaving the later ones readable)."""
    return job_hold("42", shell="env -u GPUSLATE_SIM {hold} --gpus 1 --memory 2GiB --title escaped")


def test_epilog_ends_a_renamed_holder_found_by_its_gpu(sim_host, slurm_env, job_hold, tmp_path):
    """A holder of the job whose title wrote over its environment (no SLURM_JOB_ID to read) on the
    job's GPU, started while the job ran, no other job of the user on the node: found by its GPU
    and ended. Slurm is asked only then."""
    now = time.time()
    left = _renamed(job_hold)
    assert b"SLURM_JOB_ID" not in open(f"/proc/{left['pid']}/environ", "rb").read()
    p = _hook("epilog", {**slurm_env, "FAKE_JOBS": _jobs_file(tmp_path, (42, now - 60, now + 60))})
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["found"] == [{"pid": left["pid"], "found_by": "gpu"}] and doc["unproven"] == []
    assert is_gone(left["pid"])


@pytest.mark.parametrize("why", ["same user", "shared", "window", "slurm"])
def test_epilog_leaves_a_renamed_holder_it_cannot_prove_and_names_it(sim_host, slurm_env, job_hold, tmp_path, why):
    now = time.time()
    left = _renamed(job_hold)
    jobs = {"same user": [(42, now - 60, now + 60), (43, now - 30, None)], "shared": [(42, now - 60, now + 60)],
            "window": [(42, now + 30, now + 60)], "slurm": []}[why]
    env = {**slurm_env, "FAKE_JOBS": _jobs_file(tmp_path, *jobs), **({"FAKE_GRES": "gpu:4,shard:16"}
                                                                      if why == "shared" else {})}
    p = run_cli("slurm", "epilog", "--timeout", "0.5", "--json", env=env)
    assert p.returncode == 4, p.stderr
    doc = json.loads(p.stdout)
    reason = {"same user": "job 43 of the same user was running when it started", "shared": "mps or shard",
              "window": "it started before job 42", "slurm": "job 42's start and end times are not shown"}[why]
    assert doc["status"] == "drained" and doc["found"] == [] and len(doc["unproven"]) == 1, doc
    assert doc["unproven"][0]["pid"] == left["pid"] and reason in doc["unproven"][0]["reason"]
    assert f"(pid {left['pid']} escaped of " in (tmp_path / "scontrol.args").read_text()
    assert not is_gone(left["pid"]) and not AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()


@pytest.mark.parametrize("node", ["NodeName=node07 State=IDLE\n", "NodeName=node07 Gres=gpu:4 State=IDLE\n", ""])
def test_epilog_never_proves_exclusive_gpus_from_what_slurm_did_not_state(sim_host, slurm_env, job_hold, tmp_path,
                                                                         node):
    """Issue 32: a node answer without Gres= and Partitions= (or none at all, exit 0) read as "not
    shared, no partitions", and the epilog ended a renamed holder it should only name. Unknown
    drains: the holder is named, left alone, and the node drained."""
    now = time.time()
    left = _renamed(job_hold)
    env = {**slurm_env, "FAKE_JOBS": _jobs_file(tmp_path, (42, now - 60, now + 60)), "FAKE_NODE": node}
    p = run_cli("slurm", "epilog", "--timeout", "0.5", "--json", env=env)
    assert p.returncode == 4, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "drained" and doc["found"] == [] and [u["pid"] for u in doc["unproven"]] == [left["pid"]]
    assert "Slurm's view of the node is unknown (scontrol show node node07 did " in doc["unproven"][0]["reason"]
    assert not is_gone(left["pid"]) and not AuditLog(tmp_path / "state" / "audit.jsonl", backend="sim").read()


def test_epilog_with_a_scontrol_that_answers_and_hangs_ends_within_its_timeout(sim_host, slurm_env, job_hold,
                                                                               tmp_path):
    """Issue 32: every call to scontrol is bounded from its start to its exit; one that prints,
    closes its pipes and hangs is ended, and the epilog (which then cannot drain) ends in time."""
    left = _renamed(job_hold)
    fake = Path(slurm_env["PATH"].split(":")[0]) / "scontrol"
    pids = tmp_path / "hung.pids"
    fake.write_text(f"#!/bin/sh\necho $$ >> {pids}\necho 'NodeName=node07 Gres=gpu:4 Partitions=test State=IDLE'\n"
                    "exec >&- 2>&-\nexec sleep 300\n")
    t0 = time.monotonic()
    p = run_cli("slurm", "epilog", "--timeout", "3", "--json", env=slurm_env)
    took = time.monotonic() - t0
    try:
        assert p.returncode in (4, 8), p.stdout + p.stderr
        assert took < 25, took  # scontrol: the hook's 3 s to ask, then at least 5 s to drain; never forever
        doc = json.loads(p.stdout)
        assert doc["found"] == [] and not is_gone(left["pid"])
    finally:  # the stand-ins still asleep, if any: each wrote its pid
        for pid in (int(x) for x in (pids.read_text().split() if pids.exists() else [])):
            if not is_gone(pid) and read_cmdline(pid)[:2] == ["sleep", "300"]:
                os.kill(pid, signal.SIGKILL)
