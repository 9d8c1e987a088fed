"""The act-time gate as a model (issue 15): on generated forests with namespace inits,
signal forwarders and terminal session leaders, a small model of the kernel's own
rules — written here apart from :mod:`gpuslate.proc.collateral` — delivers every
signal the gate lets through, and nothing outside the run's victims may die.

The kernel model: a process that ignores a signal keeps running; a namespace's init
drops a signal it has no handler for (SIGKILL excepted); a process with a handler
may forward the signal to each of its children and then exit (the worst case);
any other process dies. A dying namespace init takes every process of its namespace
and the namespaces below; a dying session leader on a terminal hangs up its session
(SIGHUP to every member).
"""

from __future__ import annotations

import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslate.clearing.gate import refusals
from gpuslate.clearing.plan import Facts, Hold, Resolved, Selection, attribute, decide
from gpuslate.errors import UsageError
from gpuslate.proc.procfs import ProcessId, ProcStat, SignalFacts
from test_plan_model import OTHER, Forest, World, selections, worlds

ME = 1000


def kernel_deliver(f: Forest, victims: list[int], sig: int) -> set[int]:
    """Every process that dies when each of ``victims`` receives ``sig`` (the model above)."""
    dead: set[int] = set()

    def alive(pid: int) -> bool:
        s = f.get(pid)
        return s is not None and not s.has_exited and pid not in dead

    def die(pid: int) -> None:
        if not alive(pid):
            return
        dead.add(pid)
        facts = f.signal_facts(pid)
        if facts is not None and facts.is_namespace_init:
            mine = (f.pid_ns(pid) or (None,))[0]
            for other in f.all_pids():
                if mine in (f.pid_ns(other) or ()):
                    die(other)
        s = f.get(pid)
        if s is not None and s.pid == s.sid and s.tty_nr:
            for m in f.session_members(s.sid):
                deliver(m, signal.SIGHUP)

    def deliver(pid: int, s: int) -> None:
        if not alive(pid):
            return
        facts = f.signal_facts(pid) or SignalFacts(pid, (pid,), 0, 0)
        bit = 1 << (s - 1)
        if s == signal.SIGKILL:
            die(pid)
        elif facts.sig_ign & bit:
            return
        elif facts.sig_cgt & bit:
            for c in f.children(pid):
                deliver(c, s)
            die(pid)
        elif facts.is_namespace_init:
            return  # the kernel drops it
        else:
            die(pid)

    for v in victims:
        deliver(v, sig)
    return dead


@pytest.mark.slow  # 400 examples
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_gate_lets_no_signal_end_a_process_outside_the_run(data: st.DataObject) -> None:
    w: World = data.draw(worlds())
    res: Resolved = data.draw(selections(w))
    f = w.forest
    holds = attribute(w.holds, lambda pid: pid in f.procs, w.threads.get)
    try:
        d = decide(Facts(f, holds, w.gpus, w.caller, ME), res)
    except UsageError:
        return
    victims = [t.pid for t in d.targets]
    intended = set(victims)
    # some pids were reused between the plan and the act: the planned process is gone and the pid
    # names another (a later start time); the pidfd signalling sends such a victim nothing
    reused = set(data.draw(st.lists(st.sampled_from(victims), max_size=2))) if victims else set()
    idents = [ProcessId(p, f.procs[p].start_ticks - (1 if p in reused else 0)) for p in victims]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        refused = refusals(f, idents, sig, idents, w.caller)
        assert set(refused) <= intended - reused
        allowed = [p for p in victims if p not in refused and p not in reused]
        dead = kernel_deliver(f, allowed, sig)
        # nothing outside the run dies; a reused pid is another process now, outside the run too
        assert dead <= intended - set(refused) - reused, (sig, sorted(dead - (intended - set(refused))),
                                                          sorted(reused), refused, d)


def _forest(rows: list[tuple[int, str, int, int, int, str, int, SignalFacts | None, tuple[int, ...]]]) -> Forest:
    """pid, name, ppid, pgid, sid, exe, uid, signal facts, pid namespaces."""
    procs = {1: ProcStat(1, "systemd", "S", 0, 1, 1, 1, 0)}
    exes: dict[int, str | None] = {1: "/usr/lib/systemd/systemd"}
    uids, sigs, ns = {1: 0}, {}, {}
    for pid, name, ppid, pgid, sid, exe, uid, facts, chain in rows:
        procs[pid] = ProcStat(pid, name, "S", ppid, pgid, sid, pid, 0)
        exes[pid], uids[pid], ns[pid] = exe, uid, chain
        if facts is not None:
            sigs[pid] = facts
    return Forest(procs, {p: (procs[p].name,) for p in procs}, uids, exes, sigs, ns)


HOST = (4026531836,)
TERM = 1 << 14


