"""Planning a clear: which processes are targets, which are spared, and why.

A target is a whole job: the process holding a selected GPU; its ancestors
while they stay in its process group (short of a shell, multiplexer, sshd or
PID 1, so a Jupyter kernel is a target and the Jupyter server is not); the
group's leader (the launcher of workers that were reparented away); every
descendant; and every process of the job's groups that holds a selected GPU.

Never a target: gpuslate itself and its ancestors, PID 1, kernel threads,
and, unless asked, processes that only hold device handles (monitors, the
persistence daemon, DCGM, MPS control).
"""

from __future__ import annotations

import os
import pwd
import re
from typing import Any, NamedTuple, Sequence

from ..errors import UsageError
from ..gpu.types import GpuBackend
from ..proc.procfs import ProcessId, read_cgroup, read_info
from ..proc.tree import ProcTable, is_boundary
from ..host.snapshot import HolderProcess, Snapshot, resolve_gpus, take_snapshot

#: GPU daemons spared unless --include-handles, whatever they hold
GPU_DAEMONS = frozenset({
    "nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-smi", "nvidia-fabricmanager", "nvidia-dcgm",
})


class Target(NamedTuple):
    ident: ProcessId
    user: str | None
    uid: int | None
    command: str
    name: str
    gpus: list[int]
    used_memory: int | None
    role: str  # holder | launcher | ancestor | descendant | group member
    container: str | None
    cgroup: str | None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.ident.pid, "start_ticks": self.ident.start_ticks, "user": self.user,
                "uid": self.uid, "command": self.command, "name": self.name, "gpus": self.gpus,
                "used_memory": self.used_memory, "role": self.role, "container": self.container,
                "cgroup": self.cgroup}


class Spared(NamedTuple):
    pid: int
    user: str | None
    command: str | None
    gpus: list[int]
    kind: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


class Plan(NamedTuple):
    gpus: list[int]
    targets: list[Target]
    spared: list[Spared]
    before: Snapshot


class Selection(NamedTuple):
    """What the user asked for (validated)."""

    pids: tuple[int, ...] = ()
    user: str | None = None
    match: str | None = None
    all_users: bool = False
    include_handles: bool = False


def validate(sel: Selection) -> tuple[int | None, re.Pattern[str] | None]:
    """Check the selection before anything is looked at or signaled."""
    uid = None
    if sel.user is not None:
        try:
            uid = pwd.getpwnam(sel.user).pw_uid
        except KeyError:
            try:
                uid = pwd.getpwuid(int(sel.user)).pw_uid
            except (KeyError, ValueError):
                raise UsageError(f"no such user: {sel.user!r}") from None
        if uid != os.getuid() and not sel.all_users:
            raise UsageError(f"--user {sel.user} selects another user's processes: add --all-users to say so")
    rx = None
    if sel.match is not None:
        try:
            rx = re.compile(sel.match)
        except re.error as exc:
            raise UsageError(f"invalid --match regular expression {sel.match!r}: {exc}") from None
    for pid in sel.pids:
        if pid <= 0:
            raise UsageError(f"invalid --pid {pid}")
    return uid, rx


