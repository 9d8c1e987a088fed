"""Planning a clear: exactly which processes are targets, which are spared, and why.

The plan is the contract: ``--dry-run`` shows it, the act signals exactly its
targets (plus what their jobs fork while being stopped, reported with their
own role), and nothing spared is ever signaled.

Two halves:

* :func:`decide` is a pure function of the facts (a consistent process view,
  the GPU holds that NVML and the fd scan report, the caller's identity) and
  the selection. Every invariant of the safety model is tested on it with
  generated process forests (tests/clearing/test_plan_model.py).
* :func:`make_plan` gathers those facts from /proc and the backend, calls
  :func:`decide`, and annotates each target with what the act needs (identity,
  whether SIGTERM can work).

Which processes form a job, and which are protected, is the job rule of
:mod:`gpuslate.proc.jobs`.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, NamedTuple

from .._document import MAX_ID, Fields, Malformed
from .._parse import format_size, gpus_phrase
from ..errors import UsageError
from ..gpu.types import GpuBackend, ProcessKind
from ..host.daemons import sharing
from ..host.snapshot import Snapshot, holdings, mps_links, resolve_gpus, take_snapshot
from ..options import Selection
from ..proc.daemons import GPU_DAEMONS
from ..proc.jobs import UNKNOWN_PROGRAM, ProcessView, Protection, descendants, job_members, job_root, program
from ..proc.procfs import ProcessId, read_cgroups, read_signal_facts, user_name, zombie_reason, zombie_remedy
from ..proc.tree import ProcTable


class Role(str, Enum):
    """Why a process is a target."""

    HOLDER = "holder"  # a selected process holding a selected GPU
    LAUNCHER = "launcher"  # the root of a selected holder's job
    JOB_MEMBER = "job member"  # another process of that job
    FORKED = "forked while stopping"  # started by the job after the plan was made


class VerifyMode(str, Enum):
    """What 'done' means for the verified GPUs."""

    FREE = "free"  # no process with a context, used memory at most --max-used: the whole GPU
    RELEASED = "released"  # the selected jobs hold nothing on them any more; other jobs may


class Hold(NamedTuple):
    """One process's hold on one GPU, as the driver (or the fd scan, for handles) reports it."""

    pid: int
    gpu: int
    kind: str  # compute | graphics | mps | handle
    used_memory: int | None


class Resolved(NamedTuple):
    """A validated selection: the user as a uid, the pattern compiled."""

    sel: Selection
    uid: int | None
    rx: re.Pattern[str] | None


def resolve(sel: Selection) -> Resolved:
    """Check the selection before anything is looked at or signaled."""
    uid = None
    if sel.user is not None:
        try:
            uid = pwd.getpwnam(sel.user).pw_uid
        except KeyError:
            try:
                uid = pwd.getpwuid(int(sel.user)).pw_uid
            except (KeyError, ValueError, OverflowError):
                raise UsageError(f"no such user: {sel.user!r}") from None
        if uid != os.getuid() and not sel.all_users:
            raise UsageError(f"--user {sel.user} selects another user's processes: add --all-users to say so")
    rx = None
    if sel.match is not None:
        try:
            rx = re.compile(sel.match)
        except (re.error, RecursionError, OverflowError) as exc:
            raise UsageError(f"invalid --match regular expression {sel.match!r}: {exc}") from None
    for pid in sel.pids:
        if pid <= 0:
            raise UsageError(f"invalid --pid {pid}: a process id is a positive number")
    return Resolved(sel, uid, rx)


class Facts(NamedTuple):
    """Everything a decision depends on."""

    view: ProcessView
    holds: tuple[Hold, ...]  # visible processes only, thread ids already mapped to their process
    gpu_count: int
    caller_pid: int | None
    caller_uid: int
    #: MPS client pid -> every server it could be a client of (host.daemons.mps_possible; never written)
    mps: Mapping[int, tuple[int, ...]] = {}