def test_forwarder_to_another_users_holder_is_refused_and_the_rest_of_the_job_is_signaled() -> None:
    # bash -c 'hold --gpus 0 & runuser -u alice -- hold --gpus 1 & wait', run by root (uid 0 here = ME)
    f = _forest([
        (10, "bash", 1, 10, 10, "/usr/bin/bash", ME, SignalFacts(10, (10,), 0, 0), HOST),
        (11, "python3", 10, 10, 10, "/usr/bin/python3", ME, SignalFacts(11, (11,), 0, 0), HOST),
        (12, "runuser", 10, 10, 10, "/usr/sbin/runuser", ME, SignalFacts(12, (12,), 0, TERM), HOST),
        (13, "python3", 12, 10, 10, "/usr/bin/python3", OTHER, SignalFacts(13, (13,), 0, 0), HOST),
    ])
    f.argvs[10] = ("bash", "-c", "...")
    holds = (Hold(11, 0, "compute", 2**30), Hold(13, 1, "compute", 2**30))
    d = decide(Facts(f, holds, 2, 99, ME), Resolved(Selection(), None, None))
    targets = {t.pid for t in d.targets}
    assert targets == {10, 11, 12} and {s.pid for s in d.spared} == {13}
    idents = [ProcessId(p, p) for p in sorted(targets)]
    refused = refusals(f, idents, signal.SIGTERM, idents, 99)
    assert set(refused) == {12} and "13" in refused[12] and "forward" in refused[12]
    assert kernel_deliver(f, [10, 11], signal.SIGTERM) == {10, 11}


def test_namespace_init_with_spared_members_is_refused() -> None:
    # unshare --fork --pid bash -c '...': the init holds nothing; a holder on GPU 0, a monitor and
    # another user's holder on GPU 1 live in its namespace; clear --gpus 0
    ns = (4026532200, *HOST)
    f = _forest([
        (20, "unshare", 1, 20, 20, "/usr/bin/unshare", ME, SignalFacts(20, (20,), TERM, 0), HOST),
        (21, "bash", 20, 20, 20, "/usr/bin/bash", ME, SignalFacts(21, (21, 1), 0, 0), ns),
        (22, "python3", 21, 20, 20, "/usr/bin/python3", ME, SignalFacts(22, (22, 2), 0, 0), ns),
        (23, "nvitop", 21, 20, 20, "/usr/bin/python3", ME, SignalFacts(23, (23, 3), 0, 0), ns),
        (24, "python3", 21, 20, 20, "/usr/bin/python3", OTHER, SignalFacts(24, (24, 4), 0, 0), ns),
    ])
    f.argvs[21] = ("bash", "-c", "...")
    holds = (Hold(22, 0, "compute", 2**30), Hold(23, 0, "handle", None), Hold(23, 1, "handle", None),
             Hold(24, 1, "compute", 2**30))
    d = decide(Facts(f, holds, 2, 99, ME), Resolved(Selection(gpus=(0,)), None, None))
    targets = {t.pid for t in d.targets}
    assert targets == {20, 21, 22}
    assert {23, 24} <= {s.pid for s in d.spared}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        refused = refusals(f, [ProcessId(p, p) for p in sorted(targets)], sig, [ProcessId(p, p) for p in targets], 99)
        assert 21 in refused and "namespace" in refused[21]
        assert 22 not in refused and 20 not in refused
        assert kernel_deliver(f, [p for p in targets if p not in refused], sig) <= {20, 22}


def test_group_zero_is_no_group() -> None:
    # seen from inside a container whose group leaders live outside: every pgid and sid reads 0
    f = _forest([
        (30, "python3", 1, 0, 0, "/usr/bin/python3", ME, None, HOST),  # job A, holds GPU 0
        (31, "python3", 30, 0, 0, "/usr/bin/python3", ME, None, HOST),  # its helper
        (40, "python3", 1, 0, 0, "/usr/bin/python3", ME, None, HOST),  # job B, holds GPU 1
    ])
    holds = (Hold(30, 0, "compute", 2**30), Hold(40, 1, "compute", 2**30))
    d = decide(Facts(f, holds, 2, 99, ME), Resolved(Selection(pids=(30,)), None, None))
    assert {t.pid for t in d.targets} == {30, 31}
    d = decide(Facts(f, holds, 2, 99, ME), Resolved(Selection(gpus=(0,)), None, None))
    assert {t.pid for t in d.targets} == {30, 31}