def make_plan(backend: GpuBackend, gpus: Sequence[int] | None, sel: Selection) -> Plan:
    uid_filter, rx = validate(sel)
    chosen = resolve_gpus(backend, gpus)
    snap = take_snapshot(backend, chosen)
    table = ProcTable()
    me = os.getpid()
    protected = {me, *table.ancestors(me), 1}
    my_uid = os.getuid()

    for pid in sel.pids:
        if table.get(pid) is None:
            raise UsageError(f"process {pid} does not exist")

    # every visible holder of a selected GPU, with all its selected GPUs
    holders: dict[int, tuple[HolderProcess, list[int], int | None]] = {}
    for g in snap.gpus:
        for p in g.processes:
            if not p.visible:
                continue
            if p.pid in holders:
                h, gl, used = holders[p.pid]
                strongest = p if h.kind == "handle" else h
                total = None if used is None and p.used_memory is None else (used or 0) + (p.used_memory or 0)
                holders[p.pid] = (strongest, gl + [g.index], total)
            else:
                holders[p.pid] = (p, [g.index], p.used_memory)

    spared: dict[int, Spared] = {}

    def spare(p: HolderProcess, gl: list[int], reason: str) -> None:
        spared.setdefault(p.pid, Spared(p.pid, p.user, p.command, gl, p.kind, reason))

    def never_reason(pid: int, name: str | None, kind: str) -> str | None:
        st = table.get(pid)
        if pid in protected:
            return "gpuslate itself or one of its ancestors (the shell, the SSH session)"
        if st is not None and st.is_kernel_thread:
            return "a kernel thread"
        if name in GPU_DAEMONS and not sel.include_handles:
            return f"a GPU daemon ({name}); add --include-handles to include it"
        if kind == "handle" and not sel.include_handles:
            return ("holds only a device handle, no GPU memory (a monitor such as nvidia-persistenced, "
                    "nv-hostengine or dcgm-exporter); add --include-handles to include it")
        return None

    explicit = set(sel.pids)
    matched_pids: set[int] = set()
    selected: list[int] = []
    for pid, (p, gl, _used) in sorted(holders.items()):
        if explicit:
            family = {pid, p.root_pid, *table.ancestors(pid)}
            hit = explicit & family
            if not hit:
                spare(p, gl, "not selected by --pid")
                continue
            matched_pids |= hit
        why = never_reason(pid, p.name, p.kind)
        if why:
            spare(p, gl, why)
            continue
        if uid_filter is not None and p.uid != uid_filter:
            spare(p, gl, f"not selected by --user {sel.user}")
            continue
        if rx is not None and not (rx.search(p.command or "") or rx.search(p.name or "")):
            spare(p, gl, f"not selected by --match {sel.match}")
            continue
        if p.uid != my_uid and not sel.all_users:
            spare(p, gl, f"another user's process ({p.user}); add --all-users to include other users' jobs")
            continue
        selected.append(pid)
    missing = explicit - matched_pids
    if missing:
        pid = min(missing)
        raise UsageError(f"process {pid} holds none of the selected GPUs and launched none of their holders")

    roles = _expand_jobs(table, selected, holders, protected)
    targets: list[Target] = []
    for pid, role in sorted(roles.items()):
        info = read_info(pid)
        if info is None:
            continue  # exited while we planned: nothing to do
        held = holders.get(pid)
        gl = held[1] if held else []
        used = held[2] if held else None
        hp = held[0] if held else None
        if role != "holder":
            why = never_reason(pid, info.name, "job")
            if why or info.uid != my_uid and not sel.all_users:
                if hp is not None:
                    spare(hp, gl, why or f"another user's process ({info.user}) in the job; add --all-users")
                continue
        targets.append(Target(info.ident, info.user, info.uid, info.command, info.name, gl, used, role,
                              info.container, read_cgroup(pid)))
    return Plan(chosen, targets, sorted(spared.values()), snap)


def _expand_jobs(table: ProcTable, selected: list[int], holders: dict[int, Any],
                 protected: set[int]) -> dict[int, str]:
    roles: dict[int, str] = {}
    groups: set[int] = set()
    for pid in selected:
        roles[pid] = "holder"
        st = table.get(pid)
        if st is None:
            continue
        groups.add(st.pgid)
        leader = table.get(st.pgid)
        if leader is not None and leader.state not in ("Z", "X") and not is_boundary(leader):
            roles.setdefault(leader.pid, "launcher")
        for a in table.climb_in_group(pid)[1:]:
            roles.setdefault(a, "ancestor")
    # holders of the selected GPUs in the job's groups: workers reparented away
    for pid, (p, _gl, _u) in holders.items():
        if p.pgid in groups and pid not in roles:
            roles[pid] = "group member"
    for pid in list(roles):
        for d in table.descendants(pid):
            roles.setdefault(d, "descendant")
    for pid in protected:
        roles.pop(pid, None)
    return roles
