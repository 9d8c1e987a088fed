"""The pure decision behind every fence, ``fence.decide``, against random process tables made of a
unit's processes and strangers, as the kernel allows them to be (issue 15, C and E):

* a stranger is never a member: not another user's or another instance's process, not one that
  reused the unit's main PID, not one in a session or group whose number the unit held once
  (a number is reused only when no process of the unit is left in it);
* strangers change nothing: members are the same with and without them;
* a non-root caller's members are all its own; a process whose owner is unknown never is;
* what carries the instance's marker is found; so is, while the main process lives (same start
  time), everything in its session and group; with the main process gone, a session or group still
  counts while a verified member is in it;
* a number whose witnesses are gone when read again takes nobody in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace
from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslate.proc.procfs import ProcessId, ProcStat, read_stat
from gpuslate.units.fence import (
    Held,
    Marker,
    Number,
    ProcFacts,
    Rule,
    UnitMark,
    classify,
    confirmed,
    decide,
    still_held,
)
from gpuslate.units.state import Phase, UnitFacts, UnitState, unit_state
from helpers import wait_for

MAIN = ProcessId(100, 1000)
OWNER = 1000  # the unit's (and a non-root caller's) uid


def proc(pid: int, ppid: int, pgid: int, sid: int, start: int, *, state: str = "S") -> ProcStat:
    return ProcStat(pid, f"p{pid}", state, ppid, pgid, sid, start, 0)


class World(NamedTuple):
    rule: Rule
    unit: list[ProcFacts]
    strangers: list[ProcFacts]
    main_alive: bool
    main_zombie: bool  # exited, not yet reaped: its pid, group and session numbers are still held


@st.composite
def worlds(draw: st.DrawFn) -> World:
    caller = draw(st.sampled_from([0, OWNER]))
    main_state = draw(st.sampled_from(["alive", "zombie", "gone"]))
    main_alive = main_state == "alive"
    pids = iter(draw(st.lists(st.integers(101, 400), min_size=16, max_size=16, unique=True)))
    unit: list[ProcFacts] = []
    if main_state != "gone":
        unit.append(ProcFacts(proc(MAIN.pid, 1, MAIN.pid, MAIN.pid, MAIN.start_ticks,
                                   state="S" if main_alive else "Z"), caller, Marker.OURS))
    recorded = set()
    for _ in range(draw(st.integers(0, 5))):
        pid = next(pids)
        parents = [MAIN.pid] if main_alive else []
        parents += [p.stat.pid for p in unit] + [1]
        ppid = draw(st.sampled_from(parents))
        sid = draw(st.sampled_from([MAIN.pid, pid]))  # inherited, or it called setsid
        pgid = sid if sid == pid else draw(st.sampled_from([MAIN.pid, pid]))
        marker = draw(st.sampled_from([Marker.OURS, Marker.NONE]))  # NONE: renamed (setproctitle)
        # None: gone while read; root's unit may run a part as another user (runuser)
        uid = draw(st.sampled_from([OWNER, OWNER, OWNER, None] if caller == OWNER else [0, 0, OWNER, 2000, None]))
        facts = ProcFacts(proc(pid, ppid, pgid, sid, MAIN.start_ticks + draw(st.integers(0, 50)),
                               state=draw(st.sampled_from("SSSRZ"))), uid, marker,
                          in_cgroup=draw(st.booleans()) and draw(st.booleans()))
        if draw(st.booleans()):
            recorded.add(facts.stat.ident)
        unit.append(facts)
    # the kernel frees a number only when no process (a zombie included) uses it as a pid, a group
    # or a session id
    taken = {n for p in unit for n in (p.stat.pid, p.stat.sid, p.stat.pgid)}
    strangers: list[ProcFacts] = []
    for i in range(draw(st.integers(0, 6))):
        reuse = i == 0 and MAIN.pid not in taken and draw(st.booleans())
        pid = MAIN.pid if reuse else next(pids)
        if pid in taken:
            continue
        pool = [pid] + [s.stat.pid for s in strangers] + ([] if MAIN.pid in taken else [MAIN.pid])
        sid = draw(st.sampled_from(pool))
        pgid = sid if sid == pid else draw(st.sampled_from([pid, sid]))
        start = draw(st.integers(0, 3000))
        if reuse:
            start = MAIN.start_ticks + 1 + draw(st.integers(0, 2000))
        strangers.append(ProcFacts(
            proc(pid, draw(st.sampled_from([1] + [s.stat.pid for s in strangers])), pgid, sid, start),
            draw(st.sampled_from([0, OWNER, 2000, None])),
            draw(st.sampled_from([Marker.NONE, Marker.FOREIGN, Marker.UNREAD]))))
        taken |= {pid, sid, pgid}
    rule = Rule(caller, MAIN, MAIN.pid, MAIN.pid, frozenset(recorded), MAIN.start_ticks)
    return World(rule, unit, strangers, main_alive, main_state == "zombie")


@settings(max_examples=400)
@given(worlds())
def test_strangers_are_never_members_and_change_nothing(w: World) -> None:
    members = decide(w.rule, w.unit + w.strangers).members
    assert not set(members) & {s.stat.pid for s in w.strangers}, members
    assert members == decide(w.rule, w.unit).members


@settings(max_examples=300)
@given(worlds(), st.sampled_from(Phase), st.booleans())
def test_strangers_never_change_what_ps_says(w: World, phase: Phase, up_alive: bool) -> None:
    """`ps` never calls a unit `orphaned` (or anything else) because of a stranger: a process that
    reused its pid, sits in a session whose number it once held, or is another instance's."""

    def state(procs: list[ProcFacts]) -> UnitState:
        members = decide(w.rule, procs).members
        main_alive = any(p.stat.ident == MAIN and p.stat.pid in members for p in procs)
        return unit_state(UnitFacts(phase, main_alive, bool(members), up_alive, None))

    assert state(w.unit + w.strangers) == state(w.unit)
    if not w.unit:
        assert state(w.strangers) != UnitState.ORPHANED