class TargetDecision(NamedTuple):
    pid: int
    role: Role
    reason: str
    job: int  # root pid of the job it belongs to


class SpareDecision(NamedTuple):
    pid: int
    reason: str
    job: int | None  # the job it was found inside, if any


class Decision(NamedTuple):
    targets: tuple[TargetDecision, ...]
    spared: tuple[SpareDecision, ...]
    verify_gpus: tuple[int, ...]


def _protected_message(pid: int, why: str) -> str:
    if pid == 1:
        return "PID 1 is never a target"
    return f"{pid} is {why}: it is never a target"


#: why an MPS server is spared when a run would end it under clients that are not its targets
MPS_SHARED = "an MPS server whose other clients are not targets"


def decide(facts: Facts, res: Resolved) -> Decision:
    """The plan, as a pure function of the facts and the selection (see the module doc).

    An MPS server (a target only with ``--include-handles``) is spared while a live process that
    could be its client (``facts.mps``: its pipe folder read and the server's, or unknown) is not
    a target: ending the server ends its clients' GPU work, so the run would reach a job it did not
    select. Sparing a server can only take targets away, so the plan is made again until no
    targeted server has such a client (at most once per server)."""
    held: dict[int, str] = {}
    servers = {s for options in facts.mps.values() for s in options}
    while True:
        d = _decide(facts, res, held)
        targets = {t.pid for t in d.targets}
        more: dict[int, list[int]] = {}
        for client, options in sorted(facts.mps.items()):
            st = facts.view.get(client)  # None: the driver lists it, this /proc does not show it (a container's)
            if client in targets or (st is not None and st.has_exited):
                continue
            for server in options:
                if server in targets:
                    more.setdefault(server, []).append(client)
        if not more or len(held) >= len(servers):
            return d
        for server, clients in more.items():
            held[server] = (f"{MPS_SHARED} (PID{'s' if len(clients) > 1 else ''} {', '.join(map(str, clients))}): "
                            "ending it would end their GPU work; end them first, or select them too")


