"""Reading ``scontrol``: the lines Slurm 22.05 prints (captured from tests/slurm/cluster.py's
cluster), the GRES forms of the documentation, and what does not read (unknown, never guessed);
running it bounded in time and output, with a stand-in on PATH."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuslate.slurm import scontrol
from gpuslate.slurm.scontrol import oversubscribing, parse_gres, parse_job, parse_node

#: `SLURM_TIME_FORMAT=%s scontrol -o -d show job` on the test cluster: a running job holding GRES 1-2 of n1
RUNNING = ("JobId=715358 JobName=wrap UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=4294901758 "
           "Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
           "BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED "
           "TimeMin=N/A SubmitTime=1796166960 EligibleTime=1796166960 AccrueTime=1796166960 StartTime=1796166962 "
           "EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=1796166962 "
           "Scheduler=Main Partition=test AllocNode:Sid=localhost:3979 ReqNodeList=n1 ExcNodeList=(null) "
           "NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
           "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:2   "
           "Nodes=n1 CPU_IDs=1 Mem=0 GRES=gpu:2(IDX:1-2) MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
           "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
           "Command=(null) WorkDir=/tmp/x StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= "
           "TresPerNode=gres:gpu:2 ")
#: the same job once cancelled (completing): its GRES detail is gone, its end time shown
ENDED = RUNNING.replace("JobState=RUNNING", "JobState=CANCELLED+COMPLETING").replace(
    "EndTime=Unknown", "EndTime=1796166963").replace("GRES=gpu:2(IDX:1-2)", "GRES=")
NODE = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 Gres=gpu:4 NodeAddr=127.0.0.1 State=ALLOCATED "
        "Partitions=test,big BootTime=1796166534")


def test_a_running_job_and_an_ended_one_as_slurm_prints_them():
    j = parse_job(RUNNING, "n1")
    assert j is not None and (j.job_id, j.uid, j.state, j.start, j.end) == (715358, 1001, "RUNNING", 1796166962, None)
    assert j.gpus == frozenset({1, 2}) and not j.shares and j.present
    e = parse_job(ENDED, "n1")
    assert e is not None and e.present and e.end == 1796166963 and e.gpus == frozenset()
    assert parse_job(RUNNING, "n2") is None  # not on that node


def test_multi_node_detail_groups_and_hostlists():
    line = ("JobId=9 UserId=bob(7) JobState=RUNNING StartTime=10 EndTime=20 NodeList=gpu[01-04] "
            "Nodes=gpu[01-02] CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:0-1) "
            "Nodes=gpu[03-04] CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:3),shard:2(4/8)")
    assert parse_job(line, "gpu02").gpus == frozenset({0, 1}) and not parse_job(line, "gpu02").shares
    j = parse_job(line, "gpu04")
    assert j.gpus == frozenset({3}) and j.shares
    assert parse_job(line, "gpu05") is None


@pytest.mark.parametrize("text,gpus,shares", [
    ("gpu:1(IDX:0)", {0}, False), ("gpu:2(IDX:0,2)", {0, 2}, False), ("gpu:tesla:3(IDX:0-1,3)", {0, 1, 3}, False),
    ("", set(), False), ("(null)", set(), False), ("mps:50(0/100)", set(), True),
    ("gpu:1(IDX:0),mps:100(0/100)", {0}, True), ("nic:1(IDX:0)", set(), False),
])
def test_gres_forms(text, gpus, shares):
    assert parse_gres(text) == (frozenset(gpus), shares)


@pytest.mark.parametrize("text", ["gpu:1", "gpu:1(IDX:N/A)", "gpu:1(IDX:3-1)", "gpu:1(IDX:0)junk", "???"])
def test_what_does_not_read_is_unknown(text):
    assert parse_gres(text)[0] is None
    line = f"JobId=5 UserId=a(1) JobState=RUNNING StartTime=1 NodeList=n1 Nodes=n1 CPU_IDs=0 Mem=0 GRES={text}"
    assert parse_job(line, "n1").gpus is None


def test_a_job_on_the_node_without_its_detail_has_unknown_gpus():
    assert parse_job("JobId=5 UserId=a(1) JobState=RUNNING StartTime=1 NodeList=n[1-2]", "n1").gpus is None
    assert parse_job("JobId=5 UserId=a(1) JobState=RUNNING NodeList=n[1-", "n1").gpus is None  # a hostlist that fails


def test_node_gres_partitions_and_oversubscribe():
    assert parse_node(NODE, "n1") == (False, ("test", "big"))
    assert parse_node(NODE.replace("Gres=gpu:4", "Gres=gpu:4,shard:32"), "n1")[0] is True
    assert parse_node(NODE.replace("Gres=gpu:4", "Gres=gpu:h100:8(S:0-1),mps:800"), "n1")[0] is True
    assert parse_node(NODE.replace("Gres=gpu:4", "Gres=(null)"), "n1") == (False, ("test", "big"))
    parts = "PartitionName=test Nodes=n1 OverSubscribe=NO\nPartitionName=big Nodes=n1 OverSubscribe=FORCE:4\n"
    assert oversubscribing(parts, ("test", "big")) == ("big",)
    assert oversubscribing(parts, ("test",)) == ()
    assert oversubscribing(parts, ("gone",)) == ("gone",)  # not shown: unknown, counts as sharing
    assert oversubscribing(parts.replace("FORCE:4", "EXCLUSIVE"), ("test", "big")) == ()


@pytest.mark.parametrize("text,missing", [
    (NODE.replace("Gres=gpu:4 ", ""), "did not state Gres="),
    (NODE.replace("Partitions=test,big ", ""), "did not state Partitions="),
    ("NodeName=n1 Arch=x86_64 State=IDLE", "did not state Gres= or Partitions="),
    ("", "did not show that node"), ("\n", "did not show that node"),
    (NODE.replace("NodeName=n1", "NodeName=n2"), "did not show that node"),
    (NODE + "\n" + NODE, "showed that node 2 times"),
    (NODE.replace("Partitions=test,big", "Partitions=(null)"), "stated no partition"),
])
def test_what_the_node_answer_does_not_state_is_unknown(text, missing):
    """Issue 32: a node line without Gres= and Partitions=, or no line at all (exit 0), read as
    "not shared, no partitions" and proved the GPUs exclusive from nothing."""
    got = parse_node(text, "n1")
    assert isinstance(got, str) and missing in got


def test_a_job_line_that_does_not_state_its_state_or_nodes_may_be_present_here():
    j = parse_job("JobId=5 UserId=a(1) StartTime=1 NodeList=n1 Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)", "n1")
    assert j is not None and j.state == "?" and j.present
    j = parse_job("JobId=5 UserId=a(1) JobState=RUNNING StartTime=1", "n1")  # no NodeList: it may be here
    assert j is not None and j.gpus is None and j.present
    assert parse_job("JobId=5 UserId=a(1) JobState=PENDING NodeList=(null)", "n1") is None


def _stand_in(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "scontrol").write_text("#!/bin/sh\n" + body)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_run_asks_for_epoch_times_and_is_bounded(tmp_path, monkeypatch):
    _stand_in(tmp_path, 'echo "fmt=$SLURM_TIME_FORMAT args=$*"\n', monkeypatch)
    assert scontrol.run(["-o", "show", "job"]) == ("fmt=%s args=-o show job\n", None)
    _stand_in(tmp_path / "slow", "exec sleep 30\n", monkeypatch)
    out, error = scontrol.run(["x"], timeout=0.3)
    assert out == "" and error == "scontrol did not answer within 0.3 s"
    _stand_in(tmp_path / "big", "exec yes\n", monkeypatch)
    out, error = scontrol.run(["x"], limit=1 << 16)
    assert out == "" and error == f"scontrol wrote more than {1 << 16} bytes"
    _stand_in(tmp_path / "fail", "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1\n",
              monkeypatch)
    assert scontrol.run(["x"]) == ("", "scontrol failed: slurm_load_jobs error: Unable to contact slurm controller")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert scontrol.run(["x"])[1].startswith("scontrol not found on PATH")


def test_a_scontrol_that_answers_closes_its_pipes_and_hangs_is_ended_at_the_limit(tmp_path, monkeypatch):
    """Issue 32: the wait after its answer had no limit, so `slurm epilog --timeout 10` hung past
    70 s. The limit counts from the start to the exit, the answer's end of file included."""
    _stand_in(tmp_path, "echo 'NodeName=n1 Gres=gpu:4 Partitions=test'\nexec >&- 2>&-\nexec sleep 60\n", monkeypatch)
    t0 = time.monotonic()
    out, error = scontrol.run(["-o", "show", "node", "n1"], timeout=0.5)
    took = time.monotonic() - t0
    assert out == "" and error == "scontrol did not exit within 0.5 s (its answer was in)", error
    assert took < 5, took
    nodes = scontrol.node_jobs("n1", timeout=0.5)
    assert nodes.error is not None and "within 0.5 s" in nodes.error


def test_node_jobs_from_the_three_answers(tmp_path, monkeypatch):
    _stand_in(tmp_path, f"""case "$*" in
"-o -d show job") printf '%s\\n%s\\n' '{RUNNING}' '{ENDED.replace("715358", "715359")}';;
"-o show node n1") echo '{NODE}';;
"-o show partition") printf 'PartitionName=test OverSubscribe=NO\\nPartitionName=big OverSubscribe=NO\\n';;
esac
""", monkeypatch)
    nodes = scontrol.node_jobs("n1")
    assert nodes.error is None and not nodes.shared_gres and nodes.oversubscribe == ()
    assert [j.job_id for j in nodes.jobs] == [715358, 715359] and nodes.job(715359).end == 1796166963
    assert os.environ["PATH"].startswith(str(tmp_path))
    _stand_in(tmp_path / "terse", """case "$*" in
"-o show node n1") echo 'NodeName=n1 State=IDLE';;
esac
""", monkeypatch)  # an answer, exit 0, that states neither Gres= nor Partitions= (nor any job)
    nodes = scontrol.node_jobs("n1")
    assert nodes.error == "scontrol show node n1 did not state Gres= or Partitions="