@settings(max_examples=400)
@given(worlds())
def test_only_what_the_caller_may_mean(w: World) -> None:
    facts = {p.stat.pid: p for p in w.unit + w.strangers}
    for pid in decide(w.rule, w.unit + w.strangers).members:
        p = facts[pid]
        assert p.uid is not None and not p.stat.has_exited
        if w.rule.caller_uid != 0:
            assert p.uid == w.rule.caller_uid


@settings(max_examples=400)
@given(worlds())
def test_what_is_the_units_is_found(w: World) -> None:
    members = decide(w.rule, w.unit + w.strangers).members
    reach = [p for p in w.unit if not p.stat.has_exited and p.uid is not None
             and (p.uid == w.rule.caller_uid or w.rule.caller_uid == 0)]
    for p in reach:
        if p.marker == Marker.OURS or p.stat.ident in w.rule.recorded or p.in_cgroup:
            assert p.stat.pid in members
        if (w.main_alive or w.main_zombie) and (p.stat.sid == MAIN.pid or p.stat.pgid == MAIN.pid):
            assert p.stat.pid in members  # the main, alive or a zombie, witnesses its session
    verified = [p for p in reach if p.stat.pid in members and
                (p.marker == Marker.OURS or p.stat.ident in w.rule.recorded or p.in_cgroup)]
    for p in reach:  # a session still held by a verified member is the unit's
        if any(v.stat.sid == p.stat.sid == MAIN.pid for v in verified):
            assert p.stat.pid in members


