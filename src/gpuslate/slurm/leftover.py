"""The epilog's second rule: a GPU holder the environment says nothing about, found by its GPUs.

A process whose environment was written over (setproctitle's title without
``SPT_NOENV``, Perl's ``$0``) or reset (``env -i``) no longer shows
``SLURM_JOB_ID``, and without cgroups nothing else ties it to its job. It is
the ended job J's leftover (:attr:`~.find.FoundBy.GPU`) when every one of
these facts is shown:

* it runs as J's user, and holds memory on one of J's GPUs (``SLURM_JOB_GPUS``);
* it carries no other job's id (``SLURM_JOB_ID``) and no other job's cgroup;
* its session does not show it is someone else's: the session's leader, if
  it lives as J's user with an intact environment, carries J's id (a shell
  of an ``ssh`` into the node, or another job's step, does not: its
  processes are its own, however they renamed themselves);
* it started while J ran: at or after J's ``StartTime`` and before its
  ``EndTime`` (Slurm's, to the second; the process's start from
  ``/proc/PID/stat``, in the same clock);
* Slurm shows the node's GPUs as exclusive: no ``mps``/``shard`` GRES on the
  node, no partition of it with ``OverSubscribe`` YES or FORCE, and every
  other job present on the node with its GPUs read;
* no other job present on the node holds any GPU it holds memory on;
* no other job of J's user present on the node was running when it started:
  such a job could have started it, and devices are not always fenced (a job
  can use a GPU it was not given). A job that started after it cannot have:
  more than :data:`CLOCK_MARGIN_S` after it, to Slurm's second (Slurm's times
  are the controller's clock, the start time the node's: a second apart they
  cannot move another job's process into this one).

Anything unknown (Slurm unreadable, a job's GPUs not read, J's start not
shown) proves nothing: the holder is then named in ``unproven`` with the
first fact that failed, is not signaled, and the node drains as before. Never
another running job of the same user, renamed or not.

:func:`decide` is a pure function of gathered :class:`Holder` facts and
Slurm's :class:`~.scontrol.NodeJobs`, tested as a ``hypothesis`` model
(tests/slurm/test_slurm_leftover_model.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from .._document import Fields
from ..proc.procfs import epoch_to_ticks, read_stat
from .find import facts_of
from .scontrol import JobOnNode, NodeJobs, node_jobs

#: how far apart the controller's clock (Slurm's times) and the node's (process start times) may be
CLOCK_MARGIN_S = 1.0


class Holder(NamedTuple):
    """What is known of one process that holds GPU memory on this node."""

    pid: int
    uid: int | None  # None: unknown (gone)
    start_ticks: int  # clock ticks since boot
    env_job: int | None  # the SLURM_JOB_ID of its environment (None: none, unreadable)
    cgroup_jobs: frozenset[int]
    memory: frozenset[int]  # the GPUs it holds memory on
    leader: int | None = None  # its session leader, when another live process of the user's, intact
    leader_job: int | None = None  # that leader's SLURM_JOB_ID (None: none)


class Window(NamedTuple):
    """When the ended job ran, in the clock of process start times (ticks since boot)."""

    start: float  # its StartTime
    end: float  # the end of the second of its EndTime


class Unproven(NamedTuple):
    """A holder of the job's GPUs, of its user, not shown to be the job's: left alone, named."""

    pid: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> Unproven:
        f = Fields(d)
        return cls(f.pid("pid"), f.text("reason"))


class Slurm(NamedTuple):
    """Slurm's facts in the clock of process start times."""

    nodes: NodeJobs
    window: Window | None  # None: the job's start or end is not shown
    starts: dict[int, float]  # job id -> its StartTime in ticks, less CLOCK_MARGIN_S (the jobs whose start reads)


def candidates(holders: Iterable[Holder], job_id: int, uid: int, gpus: frozenset[int],
               exclude: frozenset[int] | set[int]) -> list[Holder]:
    """The holders the second rule is about: J's user's, on J's GPUs, not found by the first rule
    (its id or cgroup), not in ``exclude`` (gpuslate and its ancestors)."""
    return [h for h in holders if h.pid not in exclude and h.uid is not None and h.uid == uid
            and h.memory & gpus and h.env_job != job_id and job_id not in h.cgroup_jobs]


