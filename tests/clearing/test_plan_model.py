"""The planner as a model: generated process forests and selections, and the safety
invariants of ``clear`` checked on every example (issue 7).

The forests have what real hosts have: process groups and sessions, launchers that
exited (orphans reparented to PID 1 or to a subreaper), zombies, kernel threads,
handle-only monitors and GPU daemons, other users' processes, gpuslate's own
ancestors, shells (interactive and running scripts), threads of holders reported
by the driver instead of their process, and holders in other PID namespaces that
this host's /proc does not show; and, since issue 15, what a process says about
itself apart from what it is (a name drawn apart from its program, so that a
python process calls itself ``sshd`` and an sshd calls itself ``python``),
programs that cannot be read, process groups that mean nothing from here
(pgid 0), nested PID namespaces with their inits, signal forwarders (processes
that handle SIGTERM), and session leaders on terminals.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate.clearing.plan import GPU_DAEMONS, Facts, Hold, Resolved, Role, Selection, attribute, decide
from gpuslate.errors import UsageError
from gpuslate.proc.jobs import Protection, ancestors, descendants, program
from gpuslate.proc.procfs import ProcStat, SignalFacts

ME, OTHER = 1000, 1001
KTHREAD = 0x00200000
TERM = 1 << 14
NAMES = ["python", "python", "python", "bash", "sh", "sleep", "torchrun", "sglang::scheduler", "sshd",
         "tmux: server", "systemd", "nvidia-persistenced", "nv-hostengine", "containerd-shim", "unshare"]
#: what a process runs, drawn apart from what it calls itself (None: /proc/PID/exe unreadable)
EXES = ["/usr/bin/python3.11", "/usr/bin/python3.11", "/usr/bin/python3.11", "/usr/bin/bash", "/usr/bin/dash",
        "/usr/bin/sleep", "/usr/sbin/sshd", "/usr/bin/tmux", "/usr/lib/systemd/systemd", "/usr/bin/nvidia-smi",
        "/usr/bin/nv-hostengine", "/usr/bin/containerd-shim-runc-v2", "/usr/bin/unshare", "/usr/sbin/runuser",
        "/usr/bin/python3.11 (deleted)", None]
SHELL_ARGV = [("bash",), ("-bash",), ("bash", "run.sh"), ("bash", "-c", "python serve.py"), ("sh", "-l"),
              ("bash", "-o", "vi"), ("bash", "--rcfile", "x.sh"), ("bash", "-eo", "pipefail", "run.sh")]
SHELLS = {"bash", "dash", "sh"}
#: how each shell argv above reads: True for a script or command (not interactive)
RUNS_SCRIPT = {("bash", "run.sh"), ("bash", "-c", "python serve.py"), ("bash", "-eo", "pipefail", "run.sh")}
HOST_NS = 4026531836


class Forest:
    """A process table that ``decide`` sees exactly like the real ``ProcTable``."""

    def __init__(self, procs: dict[int, ProcStat], argvs: dict[int, tuple[str, ...]], uids: dict[int, int],
                 exes: dict[int, str | None] | None = None, sigs: dict[int, SignalFacts] | None = None,
                 ns: dict[int, tuple[int, ...]] | None = None):
        self.procs, self.argvs, self.uids = procs, argvs, uids
        self.exes = exes if exes is not None else {p: _default_exe(s) for p, s in procs.items()}
        self.sigs = sigs if sigs is not None else {}
        self.ns = ns if ns is not None else {}
        self.user_programs: set[int] = set()  # programs a user made (not root's): they protect nothing

    def get(self, pid: int) -> ProcStat | None:
        return self.procs.get(pid)

    def children(self, pid: int) -> list[int]:
        return [p.pid for p in self.procs.values() if p.ppid == pid]

    def group_members(self, pgid: int) -> list[int]:
        return [p.pid for p in self.procs.values() if p.pgid == pgid]

    def session_members(self, sid: int) -> list[int]:
        return [p.pid for p in self.procs.values() if p.sid == sid]

    def all_pids(self) -> list[int]:
        return sorted(self.procs)

    def argv(self, pid: int) -> tuple[str, ...]:
        return self.argvs.get(pid, ())

    def uid(self, pid: int) -> int | None:
        return self.uids.get(pid)

    def exe(self, pid: int) -> str | None:
        return self.exes.get(pid)

    def exe_is_system(self, pid: int) -> bool:
        return pid not in self.user_programs and self.exes.get(pid) is not None

    def signal_facts(self, pid: int) -> SignalFacts | None:
        return self.sigs.get(pid, SignalFacts(pid, (pid,), 0, 0)) if pid in self.procs else None

    def pid_ns(self, pid: int) -> tuple[int, ...] | None:
        return self.ns.get(pid, (HOST_NS,)) if pid in self.procs else None


def _default_exe(s: ProcStat) -> str | None:
    """For hand-built forests: the program a process of that name usually runs."""
    if s.is_kernel_thread:
        return None
    return {"python": "/usr/bin/python3.11", "gpuslate": "/usr/bin/python3.11"}.get(s.name, f"/usr/bin/{s.name}")


class World(NamedTuple):
    forest: Forest
    holds: tuple[Hold, ...]
    threads: dict[int, int]  # thread id -> its process
    caller: int
    gpus: int


@st.composite
def worlds(draw: st.DrawFn) -> World:
    n = draw(st.integers(3, 28))
    procs: dict[int, ProcStat] = {
        1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0),
        2: ProcStat(2, "kthreadd", "S", 0, 0, 0, 1, KTHREAD),
    }
    argvs: dict[int, tuple[str, ...]] = {1: ("/sbin/init",)}
    uids = {1: 0, 2: 0}
    exes: dict[int, str | None] = {1: "/usr/lib/systemd/systemd", 2: None}
    sigs: dict[int, SignalFacts] = {}
    ns: dict[int, tuple[int, ...]] = {}
    for pid in range(3, 3 + n):
        if draw(st.integers(0, 9)) == 0:  # a kernel thread
            procs[pid] = ProcStat(pid, f"kworker/{pid}", "I", 2, 0, 0, pid, KTHREAD)
            uids[pid] = 0
            exes[pid] = None
            continue
        users = [p for p in procs if p > 2 and not procs[p].is_kernel_thread]
        parent = draw(st.sampled_from([1, *users])) if users else 1
        pst = procs[parent]
        how = draw(st.sampled_from(["inherit", "inherit", "own group", "new session", "join group"]))
        if how == "own group":
            pgid, sid = pid, pst.sid
        elif how == "new session":
            pgid, sid = pid, pid
        elif how == "join group":
            same = [p.pgid for p in procs.values() if p.sid == pst.sid and p.pgid > 2]
            pgid, sid = (draw(st.sampled_from(same)) if same else pid), pst.sid
        else:
            pgid, sid = (pst.pgid, pst.sid) if parent != 1 else (pid, pid)
        name = draw(st.sampled_from(NAMES))
        state = draw(st.sampled_from(["S", "S", "S", "R", "Z"]))
        tty = draw(st.sampled_from([0, 0, 34816]))
        exe = draw(st.sampled_from(EXES))
        if draw(st.integers(0, 12)) == 0:  # seen from inside a namespace whose leaders live outside it
            pgid, sid = 0, 0
        # a live process whose main thread exited (pthread_exit): /proc reads its leader as Z, its state
        # and facts come from a live thread (issue 24)
        live = 1_000_000 + pid if state != "Z" and draw(st.integers(0, 7)) == 0 else None
        procs[pid] = ProcStat(pid, name, state, parent, pgid, sid, pid, 0, tty, live)
        argvs[pid] = draw(st.sampled_from(SHELL_ARGV)) if program(exe) in SHELLS else (name, "--serve")
        uids[pid] = draw(st.sampled_from([ME, ME, ME, OTHER]))
        exes[pid] = exe
        parent_ns = ns.get(parent, (HOST_NS,))
        parent_nspid = sigs[parent].nspid if parent in sigs else (parent,)
        if draw(st.integers(0, 8)) == 0:  # the init of a new PID namespace
            ns[pid] = (HOST_NS + pid, *parent_ns)
            nspid = (*parent_nspid[:-1], pid, 1) if len(parent_nspid) > 1 else (pid, 1)
        else:
            ns[pid] = parent_ns
            nspid = (pid, *[pid + 1000 * k for k in range(1, len(parent_ns))])
        handles_term = draw(st.integers(0, 3)) == 0
        ignores_term = not handles_term and draw(st.integers(0, 9)) == 0
        sigs[pid] = SignalFacts(pid, nspid, TERM if ignores_term else 0, TERM if handles_term else 0)
    # launchers that exited: their children were reparented to PID 1 or to a subreaper
    for pid in draw(st.lists(st.sampled_from(sorted(procs)), max_size=3)):
        if pid > 2 and pid in procs and not procs[pid].is_kernel_thread:
            heir = draw(st.sampled_from([1, *[p for p in procs if procs[p].name == "systemd" and p != pid]]))
            for c, cs in list(procs.items()):
                if cs.ppid == pid:
                    procs[c] = cs._replace(ppid=heir)
            del procs[pid]
    alive = sorted(p for p, s in procs.items() if p > 2 and not s.is_kernel_thread)
    caller = draw(st.sampled_from(alive)) if alive else 1
    gpus = draw(st.integers(1, 4))
    holds: list[Hold] = []
    for pid in draw(st.lists(st.sampled_from(alive), max_size=12)) if alive else []:
        for g in draw(st.sets(st.integers(0, gpus - 1), min_size=1, max_size=gpus)):
            kind = draw(st.sampled_from(["compute", "compute", "handle", "mps"]))
            holds.append(Hold(pid, g, kind, draw(st.integers(0, 80)) * 2**30 if kind != "handle" else None))
    threads: dict[int, int] = {}
    for i, h in enumerate(list(holds)):
        if draw(st.integers(0, 6)) == 0:  # the driver names a thread of the holder
            tid = 10_000 + i
            threads[tid] = h.pid
            holds[i] = h._replace(pid=tid)
    for g in draw(st.sets(st.integers(0, gpus - 1), max_size=2)):  # a holder in another PID namespace
        holds.append(Hold(99_999, g, "compute", 2**30))
    forest = Forest(procs, argvs, uids, exes, sigs, ns)
    forest.user_programs = set(draw(st.lists(st.sampled_from(sorted(procs)), max_size=3)))
    return World(forest, tuple(holds), threads, caller, gpus)


@st.composite
def selections(draw: st.DrawFn, w: World) -> Resolved:
    pids = tuple(draw(st.lists(st.sampled_from(sorted(w.forest.procs)), max_size=2)))
    match = draw(st.sampled_from([None, None, "python", "sglang", "serve$", "^bash"]))
    user_uid = draw(st.sampled_from([None, None, ME]))
    gpus = draw(st.one_of(st.none(), st.sets(st.integers(0, w.gpus - 1), min_size=1).map(tuple)))
    sel = Selection(gpus=gpus, pids=pids, user=str(user_uid) if user_uid is not None else None, match=match,
                    all_users=draw(st.booleans()), include_handles=draw(st.booleans()),
                    holders_only=draw(st.integers(0, 4)) == 0)
    return Resolved(sel, user_uid, re.compile(match) if match else None)


def independent_protection(w: World) -> set[int]:
    """What must never be a target, derived without the planner's help (the easy, sure part):
    by what a process runs, never by what it calls itself."""
    f = w.forest
    out = {1, w.caller, *ancestors(f, w.caller)}
    out |= {p for p, s in f.procs.items() if s.is_kernel_thread}
    for p, s in f.procs.items():
        exe = f.exes.get(p)
        if s.has_exited:
            continue
        prog = program(exe)
        if prog is not None and p in f.user_programs:
            continue  # a user's own program named sshd protects nothing
        if prog is None and f.uid(p) == ME:  # unknown (another user's: unreadable, and unsignalable, to ME)
            out.add(p)
        elif prog is None:
            continue
        elif prog in ("sshd", "tmux", "systemd") or prog.startswith("containerd-shim"):
            out.add(p)
        elif prog in SHELLS and (f.argv(p) not in RUNS_SCRIPT or (s.pid == s.sid and s.tty_nr)):
            out.add(p)
    return out


@pytest.mark.slow  # 400 examples
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_plan_invariants(data: st.DataObject) -> None:
    w = data.draw(worlds())
    res = data.draw(selections(w))
    sel = res.sel
    f = w.forest
    holds = attribute(w.holds, lambda pid: pid in f.procs, w.threads.get)
    facts = Facts(f, holds, w.gpus, w.caller, ME)
    protected = independent_protection(w)
    try:
        d = decide(facts, res)
    except UsageError as exc:
        # only a bad --pid is refused: one that is gone, protected, or holds nothing selected
        assert sel.pids, exc
        return
    # bad --pids are refused, never silently widened
    for pid in sel.pids:
        assert pid in f.procs and not f.procs[pid].has_exited and pid not in protected

    targets = {t.pid: t for t in d.targets}
    spared = {s.pid: s for s in d.spared}
    assert len(targets) == len(d.targets) and len(spared) == len(d.spared)
    # one verdict per process; nothing protected, spared, gone or another user's (without --all-users)
    assert not set(targets) & set(spared)
    assert not set(targets) & protected
    for pid in targets:
        assert pid in f.procs and not f.procs[pid].has_exited
        assert sel.all_users or f.uid(pid) == ME
        if not sel.include_handles and pid not in f.user_programs:
            assert program(f.exes.get(pid)) not in GPU_DAEMONS
    # threads never appear: holds are attributed to their process
    assert not set(targets) & set(w.threads) and not set(spared) & set(w.threads)

    # every selected holder (computed here independently) is a target
    chosen = set(sel.gpus) if sel.gpus is not None else set(range(w.gpus))
    mem: dict[int, set[int]] = {}
    handle: dict[int, set[int]] = {}
    for h in holds:
        (handle if h.kind == "handle" else mem).setdefault(h.pid, set()).add(h.gpu)
    family: set[int] | None = None
    if sel.pids:
        prot = Protection(f, w.caller)
        family = set()
        for p in sel.pids:
            family |= {p} | set(descendants(f, p, prot))
            if f.procs[p].pgid == p:
                for m in f.group_members(p):
                    if not prot(m):
                        family |= {m} | set(descendants(f, m, prot))
    selected = set()
    for pid in set(mem) | set(handle):
        s = f.procs.get(pid)
        if s is None or s.has_exited or pid in protected:
            continue
        if program(f.exes.get(pid)) in GPU_DAEMONS and not sel.include_handles and pid not in f.user_programs:
            continue
        if f.uid(pid) != ME and not sel.all_users:
            continue
        on_chosen = mem.get(pid, set()) & chosen
        handle_only = pid not in mem
        if not (on_chosen or (handle_only and sel.include_handles and handle.get(pid, set()) & chosen)):
            continue
        if family is not None and pid not in family:
            continue
        if res.uid is not None and f.uid(pid) != res.uid:
            continue
        if res.rx is not None and not (res.rx.search(" ".join(f.argv(pid))) or res.rx.search(s.name)):
            continue
        if pid in spared and "not selected" not in spared[pid].reason:
            continue  # spared for a reason of its own that this oracle does not model (an interactive shell)
        selected.add(pid)
    assert selected <= set(targets), (selected - set(targets), d)
    assert {p for p, t in targets.items() if t.role == Role.HOLDER} == selected

    # every target is a selected holder or within one's job, never elsewhere: the job's anchors are
    # the holders, their ancestors within their process group, and their groups; the rest descends from them
    holder_groups = {f.procs[h].pgid for h in selected}
    anchors = set(selected) | {p for p, s in f.procs.items() if s.pgid in holder_groups or p in holder_groups}
    anchors |= {a for h in selected for a in ancestors(f, h) if f.procs.get(a) and
                f.procs[a].pgid == f.procs[h].pgid}
    for pid, t in targets.items():
        assert pid in anchors or any(a in anchors for a in ancestors(f, pid)), (pid, t)
        if sel.holders_only:
            assert pid in selected or any(a in selected for a in ancestors(f, pid))

    # the verified GPUs: as asked, else where the selected jobs hold memory, else all
    if sel.gpus is not None:
        assert set(d.verify_gpus) == set(sel.gpus)
    elif sel.narrows:
        assert set(d.verify_gpus) <= {g for p in targets for g in mem.get(p, set())}
    else:
        assert set(d.verify_gpus) == set(range(w.gpus))
    # the same facts give the same plan: what --dry-run shows is what the act gets
    assert decide(facts, res) == d


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_process_lives_while_a_thread_does(data: st.DataObject) -> None:
    """Whether a live process's leader thread has exited changes no decision (issue 24): a process
    read through a live thread is planned exactly as one whose leader runs. Only a true zombie
    (every thread gone) has exited."""
    w = data.draw(worlds())
    res = data.draw(selections(w))
    f = w.forest
    leaders = Forest({p: s._replace(live_task=None) for p, s in f.procs.items()}, f.argvs, f.uids, f.exes, f.sigs,
                     f.ns)
    leaders.user_programs = f.user_programs

    def plan(forest: Forest) -> object:
        holds = attribute(w.holds, lambda pid: pid in forest.procs, w.threads.get)
        try:
            return decide(Facts(forest, holds, w.gpus, w.caller, ME), res)
        except UsageError as exc:
            return str(exc)

    assert plan(f) == plan(leaders)


def test_caller_pid_1_and_ancestors_refused_by_pid() -> None:
    procs = {1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0),
             10: ProcStat(10, "python", "S", 1, 10, 10, 10, 0),  # a pytest run
             11: ProcStat(11, "python", "S", 10, 10, 10, 11, 0),  # the holder it started
             12: ProcStat(12, "sleep", "S", 10, 10, 10, 12, 0),  # its other child
             13: ProcStat(13, "gpuslate", "S", 10, 10, 10, 13, 0)}
    f = Forest(procs, {}, dict.fromkeys(procs, ME))
    facts = Facts(f, (Hold(11, 0, "compute", 2**30),), 1, 13, ME)
    for pid, msg in ((1, "PID 1 is never a target"), (10, "ancestor of this gpuslate"), (13, "gpuslate itself")):
        try:
            decide(facts, Resolved(Selection(pids=(pid,)), None, None))
        except UsageError as exc:
            assert msg in str(exc)
        else:
            raise AssertionError(f"--pid {pid} was accepted")
    d = decide(facts, Resolved(Selection(pids=(11,)), None, None))
    assert [t.pid for t in d.targets] == [11]  # never the caller's other child (12)