def test_the_session_of_a_dead_main_is_not_trusted_without_a_witness() -> None:
    """The repro, as facts: the unit's main PID reused by another user's setsid + fork whose
    leader exited; only the child, in session and group MAIN.pid, is left."""
    child = ProcFacts(proc(150, 1, MAIN.pid, MAIN.pid, MAIN.start_ticks + 500), 2000, Marker.UNREAD)
    for caller in (0, OWNER):
        rule = Rule(caller, MAIN, MAIN.pid, MAIN.pid, frozenset(), MAIN.start_ticks)
        assert decide(rule, [child]).members == {}
        # the leader alive with the reused PID: not the main (another start time)
        leader = ProcFacts(proc(MAIN.pid, 1, MAIN.pid, MAIN.pid, MAIN.start_ticks + 400), 2000, Marker.UNREAD)
        assert decide(rule, [leader, child]).members == {}
        # the same child, had a worker of the unit (recorded) still been in the session, is the unit's
        worker = ProcFacts(proc(120, 1, MAIN.pid, MAIN.pid, MAIN.start_ticks + 5), caller, Marker.NONE)
        rec = Rule(caller, MAIN, MAIN.pid, MAIN.pid, frozenset({worker.stat.ident}), MAIN.start_ticks)
        own = child._replace(uid=caller)
        assert set(decide(rec, [worker, own]).members) == {120, 150}


MARK = UnitMark("web", "a" * 32, "/state/a/units")


@given(st.sampled_from(["a" * 32, "b" * 32, None]), st.sampled_from(["web", "api", None]),
       st.sampled_from(["/state/a/units", "/state/b/units", None]), st.booleans())
def test_markers_are_placed_by_instance_then_by_name_and_state(ident, name, state, known) -> None:
    env = b"\0".join(f"{k}={v}".encode() for k, v in
                     (("PATH", "/bin"), ("GPUSLATE_UNIT_ID", ident), ("GPUSLATE_UNIT", name),
                      ("GPUSLATE_UNIT_STATE", state)) if v is not None)
    mark = MARK if known else MARK._replace(instance=None)
    got = classify(b"\0" + env, mark)
    if known and ident is not None:
        assert got == (Marker.OURS if ident == MARK.instance else Marker.FOREIGN)
    elif name is None or state is None:
        assert got == Marker.NONE
    else:
        assert got == (Marker.NAMED if (name, state) == ("web", "/state/a/units") else Marker.FOREIGN)
    assert classify(None, mark) == Marker.UNREAD


def test_the_name_alone_never_reaches_another_user() -> None:
    """A torn record (no instance id): root reaches by the name marker only its own processes."""
    rule = Rule(0, None, None, None, frozenset(), 0, named_ok=True)
    named = [ProcFacts(proc(200 + uid, 1, 200 + uid, 200 + uid, 10), uid, Marker.NAMED) for uid in (0, OWNER)]
    assert set(decide(rule, named).members) == {200}
    assert decide(replace(rule, named_ok=False), named).members == {}  # an instance is known: the name is not enough


@settings(max_examples=300)
@given(worlds(), st.data())
def test_a_number_no_witness_holds_any_more_takes_nobody_in(w: World, data: st.DataObject) -> None:
    """Witnesses are read again after every candidate (`confirmed`): a number whose witnesses are
    gone by then (it may have changed hands) admits nobody; nothing else changes, nothing is added."""
    d = decide(w.rule, w.unit + w.strangers)
    lost = data.draw(st.sets(st.sampled_from(d.held))) if d.held else set()
    got = confirmed(d, lambda h: h not in lost)
    assert set(got) <= set(d.members)
    assert confirmed(d, lambda h: True) == d.members
    for pid in set(d.members) - set(got):
        assert d.by_number[pid] in {(h.kind, h.number) for h in lost}


