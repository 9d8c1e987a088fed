"""The pure parts of the Slurm support: the hook environment, the job-finding rule,
the drain reason, srun's labeled output, and the --slurm option."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuslate.clearing.wait import GpuDiagnosis, Problem
from gpuslate.errors import UsageError
from gpuslate.remote.hosts import HostSpec
from gpuslate.remote.srun import EXIT_MARK, NODE_MARK, allocation_from_env, outcomes, split_output, srun_argv
from gpuslate.slurm.drain import MAX_REASON, drain_reason
from gpuslate.slurm.find import FoundBy, ProcessFacts, cgroup_job_ids, env_job_id, facts_of, job_processes
from gpuslate.slurm.job import job_from_env
from gpuslate.units.fence import read_environ
from helpers import leader_exits

GiB = 1024**3


# -- the environment ---------------------------------------------------------------------------

def test_job_from_env_reads_the_gpus_in_order_of_preference():
    base = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1000", "SLURMD_NODENAME": "n7"}
    assert job_from_env({**base, "SLURM_JOB_GPUS": "2,0", "CUDA_VISIBLE_DEVICES": "0,1"}).gpus == (0, 2)
    job = job_from_env({**base, "SLURM_STEP_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0"})
    assert job.gpus == (3,) and job.gpus_from == "SLURM_STEP_GPUS"
    assert job_from_env({**base, "CUDA_VISIBLE_DEVICES": "1"}).gpus_from == "CUDA_VISIBLE_DEVICES"
    job = job_from_env({**base, "CUDA_VISIBLE_DEVICES": "NoDevFiles"})
    assert job.gpus == () and job.gpus_from is None and job.node == "n7" and job.uid == 1000


@given(st.dictionaries(st.sampled_from(["SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"]),
                       st.text(max_size=12)))
def test_job_from_env_is_a_job_or_one_usage_error(env):
    try:
        job = job_from_env(env)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert str(job.job_id) == env["SLURM_JOB_ID"].lstrip("0") or job.job_id == 0


# -- the job-finding rule ----------------------------------------------------------------------

def test_env_and_cgroup_parsing():
    assert env_job_id(b"PATH=/bin\0SLURM_JOB_ID=42\0X=1\0") == 42
    assert env_job_id(b"SLURM_JOBID=7\0") == 7
    assert env_job_id(b"MY_SLURM_JOB_ID=42\0") is None
    assert env_job_id(b"SLURM_JOB_ID=4x\0") is None
    assert cgroup_job_ids("4:memory:/slurm/uid_1000/job_42/step_0\n0::/system.slice/slurmstepd.scope/job_7/"
                          "step_batch/user/task_0\n1:cpu:/job_420x/\n") == {42, 7}


facts = st.builds(ProcessFacts, st.integers(1, 60), st.none() | st.integers(0, 3), st.none() | st.integers(1, 4),
                  st.frozensets(st.integers(1, 4), max_size=2))


@given(st.lists(facts, max_size=30, unique_by=lambda f: f.pid), st.integers(1, 4), st.integers(0, 3),
       st.frozensets(st.integers(1, 60), max_size=5))
def test_the_rule_finds_exactly_the_jobs_processes(procs, job, uid, exclude):
    found = job_processes(procs, job, uid, exclude)
    by_pid = {f.pid: f for f in procs}
    for p in found:
        f = by_pid[p.pid]
        assert f.uid == uid and p.pid not in exclude  # never another user's, never gpuslate's own lineage
        assert (f.env_job == job) if p.found_by == FoundBy.ENVIRONMENT else (job in f.cgroup_jobs)
    # and every process that qualifies is found
    expected = {f.pid for f in procs if f.uid == uid and f.pid not in exclude
                and (f.env_job == job or job in f.cgroup_jobs)}
    assert {p.pid for p in found} == expected


# -- the drain reason --------------------------------------------------------------------------

def test_drain_reason_names_gpu_memory_job_and_holder():
    leak = GpuDiagnosis(1, 3 * GiB, 64 << 20, None, [Problem(None, None, None, 3 * GiB, "3.0 GiB held by no...", None)])
    assert drain_reason("after", 42, [leak]) == "gpuslate: GPU 1 holds 3.0 GiB after job 42 (no process holds it)"
    held = GpuDiagnosis(2, GiB, 0, None, [Problem(77, "bob", "/usr/bin/python3 serve.py", GiB, "holds", None)])
    assert drain_reason("before", 43, [held, leak]) == (
        "gpuslate: GPU 2 holds 1.0 GiB before job 43 (pid 77 python3 of bob); GPU 1 holds 3.0 GiB "
        "(no process holds it)")


@given(st.lists(st.builds(lambda g, cmd, user: GpuDiagnosis(g, GiB, 0, None, [Problem(5, user, cmd, GiB, "x", None)]),
                          st.integers(0, 7), st.text(), st.text()), max_size=10))
def test_drain_reason_is_one_bounded_printable_line(diags):
    text = drain_reason("after", 9, diags)
    assert text.startswith("gpuslate: ") and len(text) <= MAX_REASON and text.isprintable()


# -- srun --------------------------------------------------------------------------------------

def test_allocation_from_env():
    a = allocation_from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "gpu[01-03],login"})
    assert a.nodes == ["gpu01", "gpu02", "gpu03", "login"]
    with pytest.raises(UsageError, match="not set"):
        allocation_from_env({"SLURM_JOB_ID": "9"})
    with pytest.raises(UsageError, match="at most"):
        allocation_from_env({"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[0-999999]"})


def test_srun_argv_keeps_words_as_words():
    argv = srun_argv(["n1", "n2"], ["clear", "--match", "a b; rm -rf /"], ["gpuslate"])
    assert argv[:6] == ["srun", "--overlap", "-N2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--label"]
    assert argv[-3:] == ["clear", "--match", "a b; rm -rf /"]


def test_split_output_and_outcomes():
    doc = '{"schema": "gpuslate.status.v1", "gpus": []}'
    stdout = (f"1: {NODE_MARK}n2\n 0: {NODE_MARK}n1\n0: {doc}\n1: {{\"schema\": \"gpuslate.error.v1\", "
              f"\"error\": {{\"message\": \"GPU 3 does not exist\", \"exit_code\": 2}}}}\n0: {EXIT_MARK}0\n"
              f"1: {EXIT_MARK}2\n")
    stderr = "1: gpuslate: error: GPU 3 does not exist\n"
    tasks = split_output(stdout, stderr)
    assert tasks[0].node == "n1" and tasks[0].exit == 0 and tasks[1].exit == 2
    hosts = [HostSpec("n1"), HostSpec("n2"), HostSpec("n3")]
    out = outcomes(hosts, tasks, 2, stderr + "srun: error: n3: task 2: unable to start\n", 1.0)
    assert out[0].ok and out[0].result == {"schema": "gpuslate.status.v1", "gpus": []}
    assert not out[1].ok and out[1].error.exit_code == 2 and "GPU 3" in out[1].error.message
    assert not out[2].ok and out[2].error.code == "unreachable" and "unable to start" in out[2].error.message


def test_slurm_option_conflicts():
    from gpuslate.cli.fleet import split_fleet_options

    fleet, rest = split_fleet_options(["--slurm", "status", "--json"])
    assert fleet is not None and fleet.slurm and rest == ["status", "--json"]
    with pytest.raises(UsageError, match="without --host"):
        split_fleet_options(["--slurm", "-H", "h1", "status"])
    with pytest.raises(UsageError, match="--group"):
        split_fleet_options(["--slurm", "--group", "g", "status"])


def test_slurm_option_outside_an_allocation_is_one_line():
    import os

    from helpers import run_cli

    env = {k: "" for k in os.environ if k.startswith("SLURM_")}
    p = run_cli("--slurm", "status", env={**env, "SLURM_JOB_ID": "", "SLURM_JOB_NODELIST": ""})
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not set" in p.stderr
    # logs is a document like every command's (gpuslate.logs.v1): it goes through srun too (here to a node
    # that is not there)
    p = run_cli("--slurm", "logs", "x", env={"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1"})
    assert p.returncode != 0 and p.stdout.startswith("── n1 ──\n") and "Traceback" not in p.stderr


def test_drained_reason():
    from gpuslate.slurm.drain import drained_reason

    assert drained_reason("NodeName=n1 Arch=x86_64 State=IDLE Reason=") is None
    assert drained_reason("NodeName=n1 State=MIXED+DRAIN Reason=gpuslate: GPU 1 holds 3.0 GiB after job 4 "
                          "(no process holds it) [root@2026-12-01T12:20:38]").startswith("gpuslate: GPU 1")
    assert drained_reason("NodeName=n1 State=DOWN+DRAIN") == "(no reason)"
    assert drained_reason("NodeName=n1 State=IDLE+DRAIN Reason=a\x1bb") == "a?b"


def test_slurm_option_without_srun(tmp_path):
    from helpers import run_cli

    p = run_cli("--slurm", "status", env={"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2]",
                                          "PATH": str(tmp_path)})
    assert p.returncode == 3 and "no srun" in p.stderr.splitlines()[0] and "Traceback" not in p.stderr


FAKE_SRUN = """#!/bin/sh
# a stand-in for srun whose node {shape}
printf '0: @@gpuslate-node n1\\n'
case {shape} in
  endless) while :; do printf '0: {{"schema": "gpuslate.status.v1", "pad": "xxxxxxxxxxxxxxxxxxxxxxxx"}}\\n'; done ;;
  stalls) printf '0: {{"schema": "gpuslate.status.v1", '; exec sleep 60 ;;
  deep) python3 -c 'print("0: " + "[" * 100000 + "]" * 100000)'; printf '0: @@gpuslate-exit 0\\n' ;;