def test_caller_in_a_group_whose_leader_exited_keeps_its_other_child() -> None:
    # a script ran `python caller.py & exit`: the group's leader (50) is gone; the caller (51) started
    # A (52, GPU 0) and C (53, GPU 1) in its group and runs gpuslate (54); clear --pid A must leave C
    f = _forest([
        (51, "python3", 1, 50, 50, "/usr/bin/python3", ME, None, HOST),
        (52, "python3", 51, 50, 50, "/usr/bin/python3", ME, None, HOST),
        (53, "python3", 51, 50, 50, "/usr/bin/python3", ME, None, HOST),
        (54, "gpuslate", 51, 50, 50, "/usr/bin/python3", ME, None, HOST),
    ])
    holds = (Hold(52, 0, "compute", 2**30), Hold(53, 1, "compute", 2**30))
    d = decide(Facts(f, holds, 2, 54, ME), Resolved(Selection(pids=(52,)), None, None))
    assert {t.pid for t in d.targets} == {52}
    d = decide(Facts(f, holds, 2, 54, ME), Resolved(Selection(gpus=(0,)), None, None))
    assert {t.pid for t in d.targets} == {52}
    spared = {s.pid: s.reason for s in d.spared}
    assert "ancestor of this gpuslate" in spared[51]  # considered and left, with the reason


def test_renamed_processes_are_what_they_run() -> None:
    f = _forest([
        (60, "sshd", 1, 60, 60, "/usr/bin/python3", ME, None, HOST),  # a job calling itself sshd
        (61, "python3", 1, 61, 61, "/usr/sbin/sshd", ME, None, HOST),  # an sshd calling itself python3
        (62, "python3", 1, 62, 62, None, ME, None, HOST),  # a program that cannot be read
    ])
    holds = (Hold(60, 0, "compute", 2**30), Hold(61, 0, "compute", 2**30), Hold(62, 0, "compute", 2**30))
    d = decide(Facts(f, holds, 1, 99, ME), Resolved(Selection(all_users=True), None, None))
    assert {t.pid for t in d.targets} == {60}
    spared = {s.pid: s.reason for s in d.spared}
    assert "sshd" in spared[61] and "cannot be read" in spared[62]


def test_a_stopped_group_its_exit_would_orphan_is_collateral() -> None:
    # a launcher (70, group 70) started a job-control group 71 in its session; 72 of that group is
    # stopped and another user's: the launcher's exit may orphan group 71 and SIGHUP it
    f = _forest([
        (70, "python3", 1, 70, 70, "/usr/bin/python3", ME, SignalFacts(70, (70,), 0, 0), HOST),
        (71, "python3", 70, 71, 70, "/usr/bin/python3", ME, SignalFacts(71, (71,), 0, 0), HOST),
        (72, "python3", 71, 71, 70, "/usr/bin/python3", OTHER, SignalFacts(72, (72,), 0, 0), HOST),
    ])
    f.procs[72] = f.procs[72]._replace(state="T")
    refused = refusals(f, [ProcessId(70, 70)], signal.SIGKILL, [ProcessId(70, 70)], 99)
    assert ("71" in refused[70] or "72" in refused[70]) and "orphan" in refused[70]
    f.procs[72] = f.procs[72]._replace(state="S")
    assert refusals(f, [ProcessId(70, 70)], signal.SIGKILL, [ProcessId(70, 70)], 99) == {}


def test_a_reused_pid_under_a_forwarder_is_a_stranger() -> None:
    # the plan took a forwarder (80) and its child (81); 81 exited and its pid now names another
    # process (a later start time) under 80: 80's forwarded SIGTERM would reach the stranger
    f = _forest([
        (80, "timeout", 1, 80, 80, "/usr/bin/timeout", ME, SignalFacts(80, (80,), 0, TERM), HOST),
        (81, "python3", 80, 80, 80, "/usr/bin/python3", ME, SignalFacts(81, (81,), 0, 0), HOST),
    ])
    planned = [ProcessId(80, 80), ProcessId(81, 81 - 1)]
    refused = refusals(f, planned, signal.SIGTERM, planned, 99)
    assert set(refused) == {80} and "81" in refused[80]
    assert refusals(f, [ProcessId(80, 80), ProcessId(81, 81)], signal.SIGTERM,
                    [ProcessId(80, 80), ProcessId(81, 81)], 99) == {}


def test_its_own_group_orphaned_by_its_exit_is_collateral() -> None:
    # fuzzer seed 4006: the target (90) leads group 90 and is stopped; its parent (89) is in
    # another group of the same session; its child 91 (another user's, stopped) is in group 90:
    # once 90 is gone, nothing anchors group 90, which is orphaned with a stopped member
    f = _forest([
        (89, "python3", 1, 89, 89, "/usr/bin/python3", ME, SignalFacts(89, (89,), 0, 0), HOST),
        (90, "python3", 89, 90, 89, "/usr/bin/python3", ME, SignalFacts(90, (90,), TERM, 0), HOST),
        (91, "python3", 90, 90, 89, "/usr/bin/python3", OTHER, SignalFacts(91, (91,), 0, 0), HOST),
    ])
    f.procs[90] = f.procs[90]._replace(state="T")
    f.procs[91] = f.procs[91]._replace(state="T")
    refused = refusals(f, [ProcessId(90, 90)], signal.SIGKILL, [ProcessId(90, 90)], 99)
    assert "91" in refused[90] and "orphan" in refused[90]
