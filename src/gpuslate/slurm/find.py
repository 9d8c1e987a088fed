"""The job-finding rule: which processes on this node belong to a Slurm job.

A process belongs to job J of user U when it runs as U (its ``/proc/PID``
owner) **and** either

* its environment (``/proc/PID/environ``, as it was when it started) carries
  ``SLURM_JOB_ID=J`` (Slurm sets it in every task and the batch script, and
  children inherit it: a ``setsid nohup`` daemon keeps it), or
* one of its cgroups has a ``job_J`` component (``/slurm/uid_U/job_J/...`` on
  cgroup v1, ``.../slurmstepd.scope/job_J/...`` on v2) where Slurm uses cgroups.

Only those: another job of the same user carries another id; another user's
process never qualifies. A GPU holder whose environment says nothing (written
over by a title, reset) is left to the second rule, :mod:`.leftover`.
Unknown never widens: an environment that cannot be read, or is larger
than :data:`MAX_ENVIRON` bytes, says nothing; gpuslate
itself and its ancestors are never members. The decision
(:func:`job_processes`) is a pure function of gathered :class:`ProcessFacts`.

The epilog applies the rule where it matters and nowhere else: to the
processes the GPUs list (to find what to end) and to every process a plan
would signal (the gate); on a clean node that is no process at all, so the
hook costs one GPU reading, not one read of every process's environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any, NamedTuple

from .._document import Fields
from ..proc.environ import intact
from ..proc.procfs import PROC, list_pids, open_image_file, read_stat

#: the most of one process's environment that is read (it is rarely above a few KiB)
MAX_ENVIRON = 1024 * 1024
_JOB_VARIABLES = (b"SLURM_JOB_ID=", b"SLURM_JOBID=")
_CGROUP_JOB = re.compile(r"/job_(\d{1,10})(?=/|$)")


class FoundBy(str, Enum):
    ENVIRONMENT = "environment"  # SLURM_JOB_ID in /proc/PID/environ
    CGROUP = "cgroup"  # a job_N component of /proc/PID/cgroup
    GPU = "gpu"  # the second rule (leftover.py): the job's GPUs, user and time, exclusively


class ProcessFacts(NamedTuple):
    pid: int
    uid: int | None  # None: unknown (the process vanished)
    env_job: int | None  # the SLURM_JOB_ID of its environment; None: none, unreadable or too large
    cgroup_jobs: frozenset[int]  # the job ids its cgroup paths name
    env_intact: bool = False  # its environment read, as execve left it (gpuslate.proc.environ.intact)


class JobProcess(NamedTuple):
    pid: int
    found_by: FoundBy

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "found_by": self.found_by.value}

    @classmethod
    def from_json(cls, d: object) -> JobProcess:
        f = Fields(d)
        return cls(f.pid("pid"), f.choice("found_by", FoundBy))


def env_job_id(raw: bytes) -> int | None:
    """``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``) of a NUL-separated environment."""
    for entry in raw.split(b"\0"):
        for name in _JOB_VARIABLES:
            if entry.startswith(name):
                value = entry[len(name):]
                return int(value) if value.isdigit() and len(value) <= 10 else None
    return None


def cgroup_job_ids(text: str) -> frozenset[int]:
    """The job ids named by ``job_N`` components of a ``/proc/PID/cgroup`` text."""
    return frozenset(int(m.group(1)) for line in text.splitlines() for m in _CGROUP_JOB.finditer(line))


def job_processes(facts: Iterable[ProcessFacts], job_id: int, uid: int, exclude: frozenset[int] | set[int],
                  ) -> list[JobProcess]:
    """The rule of the module doc, on facts: processes of ``uid`` carrying ``job_id``, not in ``exclude``."""
    out: list[JobProcess] = []
    for f in facts:
        if f.pid in exclude or f.uid is None or f.uid != uid:
            continue
        if f.env_job == job_id:
            out.append(JobProcess(f.pid, FoundBy.ENVIRONMENT))
        elif job_id in f.cgroup_jobs:
            out.append(JobProcess(f.pid, FoundBy.CGROUP))
    return sorted(out)


def _read_bounded(path: str | int, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a file (a path, or an open fd, closed here); None: unreadable, or longer."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def facts_of(pid: int, uid: int) -> ProcessFacts | None:
    """One process's facts; None when it is gone. The environment and cgroups of a
    process not owned by ``uid`` are not read (its uid alone excludes it)."""
    try:
        owner = os.stat(f"{PROC}/{pid}").st_uid
    except OSError:
        return None
    if owner != uid:
        return ProcessFacts(pid, owner, None, frozenset())
    try:  # a live thread's where the leader thread exited
        raw = _read_bounded(open_image_file(pid, "environ"), MAX_ENVIRON)
    except OSError:
        raw = None
    cg = _read_bounded(f"{PROC}/{pid}/cgroup", 64 * 1024)
    return ProcessFacts(pid, owner, env_job_id(raw) if raw is not None else None,
                        cgroup_job_ids(cg.decode("utf-8", "replace")) if cg else frozenset(),
                        raw is not None and intact(raw))


def gather(uid: int, pids: Iterable[int] | None = None) -> list[ProcessFacts]:
    """Facts for ``pids`` (default: every process on the host)."""
    out = [facts_of(pid, uid) for pid in (list_pids() if pids is None else pids)]
    return [f for f in out if f is not None]


def own_lineage() -> frozenset[int]:
    """This process and its ancestors: run by hand inside a job, they carry its id too."""
    pids: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        st = read_stat(pid)
        if st is None:
            break
        pid = st.ppid
    return frozenset(pids)


def find_job_processes(job_id: int, uid: int, among: Iterable[int] | None = None) -> list[JobProcess]:
    """The processes of job ``job_id`` (user ``uid``) on this host now, among ``among``
    (default: all; the epilog asks about the GPU holders and the plan's targets only)."""
    return job_processes(gather(uid, among), job_id, uid, own_lineage())