def _decide(facts: Facts, res: Resolved, held: Mapping[int, str]) -> Decision:
    sel = res.sel
    view = facts.view
    protect = Protection(view, facts.caller_pid, facts.caller_uid)
    chosen = set(sel.gpus) if sel.gpus is not None else set(range(facts.gpu_count))

    memory: dict[int, dict[int, int]] = {}  # pid -> gpu -> bytes, for processes with a GPU context
    handles: dict[int, set[int]] = {}
    for h in facts.holds:
        if h.kind == ProcessKind.HANDLE:
            handles.setdefault(h.pid, set()).add(h.gpu)
        else:
            per = memory.setdefault(h.pid, {})
            per[h.gpu] = per.get(h.gpu, 0) + (h.used_memory or 0)
    relevant = sorted(p for p in set(memory) | set(handles)
                      if (set(memory.get(p, ())) | handles.get(p, set())) & chosen)

    def alive(pid: int) -> bool:
        st = view.get(pid)
        return st is not None and not st.has_exited

    def foreign(pid: int) -> str | None:
        uid = view.uid(pid)
        if uid != facts.caller_uid and not sel.all_users:
            owner = user_name(uid) if uid is not None else "unknown"
            return f"another user's process ({owner}); add --all-users to include other users' jobs"
        return None

    def intrinsic(pid: int) -> str | None:
        """Why a process is never a target of this run, whatever the selection."""
        if pid in held:
            return held[pid]
        why = protect.reason(pid)
        if why and why != UNKNOWN_PROGRAM:
            return why
        why = foreign(pid) or why  # say whose, before saying that its program cannot be read
        if why:
            return why
        prog = (program(view.exe(pid)) or "") if view.exe_is_system(pid) else ""
        if prog in GPU_DAEMONS and not sel.include_handles:
            return f"a known GPU daemon ({prog}); add --include-handles to include it"
        if pid not in memory and pid in handles and not sel.include_handles:
            return ("device handle only, no GPU memory (a monitor, the persistence daemon, DCGM); "
                    "add --include-handles to include it")
        return None

    # --pid P: P itself, its descendants, and its group when it leads one; never its ancestors
    family: set[int] | None = None
    if sel.pids:
        family = set()
        for pid in sel.pids:
            if not alive(pid):
                gone = view.get(pid)
                if gone is not None:  # a true zombie: every thread has exited
                    raise UsageError(f"process {pid} has exited, nothing of it is left to end: "
                                     f"{zombie_reason(gone.ppid)}", hint=zombie_remedy(gone.ppid))
                raise UsageError(f"process {pid} does not exist")
            why = protect.reason(pid)
            if why and not (why == UNKNOWN_PROGRAM and foreign(pid)):  # another user's: spared below
                raise UsageError(_protected_message(pid, why))
            fam = {pid, *descendants(view, pid, protect)}
            st = view.get(pid)
            if st is not None and st.pgid == pid and st.pgid > 0:
                for m in view.group_members(pid):
                    if not protect(m):
                        fam |= {m, *descendants(view, m, protect)}
            if not fam & set(relevant):
                raise UsageError(f"process {pid} holds none of the selected GPUs, and none of its "
                                 "descendants does")
            family |= fam

    spared: dict[int, SpareDecision] = {}
    unselected: dict[int, str] = {}
    selected: list[int] = []
    for pid in relevant:
        if not alive(pid):
            continue  # exited while the driver tears its context down: nothing to signal
        why = intrinsic(pid)
        if why:
            spared[pid] = SpareDecision(pid, why, None)
            continue
        here = {g: b for g, b in memory.get(pid, {}).items() if g in chosen}
        if pid in memory and not here:
            unselected[pid] = f"holds {_where(memory[pid])} (not selected)"
        elif family is not None and pid not in family:
            unselected[pid] = "not selected by --pid: neither a selected process nor one of its descendants"
        elif res.uid is not None and view.uid(pid) != res.uid:
            unselected[pid] = f"not selected by --user {sel.user}"
        elif res.rx is not None and not _matches(res.rx, view, pid):
            unselected[pid] = f"does not match --match {sel.match}"
        else:
            selected.append(pid)

    targets: dict[int, TargetDecision] = {}
    memory_holders = set(memory)
    jobs: dict[int, tuple[int, list[int]]] = {}
    left: dict[int, int] = {}  # protected processes the job rule met and left -> the job's root
    for pid in selected:  # every selected holder is a holder first, whatever job it is also in
        met: list[int] = []
        if sel.holders_only:
            jobs[pid] = (pid, [pid, *descendants(view, pid, protect, met.append)])
        else:
            root = job_root(view, pid, protect, met.append)
            jobs[pid] = (root, job_members(view, root, memory_holders, protect, met.append))
        for p in met:
            left.setdefault(p, jobs[pid][0])
        mine = {g: b for g, b in memory.get(pid, {}).items() if g in chosen}
        reason = f"holds {_where(mine)}" if mine else \
            f"holds a device handle on {gpus_phrase(sorted(handles.get(pid, set()) & chosen))}"
        targets[pid] = TargetDecision(pid, Role.HOLDER, reason, jobs[pid][0])
    for pid in selected:
        root, members = jobs[pid]
        for m in members:
            if m in spared and spared[m].job is None:  # spared as a holder, and part of this job
                spared[m] = SpareDecision(m, f"{spared[m].reason} (found inside the job of {root})", root)
            if m in targets or m in spared or not alive(m):
                continue
            why = intrinsic(m)
            if why:
                spared[m] = SpareDecision(m, f"{why} (found inside the job of {root})", root)
                continue
            targets[m] = TargetDecision(m, *_member_role(view, m, root, memory.get(m)), root)
    for pid, why in unselected.items():
        if pid not in targets:
            spared[pid] = SpareDecision(pid, why, None)
    for pid in sel.pids:  # a --pid that is no target itself (a wrapper above its holders)
        if pid not in targets and pid not in spared and alive(pid):
            spared[pid] = SpareDecision(pid, "selected by --pid, but holds no selected GPU and is in none of "
                                             "its holders' jobs: only its holders' jobs are targets", None)
    for pid, root in left.items():  # considered and left: the caller's own ancestors too
        if pid not in targets and pid not in spared and alive(pid):
            spared[pid] = SpareDecision(pid, f"{protect.reason(pid)} (met by the job rule of {root})", root)

    if sel.gpus is not None:
        verify = tuple(sorted(chosen))
    elif sel.narrows:
        verify = tuple(sorted({g for t in targets for g in memory.get(t, {})}))
    else:
        verify = tuple(range(facts.gpu_count))
    return Decision(tuple(targets[p] for p in sorted(targets)), tuple(spared[p] for p in sorted(spared)), verify)


