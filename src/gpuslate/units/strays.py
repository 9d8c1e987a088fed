"""Strays: processes a unit's fence does not find that ``down`` and ``ps`` cannot rule out.

Without a cgroup a unit is its session, its process group, the descendants of
its processes, the processes carrying its instance marker and the identities
recorded as its own at readiness and at every ``ps`` and ``down`` (:mod:`.fence`).
A worker that double-forked, called ``setsid`` and lost its environment (a
title written over it where ``SPT_NOENV`` did not reach, Perl's ``$0``,
``env -i``) before any of those looked is none of these, yet it may be what
the unit left.

**A stray is never signaled.** Only what a tie proves the unit's is (the fence:
``down`` ends all of it; ``down --clear`` ends nothing more). A stray is
circumstantial: a process of the caller's that started while the unit ran and
holds what it held, which could as well be a program the caller started by
hand meanwhile. So it is named, with the command that ends it
(:meth:`Stray.remedy`), and left alone:

* one that holds memory on the unit's GPUs or listens on its port
  (:attr:`Stray.blocking`) keeps ``down`` at "NOT verified" (the next ``up``
  would collide with it) and ``ps`` at ``orphaned``;
* one that holds memory on another GPU only is a warning: ``down`` says
  released (what the unit held is free), and names it.

A stray is a live process of the caller's own (never another user's: a
crashed unit's GPUs, even its pid, may be anyone's now), started between the
unit's launch and its stop, found in no unit (this one's members are not
strays; a process another unit can claim by any tie, its fence or its
recorded identities, is that unit's), carrying no other unit instance's
marker, that

* holds memory on one of the unit's GPUs (:attr:`StrayReason.UNIT_GPU`), or
* listens on the unit's port (:attr:`StrayReason.UNIT_PORT`: the next ``up``
  could not bind it), or
* holds memory on another GPU with an environment that is not intact
  (:attr:`StrayReason.OTHER_GPU`, :func:`gpuslate.proc.environ.intact`), in
  a session whose leader does not show it is someone else's: an intact
  environment without the unit's marker rules a process out (a program the
  caller started meanwhile), one written over or empty cannot; nor can it
  rule out its session, unless the session's leader lives and its intact
  environment has no marker of this unit (a vLLM started by hand in a shell:
  its engine core renamed itself, its shell did not). A unit's escapee that
  called ``setsid`` leads its own session, or its session's leader is gone.

:func:`decide` is a pure function of gathered :class:`Candidate` facts, with
the invariants above tested as a model (tests/units/test_unit_strays_model.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from .._document import Fields
from .._parse import format_size, gpus_phrase
from .fence import Marker


class StrayReason(str, Enum):
    """Why a process not found in the unit cannot be ruled out."""

    UNIT_GPU = "unit_gpu"  # it holds memory on one of the unit's GPUs
    UNIT_PORT = "unit_port"  # it listens on the unit's port
    OTHER_GPU = "other_gpu"  # it holds memory on another GPU, and its environment is not intact

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True, slots=True)
class Stray:
    """A process holding what a unit held, started while the unit lived, that its fence does
    not find: most likely the unit's own (see the module doc). By keywords only (``pid`` and
    ``start_ticks`` are both ints)."""

    pid: int
    start_ticks: int
    name: str
    gpus: list[int]  # every GPU it holds memory on
    used_memory: int  # on all of them
    reason: StrayReason
    port: int | None = None  # the unit's port, when it listens there

    @property
    def blocking(self) -> bool:
        """It holds what the unit's next ``up`` needs (its GPUs, its port): ``down`` is not verified."""
        return self.reason in (StrayReason.UNIT_GPU, StrayReason.UNIT_PORT)

    def remedy(self) -> str:
        """The command that ends it (``clear`` selects GPU holders only: one that holds only the port
        is ended by its pid)."""
        return f"gpuslate clear --pid {self.pid}" if self.gpus else f"kill {self.pid}"

    def describe(self) -> str:
        """``pid 123 (escaped) holds 1.0 GiB on GPU 1 ...``: what it holds and why it counts."""
        held = []
        if self.used_memory:
            held.append(f"holds {format_size(self.used_memory)} on {gpus_phrase(self.gpus)}")
        if self.port is not None:
            held.append(f"listens on the unit's port {self.port}")
        why = {StrayReason.UNIT_GPU: "", StrayReason.UNIT_PORT: "",
               StrayReason.OTHER_GPU: ", its environment written over or empty"}[self.reason]
        return f"pid {self.pid} ({self.name}) {' and '.join(held)}{why}"

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "name": self.name, "gpus": self.gpus,
                "used_memory": self.used_memory, "reason": self.reason.value, "port": self.port}

    @classmethod
    def from_json(cls, d: object) -> Stray:
        f = Fields(d)
        return cls(pid=f.pid("pid"), start_ticks=f.integer("start_ticks", 0), name=f.text("name"), gpus=f.gpus("gpus"),
                   used_memory=f.size("used_memory"), reason=f.choice("reason", StrayReason),
                   port=f.opt_integer("port", 1, 65535))