esac
"""


@pytest.mark.parametrize("shape,code", [("endless", "bad_document"), ("stalls", "stalled"), ("deep", "bad_document")])
def test_an_srun_past_a_bound_is_each_nodes_failure(tmp_path, monkeypatch, shape, code):
    """srun's output is bounded like ssh's (issue 25): bytes (1 MiB a node beyond one document), time,
    and each node's document by its parser; srun itself, the one process started, is ended."""
    from gpuslate.remote.srun import run_allocation

    (tmp_path / "srun").write_text(FAKE_SRUN.format(shape=shape))
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    t0 = time.monotonic()
    (out,) = run_allocation([HostSpec("n1")], ["status", "--json"], env={}, timeout=2).hosts
    assert time.monotonic() - t0 < 20
    assert not out.ok and out.error.code == code, out.error
    assert len(out.error.message) < 300


line_text = st.text(st.characters(blacklist_categories=("Cc", "Cs"),
                                  blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                    max_size=30)


@given(st.lists(st.tuples(st.lists(line_text, max_size=4), st.integers(0, 255)), min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_split_output_recovers_each_tasks_lines_whatever_the_interleaving(tasks, rnd):
    width = len(str(len(tasks) - 1))
    streams = [[f"{NODE_MARK}node{i}", *lines, f"{EXIT_MARK}{code}"] for i, (lines, code) in enumerate(tasks)]
    merged: list[str] = []
    cursors = [0] * len(streams)
    while any(c < len(s) for c, s in zip(cursors, streams)):  # srun interleaves tasks, keeps each in order
        i = rnd.choice([k for k, s in enumerate(streams) if cursors[k] < len(s)])
        merged.append(f"{str(i).rjust(width)}: {streams[i][cursors[i]]}")
        cursors[i] += 1
    got = split_output("\n".join(merged) + "\n", "")
    for i, (lines, code) in enumerate(tasks):
        assert got[i].node == f"node{i}" and got[i].exit == code
        assert got[i].stdout == "".join(f"{ln}\n" for ln in lines)


def test_the_environment_of_a_process_whose_main_thread_exited_is_read_from_a_thread():
    """/proc/PID/environ of an exited leader fails (ESRCH): the job's id is read from a live thread."""
    with leader_exits(env={"SLURM_JOB_ID": "77"}) as p:
        f = facts_of(p.pid, os.getuid())
        assert f is not None and f.env_job == 77
        assert b"\0SLURM_JOB_ID=77\0" in (read_environ(p.pid) or b"")