def _where(per_gpu: dict[int, int]) -> str:
    return ", ".join(f"{format_size(b)} on GPU {g}" for g, b in sorted(per_gpu.items()))


#: --match sees at most this much of a command line: matching is bounded whatever a process's argv
MATCH_MAX = 4096


def _matches(rx: re.Pattern[str], view: ProcessView, pid: int) -> bool:
    st = view.get(pid)
    name = st.name if st is not None else ""
    return bool(rx.search(" ".join(view.argv(pid))[:MATCH_MAX]) or rx.search(name))


def _member_role(view: ProcessView, pid: int, root: int, memory: dict[int, int] | None) -> tuple[Role, str]:
    st = view.get(pid)
    root_st = view.get(root)
    if pid == root:
        if root_st is not None and root_st.pgid == root:
            return Role.LAUNCHER, f"launcher of the job: leads process group {root}"
        return Role.LAUNCHER, "launcher of the job: its highest ancestor in the holder's process group"
    if memory:
        return Role.JOB_MEMBER, f"holds {_where(memory)}, in the job of {root}"
    if st is not None and root_st is not None and st.pgid == root_st.pgid and st.pgid > 0:
        return Role.JOB_MEMBER, f"in process group {st.pgid} of the job's launcher {root}"
    return Role.JOB_MEMBER, f"descendant of {st.ppid if st else '?'}, in the job of {root}"


# --- the records a plan reports, and the gathering of facts ------------------------------------


class Target(NamedTuple):
    ident: ProcessId
    user: str | None
    uid: int | None
    command: str
    name: str
    gpus: list[int]  # where it holds GPU memory
    used_memory: int | None
    role: Role
    reason: str
    job: int
    ignores_sigterm: str | None  # why SIGTERM will provably do nothing; it is then SIGKILLed early
    waits_for: tuple[int, ...]  # the targets it started: it is SIGKILLed early once they have exited
    container: str | None
    cgroup: str | None
    kind: str = "process"  # compute | graphics | mps | handle | process (holds no GPU itself)
    mps_server: int | None = None  # an MPS client's server, where it can be told

    def audit_info(self) -> dict[str, Any]:
        """What the audit log says of it with each signal (the victim's ``info``): built once per
        target, when ``clear`` acts, and carried by every phase's audit line (and, read back from a
        document, the target's result)."""
        return {"pid": self.ident.pid, "start_ticks": self.ident.start_ticks, "user": self.user,
                "command": self.command, "gpus": self.gpus, "used_memory": self.used_memory,
                "role": self.role.value, "job": self.job, "container": self.container}

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.ident.pid, "start_ticks": self.ident.start_ticks, "user": self.user,
                "uid": self.uid, "command": self.command, "name": self.name, "gpus": self.gpus,
                "used_memory": self.used_memory, "kind": self.kind, "mps_server": self.mps_server,
                "role": self.role.value, "reason": self.reason,
                "job": self.job, "ignores_sigterm": self.ignores_sigterm, "container": self.container,
                "cgroup": self.cgroup}

    @classmethod
    def from_json(cls, d: object) -> Target:
        """A target of a clear document (``waits_for`` is not in it: () ); every field checked."""
        f = Fields(d)
        return cls(ident=ProcessId(f.pid("pid"), f.integer("start_ticks", 0)), user=f.opt_text("user"),
                   uid=f.opt_integer("uid", 0, MAX_ID), command=f.text("command"), name=f.text("name"),
                   gpus=f.gpus("gpus"), used_memory=f.opt_size("used_memory"), role=f.choice("role", Role),
                   reason=f.text("reason"), job=f.pid("job"), ignores_sigterm=f.opt_text("ignores_sigterm"),
                   waits_for=(), container=f.opt_text("container"), cgroup=f.opt_text("cgroup"),
                   kind=_kind(f, "kind", default="process"), mps_server=f.opt_pid("mps_server", default=None))


