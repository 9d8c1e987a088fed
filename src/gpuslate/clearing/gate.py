"""The act-time gate: every signal ``clear`` sends is checked again, against fresh
facts, immediately before it is sent.

The plan was made from one reading of /proc; by the time a signal goes out,
processes may have exec'd, forked, moved or gone. So right before each signal
phase the gate reads the process table again and, for each victim, asks:

* is it still not protected (by the same kernel facts the plan used: its
  program, the caller's ancestry, kernel threads)? Its identity (pid and start
  time) is checked by the pidfd signalling itself (:mod:`gpuslate.proc.signals`);
* would the signal end any live process that is not a victim of this run — a
  process the plan spared, one outside the selection, another user's — as
  collateral (:mod:`gpuslate.proc.collateral`: a namespace init's members, a
  forwarder's descendants, a terminal session leader's session)?

A victim that fails either check is not signaled: it is *refused*, with the
reason, in the result and in the audit log, and the victims it started are
signaled in its stead (they are victims already). Refusing one victim can make
another unsafe (its forwarded signal would now reach the refused one), so the
check runs to a fixed point. Only single processes are ever signaled, through
their pidfds: never a process group, never a session.

:func:`refusals` is the pure decision; :class:`ActGate` gathers the facts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..proc.collateral import collateral
from ..proc.jobs import ProcessView, Protection
from ..proc.procfs import ProcessId
from ..proc.tree import ProcTable


def refusals(view: ProcessView, victims: Iterable[ProcessId], sig: int, intended: Iterable[ProcessId],
             caller_pid: int | None, caller_uid: int | None = None) -> dict[int, str]:
    """Which of ``victims`` must not receive ``sig`` now, and why.

    ``intended`` is every process this run means to end (the planned targets and
    what their jobs forked since), by identity: a pid that names another process
    now is not intended. A victim is refused when it is protected, or when the
    signal may end a live process that is not intended. Victims that are gone or
    whose pid now names another process are left to the signalling, which will
    not signal them.
    """
    protect = Protection(view, caller_pid, caller_uid)
    mine = [v for v in victims if _same(view, v)]
    allowed = {v.pid for v in intended if _same(view, v)}
    refused: dict[int, str] = {}
    changed = True
    while changed:
        changed = False
        for v in mine:
            if v.pid in refused:
                continue
            why = protect.reason(v.pid)
            if why:
                refused[v.pid] = f"protected when it was to be signaled: {why}"
            else:
                hit = next((c for c in collateral(view, v.pid, sig) if c.pid not in allowed), None)
                if hit is None:
                    continue
                refused[v.pid] = f"signalling it could end {hit.pid}, which is not a target ({hit.why})"
            allowed.discard(v.pid)
            changed = True
    return refused


def _same(view: ProcessView, ident: ProcessId) -> bool:
    st = view.get(ident.pid)
    return st is not None and st.start_ticks == ident.start_ticks and not st.has_exited


class ActGate:
    """Reads fresh facts and applies :func:`refusals` before each signal phase."""

    def __init__(self, caller_pid: int | None = None, caller_uid: int | None = None) -> None:
        self.caller = os.getpid() if caller_pid is None else caller_pid
        self.uid = os.getuid() if caller_uid is None else caller_uid

    def __call__(self, sig: int, victims: list[ProcessId], intended: set[ProcessId]) -> dict[int, str]:
        table = ProcTable()
        table.load_all()
        return refusals(table, victims, sig, intended, self.caller, self.uid)