class Rule(NamedTuple):
    """What the unit's record says, and who asks."""

    caller_uid: int
    since: int  # the unit's launch: its main process's start (clock ticks since boot)
    until: float | None  # its stop, in the same clock (None: not stopped)
    gpus: frozenset[int]  # the unit's GPUs
    port: int | None


class Candidate(NamedTuple):
    """What is known of one process that holds GPU memory or listens on the unit's port."""

    pid: int
    start_ticks: int
    name: str
    exited: bool  # a zombie: it holds nothing any more
    uid: int | None  # None: unknown (gone while read)
    claimed: bool  # found in this unit or another (or it is the caller or one of its ancestors)
    marker: Marker  # what its environment says about the unit (UNREAD: not read)
    memory: dict[int, int]  # GPU -> bytes it holds there (more than 0)
    listens: bool = False  # on the unit's port
    leader: Marker = Marker.UNREAD  # what its session leader's environment says (UNREAD: gone, another user's)


def reason(rule: Rule, c: Candidate) -> StrayReason | None:
    """Why ``c`` is a stray of the unit, or None when it is ruled out (see the module doc)."""
    if c.exited or c.claimed or c.uid is None or c.uid != rule.caller_uid or c.marker == Marker.FOREIGN:
        return None
    if c.start_ticks < rule.since:
        return None
    # start times are whole clock ticks, rounded down: one in the tick of the stop comes after it
    if rule.until is not None and c.start_ticks >= int(rule.until):
        return None
    held = {g for g, b in c.memory.items() if b > 0}
    if held & rule.gpus:
        return StrayReason.UNIT_GPU
    if c.listens and rule.port is not None:
        return StrayReason.UNIT_PORT
    if held and c.marker == Marker.NOT_INTACT and c.leader not in (Marker.NONE, Marker.FOREIGN):
        return StrayReason.OTHER_GPU
    return None


def decide(rule: Rule, candidates: Iterable[Candidate]) -> list[Stray]:
    """The strays among ``candidates``, by pid. Pure, total."""
    out: dict[int, Stray] = {}
    seen: set[int] = set()
    for c in candidates:  # a pid's first reading decides it (a later one of the same pid changes nothing)
        if c.pid in seen:
            continue
        seen.add(c.pid)
        why = reason(rule, c)
        if why is None:
            continue
        held = {g: b for g, b in c.memory.items() if b > 0}
        out[c.pid] = Stray(pid=c.pid, start_ticks=c.start_ticks, name=c.name, gpus=sorted(held),
                           used_memory=sum(held.values()), reason=why,
                           port=rule.port if c.listens and rule.port is not None else None)
    return [out[p] for p in sorted(out)]
