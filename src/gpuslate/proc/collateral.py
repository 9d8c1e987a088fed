"""What a signal takes with it: the processes besides its target that it may end.

Signalling one process can end others. The kernel ends every process of a PID
namespace when the namespace's init exits; a session leader on a terminal
hangs the terminal's session up when it exits; and any process that handles a
signal may pass it on to its children (``runuser``, ``su``, ``timeout``,
``tini``, a launcher's own handler: a *signal forwarder*). ``clear`` must not
end a process it spares that way, so before every signal its act-time gate
(:mod:`gpuslate.clearing.gate`) asks :func:`collateral` what the signal may
reach, and refuses the signal when that includes a process that is not a
victim of the same run.

Everything here is a pure function of a :class:`~gpuslate.proc.jobs.ProcessView`,
and errs wide: a fact that cannot be read (a signal mask, a namespace)
counts as the worst case, so an unknown fact can only spare a target, never
widen what dies. What cannot be seen at all is documented in docs/clear.md
("What gpuslate never does"): a child that asked for ``PR_SET_PDEATHSIG`` dies
with its parent, and /proc does not say so.
"""

from __future__ import annotations

import signal
from typing import NamedTuple

from .jobs import ProcessView
from .procfs import ProcStat, SignalFacts


class Collateral(NamedTuple):
    """A process that a signal to another may end, and why."""

    pid: int
    why: str


def _catchable(sig: int) -> bool:
    return sig not in (signal.SIGKILL, signal.SIGSTOP)


def _handles(facts: SignalFacts | None, sig: int) -> bool:
    """Whether the process may act on ``sig`` rather than die of it: a handler, or the signal
    blocked (a ``signalfd`` reader takes it that way); unknown: it may."""
    return facts is None or bool((facts.sig_cgt | facts.sig_blk) & (1 << (sig - 1)))


def _alive(view: ProcessView, pid: int) -> bool:
    st = view.get(pid)
    return st is not None and not st.has_exited


def raw_descendants(view: ProcessView, pid: int) -> list[int]:
    """Every live descendant, whatever it is (what a forwarder's signal can reach)."""
    out: list[int] = []
    seen = {pid}
    stack = list(view.children(pid))
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        if _alive(view, p):
            out.append(p)
        stack.extend(view.children(p))
    return out


def namespace_members(view: ProcessView, init: int, facts: SignalFacts | None) -> list[int]:
    """The live processes the kernel ends when ``init`` (PID 1 of a namespace) exits:
    its namespace's members and everything in namespaces below it. A process whose
    namespace cannot be read counts as a member unless its depth rules it out."""
    chain = view.pid_ns(init)
    ns = chain[0] if chain else None
    depth = len(facts.nspid) if facts is not None else 0
    out: list[int] = []
    for pid in view.all_pids():
        if pid == init or not _alive(view, pid):
            continue
        theirs = view.pid_ns(pid)
        if theirs is not None and ns is not None:
            if ns in theirs:
                out.append(pid)
            continue
        f = view.signal_facts(pid)
        if f is not None and len(f.nspid) < depth:
            continue  # in a namespace above the init's: not ended by it
        if f is None and not _alive(view, pid):
            continue  # its facts were unreadable because it is gone: no signal reaches it
        out.append(pid)  # unknown: it may be a member
    return out


def _orphaned_stopped(view: ProcessView, st: ProcStat) -> list[int]:
    """The members of process groups that ``st``'s exit may orphan while one of them is
    stopped: the kernel then sends SIGHUP (and SIGCONT) to every member (POSIX job control).

    A group is kept from orphanhood by a member whose parent lives in another group of
    the same session. The groups at stake are ``st``'s own and its children's; after
    ``st`` exits, its children are reparented to a reaper outside the session (counted
    so: the worst case), and ``st`` is no member any more."""
    out: list[int] = []
    groups = {st.pgid} | {c.pgid for c in (view.get(k) for k in view.children(st.pid)) if c is not None}
    for g in groups:
        if g <= 0:
            continue
        members = [m for m in (view.get(p) for p in view.group_members(g))
                   if m is not None and m.pid != st.pid and not m.has_exited]
        if not any(m.state in ("T", "t") for m in members):
            continue
        anchored = False
        for m in members:
            if m.ppid == st.pid:
                continue  # its parent is the one exiting: it goes to a reaper
            parent = view.get(m.ppid)
            if parent is not None and not parent.has_exited and parent.pgid != g and parent.sid == m.sid:
                anchored = True
                break
        if not anchored:
            out.extend(m.pid for m in members)
    return out


def collateral(view: ProcessView, pid: int, sig: int) -> list[Collateral]:
    """The live processes besides ``pid`` that sending ``sig`` to ``pid`` may end."""
    st = view.get(pid)
    if st is None or st.has_exited:
        return []
    facts = view.signal_facts(pid)
    found: dict[int, str] = {}
    if facts is None or facts.is_namespace_init:
        # its exit ends its PID namespace; unknown facts count as if it were an init
        why = ("a member of the PID namespace it is init of" if facts is not None else
               "possibly a member of its PID namespace (its /proc/PID/status cannot be read)")
        if facts is not None:
            for m in namespace_members(view, pid, facts):
                found.setdefault(m, why)
        else:
            for m in raw_descendants(view, pid):
                found.setdefault(m, why)
    if _catchable(sig) and _handles(facts, sig):
        name = signal.Signals(sig).name
        for d in raw_descendants(view, pid):
            found.setdefault(d, f"a descendant of a process that handles {name} and may forward it")
    if st.pid == st.sid and st.tty_nr != 0:
        for m in view.session_members(st.sid):
            if m != pid and _alive(view, m):
                found.setdefault(m, "in the session it leads on a terminal, which its exit hangs up")
    for m in _orphaned_stopped(view, st):
        found.setdefault(m, "in a process group with a stopped member that its exit may orphan "
                            "(the kernel then sends SIGHUP)")
    return [Collateral(p, why) for p, why in sorted(found.items())]