def why_not(h: Holder, job_id: int, uid: int, slurm: Slurm) -> str | None:
    """The first fact of the module doc that is not shown for candidate ``h`` of job ``job_id``
    (user ``uid``); None: all are, it is the job's."""
    if h.env_job is not None:
        return f"it carries SLURM_JOB_ID={h.env_job}"
    if h.cgroup_jobs:
        return f"it is in the cgroup of job {min(h.cgroup_jobs)}"
    if h.leader is not None and h.leader_job != job_id:
        whose = f"job {h.leader_job}" if h.leader_job is not None else "no job"
        return f"its session leader, pid {h.leader}, is in {whose}"
    nodes = slurm.nodes
    if nodes.error is not None:
        return f"Slurm's view of the node is unknown ({nodes.error})"
    if slurm.window is None:
        return f"job {job_id}'s start and end times are not shown"
    if h.start_ticks < slurm.window.start:
        return f"it started before job {job_id}"
    if h.start_ticks >= slurm.window.end:
        return f"it started after job {job_id} ended"
    if nodes.shared_gres:
        return "the node's GPUs may be shared between jobs (mps or shard GRES)"
    if nodes.oversubscribe:
        return f"partition {nodes.oversubscribe[0]} oversubscribes (OverSubscribe)"
    for j in _others(nodes.jobs, job_id):
        if j.gpus is None:
            return f"job {j.job_id}'s GPUs on this node are not shown"
        if j.shares:
            return f"job {j.job_id} shares GPUs (mps or shard GRES)"
        if j.gpus & h.memory:
            return f"GPU {min(j.gpus & h.memory)} is job {j.job_id}'s"
        if j.uid is None or j.uid == uid:
            start = slurm.starts.get(j.job_id)
            if start is None or h.start_ticks >= start:
                return f"job {j.job_id} of the same user was running when it started"
    return None


def _others(jobs: Iterable[JobOnNode], job_id: int) -> list[JobOnNode]:
    return [j for j in jobs if j.job_id != job_id and j.present]


def decide(holders: Iterable[Holder], job_id: int, uid: int, gpus: frozenset[int], slurm: Slurm,
           exclude: frozenset[int] | set[int]) -> tuple[list[int], list[Unproven]]:
    """(the pids found by their GPUs, the candidates left alone and why). Pure, total."""
    found: list[int] = []
    unproven: list[Unproven] = []
    for h in candidates(holders, job_id, uid, gpus, exclude):
        why = why_not(h, job_id, uid, slurm)
        if why is None:
            found.append(h.pid)
        else:
            unproven.append(Unproven(h.pid, why))
    return sorted(set(found)), sorted(set(unproven))


def gather_slurm(job_id: int, node: str, *, timeout: float) -> Slurm:
    """Ask Slurm about ``node`` and put its times in the clock of process start times."""
    nodes = node_jobs(node, timeout=timeout)
    me = nodes.job(job_id)
    window = (Window(epoch_to_ticks(me.start), epoch_to_ticks(me.end + 1))
              if me is not None and me.start is not None and me.end is not None else None)
    starts = {j.job_id: epoch_to_ticks(j.start - CLOCK_MARGIN_S) for j in nodes.jobs if j.start is not None}
    return Slurm(nodes, window, starts)


def gather_holders(memory: dict[int, frozenset[int]], uid: int) -> list[Holder]:
    """Facts on the processes of ``memory`` (pid -> the GPUs it holds memory on); the environment
    and cgroups only of ``uid``'s (another user's process is never a candidate)."""
    out: list[Holder] = []
    for pid, gpus in sorted(memory.items()):
        f = facts_of(pid, uid)
        st = read_stat(pid)
        if f is None or st is None or st.has_exited:
            continue
        leader, leader_job = None, None
        if st.sid > 0 and st.sid != pid and f.uid == uid:
            lead, lf = read_stat(st.sid), facts_of(st.sid, uid)
            if lead is not None and not lead.has_exited and lf is not None and lf.uid == uid and lf.env_intact:
                leader, leader_job = st.sid, lf.env_job
        out.append(Holder(pid, f.uid, st.start_ticks, f.env_job, f.cgroup_jobs, gpus, leader, leader_job))
    return out