def test_still_held_reads_the_witness_again() -> None:
    """A real session leader witnesses its session while it lives, and as a zombie; once reaped
    (its number free for reuse), no more."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        me = read_stat(p.pid)
        assert me is not None and me.sid == p.pid
        h = Held(Number.SESSION, p.pid, (me.ident,))
        assert still_held(h) and not still_held(h._replace(number=p.pid + 1))
        assert not still_held(h._replace(witnesses=(ProcessId(p.pid, me.start_ticks + 1),)))
        os.kill(p.pid, signal.SIGKILL)
        wait_for(lambda: read_stat(p.pid) is not None and read_stat(p.pid).has_exited)
        assert still_held(h)  # a zombie still holds its numbers
    finally:
        p.kill()
        p.wait()
    assert not still_held(h)


def _ties(rule: Rule, procs: list[ProcFacts]) -> set[int]:
    """An oracle written apart from fence.decide: the live processes some tie proves the unit's, as
    docs/units.md states the ties (identity: main, recorded, cgroup, the instance's marker; a descendant
    of a live process proven so; a session or group number a process proven so is in), for the processes
    the caller may mean."""
    by = {p.stat.pid: p for p in procs}

    def reach(p: ProcFacts, identity: bool) -> bool:
        return p.uid is not None and (p.uid == rule.caller_uid or (rule.caller_uid == 0 and identity))

    def identity(p: ProcFacts) -> bool:
        return reach(p, True) and (p.stat.ident == rule.main or p.stat.ident in rule.recorded or p.in_cgroup
                                   or (rule.by_marker and p.marker == Marker.OURS
                                       and p.stat.start_ticks >= rule.since))

    proven = {p.stat.pid for p in procs if identity(p)}

    def descends(p: ProcFacts) -> bool:
        seen, q = set(), p
        while q.stat.ppid in by and q.stat.ppid not in seen and q.marker != Marker.FOREIGN:
            seen.add(q.stat.ppid)
            parent = by[q.stat.ppid]
            if parent.stat.pid in proven and not parent.stat.has_exited:
                return True
            q = parent
        return False

    witnesses = [by[pid] for pid in proven]
    out = set()
    for p in procs:
        if p.stat.has_exited or not reach(p, True):
            continue
        if p.stat.pid in proven or (p.marker != Marker.FOREIGN and descends(p)):
            out.add(p.stat.pid)
        elif (p.marker != Marker.FOREIGN and p.stat.start_ticks >= rule.main.start_ticks and reach(p, True)
              and any((w.stat.sid == p.stat.sid and w.stat.sid in (rule.sid, w.stat.pid))
                      or (w.stat.pgid == p.stat.pgid == rule.pgid) for w in witnesses)):
            out.add(p.stat.pid)
    return out


@settings(max_examples=400)
@given(worlds())
def test_no_member_without_a_tie(w: World) -> None:
    """Issue 32, "no signal without proof": down signals the fence's members, and each one is proven
    the unit's by a tie the oracle above finds, strangers and renamed processes in the table or not."""
    procs = w.unit + w.strangers
    members = decide(w.rule, procs).members
    assert set(members) <= _ties(w.rule, procs), (members, _ties(w.rule, procs))


@settings(max_examples=300)
@given(worlds(), st.data())
def test_a_recorded_identity_stays_the_units_after_setsid_and_a_rename(w: World, data: st.DataObject) -> None:
    """A process recorded as the unit's (by a scan, while a tie showed) that then calls setsid and loses
    its marker, its parent gone (reparented to init), is still a member: only its identity proves it."""
    live = [p for p in w.unit if not p.stat.has_exited and p.uid is not None
            and (p.uid == w.rule.caller_uid or w.rule.caller_uid == 0)]
    if not live:
        return
    p = data.draw(st.sampled_from(live))
    escaped = ProcFacts(p.stat._replace(ppid=1, sid=p.stat.pid, pgid=p.stat.pid), p.uid, Marker.NOT_INTACT)
    procs = [escaped if q.stat.pid == p.stat.pid else q for q in w.unit + w.strangers]
    rule = replace(w.rule, recorded=w.rule.recorded | {p.stat.ident})
    assert p.stat.pid in decide(rule, procs).members
    if p.stat.ident != MAIN and not p.in_cgroup:  # without the record, nothing ties it any more
        assert p.stat.pid not in decide(replace(w.rule, recorded=w.rule.recorded - {p.stat.ident}), procs).members