#: how the reason of a process the selection did not choose begins (and only such a reason)
UNSELECTED = ("not selected", "does not match --match")


def not_chosen(reason: str) -> bool:
    """Whether a spared process's ``reason`` says the selection did not choose it (``--pid``,
    ``--user``, ``--match``, other GPUs), as opposed to chosen and then spared (another user's,
    a monitor, protected)."""
    return reason.startswith(UNSELECTED) or reason.endswith("(not selected)")


class Spared(NamedTuple):
    pid: int
    user: str | None
    command: str | None
    gpus: list[int]  # every GPU it holds memory or a handle on
    kind: str  # compute | graphics | mps | handle | process (no GPU hold)
    reason: str
    job: int | None
    mps_server: int | None = None  # an MPS client's server, where it can be told

    def to_json(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def from_json(cls, d: object) -> Spared:
        f = Fields(d)
        return cls(pid=f.pid("pid"), user=f.opt_text("user"), command=f.opt_text("command"), gpus=f.gpus("gpus"),
                   kind=_kind(f, "kind"), reason=f.text("reason"), job=f.opt_pid("job"),
                   mps_server=f.opt_pid("mps_server", default=None))


#: what a plan's process holds: its kind of GPU context, a handle only, or no GPU (a launcher)
TARGET_KINDS = frozenset({"compute", "graphics", "mps", "handle", "process"})


def _kind(f: Fields, key: str, default: Any = None) -> str:
    kind = f.text(key) if default is None else f.text(key, default=default)
    if kind not in TARGET_KINDS:
        raise Malformed(f"{key}: expected one of {', '.join(sorted(TARGET_KINDS))}, got {kind[:30]!r}")
    return kind


class Plan(NamedTuple):
    gpus: list[int]  # the GPUs the clear verifies
    targets: list[Target]
    spared: list[Spared]
    before: Snapshot  # every GPU of the host
    selection: Selection
    known: frozenset[int]  # every pid on the host when the plan was made: later ones are new

    #: how the GPUs are verified when the selection is not known (a plan read back from a document)
    verify: VerifyMode | None = None

    @property
    def verify_mode(self) -> VerifyMode:
        if self.verify is not None:
            return self.verify
        return VerifyMode.RELEASED if self.selection.narrows else VerifyMode.FREE

    @property
    def before_verified(self) -> list[Any]:
        return [g.reading for g in self.before.gpus if g.index in self.gpus]


def make_plan(backend: GpuBackend, res: Resolved) -> Plan:
    """Gather the facts and decide (see the module doc), for a selection :func:`resolve` checked
    (``clear`` resolves it once, before the host lock, and hands it here)."""
    sel = res.sel
    if sel.gpus is not None:
        resolve_gpus(backend, sel.gpus)
    snap = take_snapshot(backend, None, full=False)  # memory and processes: all a plan needs
    table = ProcTable()
    table.load_all()
    reported = [Hold(p.pid, g.index, p.kind, p.used_memory) for g in snap.gpus for p in g.processes if p.visible]
    holds = attribute(reported, lambda pid: table.get(pid) is not None, _tgid)
    servers = {p.pid: p.mps_server for g in snap.gpus for p in g.processes if p.mps_server is not None}
    facts = Facts(table, holds, len(snap.gpus), os.getpid(), os.getuid(), mps_links(snap.gpus)[1])
    decision = decide(facts, res)

    held = holdings(holds)
    mps = _mps_notes(servers)

    targets: list[Target] = []
    target_pids = {d.pid for d in decision.targets}
    protect = Protection(table, os.getpid(), os.getuid())
    for d in decision.targets:
        st = table.get(d.pid)
        if st is None:
            continue
        argv = table.argv(d.pid)
        uid = table.uid(d.pid)
        h = held.get(d.pid)
        used, mem_gpus = (h.used_memory, h.memory_gpus) if h else (None, [])
        container, cgroup = read_cgroups(d.pid)
        sig = read_signal_facts(d.pid)
        deaf = sig.ignores_sigterm if sig else None
        if deaf is None and st.state in ("T", "t"):
            deaf = "stopped (SIGTERM stays pending until it is continued)"
        waits = tuple(sorted(set(descendants(table, d.pid, protect)) & target_pids)) if deaf else ()
        targets.append(Target(ident=st.ident, user=user_name(uid) if uid is not None else None, uid=uid,
                              command=" ".join(argv) if argv else f"[{st.name}]", name=st.name, gpus=mem_gpus,
                              used_memory=used if mem_gpus else None, role=d.role,
                              reason=d.reason + mps.get(d.pid, ""), job=d.job, ignores_sigterm=deaf, waits_for=waits,
                              container=container, cgroup=cgroup, kind=h.kind if h else "process",
                              mps_server=servers.get(d.pid)))
    spared: list[Spared] = []
    for s in decision.spared:
        st = table.get(s.pid)
        argv = table.argv(s.pid)
        uid = table.uid(s.pid)
        h = held.get(s.pid)
        kind, all_gpus = (h.kind, h.gpus) if h else ("process", [])
        spared.append(Spared(pid=s.pid, user=user_name(uid) if uid is not None else None,
                             command=" ".join(argv) if argv else (f"[{st.name}]" if st else None), gpus=all_gpus,
                             kind=kind,
                             reason=s.reason + ("" if s.reason.startswith(MPS_SHARED) else mps.get(s.pid, "")),
                             job=s.job, mps_server=servers.get(s.pid)))
    return Plan(gpus=list(decision.verify_gpus), targets=targets, spared=spared, before=snap, selection=sel,
                known=frozenset(st.pid for st in table.all()))


def _mps_notes(servers: dict[int, int]) -> dict[int, str]:
    """What the plan says of each MPS client and server (client pid -> server pid given): the
    clients that share a server are named, so that ending one is seen to leave the others."""
    def pids(ps: list[int]) -> str:
        return ("PIDs " if len(ps) > 1 else "PID ") + ", ".join(map(str, ps))

    out: dict[int, str] = {}
    for server, clients in sharing(servers).items():
        for c in clients:
            others = [o for o in clients if o != c]
            out[c] = f"; shares MPS server PID {server}" + (f" with {pids(others)}" if others else "")
        out[server] = (f"; the MPS server of {pids(clients)} (ending it ends their GPU work; ending a client "
                       "leaves the others working)")
    return out


def attribute(holds: Sequence[Hold], is_process: Callable[[int], bool],
              tgid_of: Callable[[int], int | None]) -> tuple[Hold, ...]:
    """Holds by process: a driver may report a thread id, which /proc does not list
    among processes; its hold belongs to the process the thread is part of."""
    out: list[Hold] = []
    for h in holds:
        if not is_process(h.pid):
            tgid = tgid_of(h.pid)
            if tgid is not None and tgid != h.pid:
                h = h._replace(pid=tgid)
        out.append(h)
    return tuple(out)


def _tgid(pid: int) -> int | None:
    sig = read_signal_facts(pid)
    return sig.tgid if sig is not None else None
