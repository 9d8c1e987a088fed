"""A unit's fence: which live processes belong to it, how to end them all at once, and how to
clean up after them. One type per kind of containment, chosen once when the unit is loaded.

Which processes belong to a unit is a pure function, :func:`decide`, of facts
gathered once per question (:func:`gather`): each process's stat, owner,
unit marker and cgroup membership, and the fence's own :class:`Rule` (the
recorded main process and members, the unit's instance id, the caller's uid).
The rules it follows are the invariants of docs/units.md ("Which processes are
a unit's"):

* **Identity, never a number.** A process is the unit's by an identity: the
  main process or a recorded member with its recorded start time (recorded at
  readiness and at every ``ps`` and ``down`` scan: :meth:`~.store.UnitStore.record_seen`,
  so that a later ``setsid`` or a title written over its environment cannot
  hide it), a member of the unit's cgroup, a descendant of a live process
  verified so (the main process, a recorded member, a cgroup member, a process
  with the instance's marker: its parent is that very process), or a process
  carrying this unit *instance's* marker (``GPUSLATE_UNIT_ID``, 128 random
  bits made at launch). A session or process group id is a number the kernel
  reuses once every member is gone: it counts only while a process verified
  as above is in it (the kernel keeps the number from being reused while any
  member lives), never because the main process is gone. The witness is read
  again after every candidate (:func:`confirmed`): still there, the number
  was the unit's when each candidate was read.
* **Never another instance.** A process that carries another instance's
  marker, or this unit's name from another state folder, belongs to that
  unit and is never taken in by a scan.
* **Only what the caller may mean.** A non-root caller's fence holds only its
  own processes; root's reaches other users' processes only by identity
  (main, recorded members, cgroup, descendants, instance marker), never by a
  name, a port or a number.

Fences:

* :class:`SessionFence`: the unit's identities, its session and group while
  a verified member is in them, the sessions a marked process leads, and
  (without a cgroup) processes carrying its instance marker;
* :class:`CgroupFence`: every process of its cgroup (descendants cannot
  leave it), plus the session fence; ends with ``cgroup.kill``;
* :class:`ScopeFence`: the same for a transient systemd scope;
* :class:`MarkerFence`: for a unit whose record cannot be read: what the torn
  record still shows (main identity, instance id, cgroup, port) and the
  processes carrying its marker. Without an instance id, the name marker
  counts only together with this state folder's, and only for the caller's
  own processes; cgroups found by name only when a process in them carries
  such a marker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal, NamedTuple, Protocol

from ..options import Containment
from ..proc.environ import intact
from ..proc.procfs import ProcessId, ProcStat, boot_id, open_image_file, read_stat
from ..proc.tree import ProcTable
from .contain import cgroup_kill, cgroup_pids, discard_cgroup
from .preflight import port_listener
from .store import UnitRecord

FenceKind = Literal["cgroup", "scope", "session", "marker", "document"]  # document: read back, finds nothing

#: the environment variables a unit's processes inherit (launch.py sets them)
NAME_VAR, ID_VAR, STATE_VAR = "GPUSLATE_UNIT", "GPUSLATE_UNIT_ID", "GPUSLATE_UNIT_STATE"
#: how much of an environment block is read: a unit's markers come first (launch.py), and another
#: user's process must not make a scan read megabytes per process
_ENV_LIMIT = 64 << 10


class Marker(str, Enum):
    """What a process's environment says about the unit asked about."""

    OURS = "ours"  # this unit instance's id
    NAMED = "named"  # no instance id, but this unit's name and this state folder
    FOREIGN = "foreign"  # another instance's id, or this name from another state folder
    NONE = "none"  # read, and no unit marker (or one that cannot be placed: an old unit's bare name)
    NOT_INTACT = "not_intact"  # read, and written over (a title over it, in whole or part) or empty (env -i)
    UNREAD = "unread"  # not read (not needed, another user's, gone)

    def __str__(self) -> str:
        return self.value


class UnitMark(NamedTuple):
    """How this unit instance is marked: what :func:`classify` compares an environment with."""

    name: str
    instance: str | None  # None: unknown (a torn record, a record from before instance ids)
    state: str  # the state folder the unit is recorded in (resolved)


def classify(env: bytes | None, mark: UnitMark) -> Marker:
    """What the environment block ``env`` (NUL-separated, None: unreadable) says about ``mark``."""
    if env is None:
        return Marker.UNREAD
    found: dict[str, str] = {}
    for item in env.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key.decode("latin-1") in (NAME_VAR, ID_VAR, STATE_VAR):
            found.setdefault(key.decode("latin-1"), value.decode("utf-8", "replace"))
    if ID_VAR in found and mark.instance is not None:
        return Marker.OURS if found[ID_VAR] == mark.instance else Marker.FOREIGN
    if NAME_VAR not in found or STATE_VAR not in found:
        return Marker.NONE if intact(env) else Marker.NOT_INTACT
    if found[NAME_VAR] == mark.name and found[STATE_VAR] == mark.state:
        return Marker.NAMED
    return Marker.FOREIGN


def read_environ(pid: int) -> bytes | None:
    """``pid``'s environment block as the kernel shows it (None: gone, or another user's). A
    process that wrote over it (setproctitle without ``SPT_NOENV``, Perl's ``$0``) shows its
    title and padding instead: its marker is gone (:class:`Marker` ``NOT_INTACT``)."""
    try:
        fd = open_image_file(pid, "environ")  # a live thread's where the leader thread exited
    except OSError:
        return None
    try:
        return b"\0" + os.read(fd, _ENV_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)


class ProcFacts(NamedTuple):
    """What :func:`decide` knows of one process (a zombie too)."""

    stat: ProcStat
    uid: int | None  # None: unknown (gone while read)
    marker: Marker = Marker.UNREAD
    in_cgroup: bool = False  # in one of the unit's (verified) cgroups
    listener: bool = False  # the process on the unit's port (a corrupt record's last resort)


@dataclass(frozen=True)
class Rule:
    """The fence's own facts: what the record (or what is left of it) says, and who asks."""

    caller_uid: int
    main: ProcessId | None  # the main process as recorded (None: a torn record lost it)
    sid: int | None  # the unit's session and group ids (the main pid: launch.py makes it lead both)
    pgid: int | None
    recorded: frozenset[ProcessId] = frozenset()  # members recorded at readiness and at each ps/down scan
    since: int = 0  # start time (ticks) before which nothing found by a scan belongs to the unit
    by_marker: bool = True  # include processes that carry the unit's marker
    named_ok: bool = False  # the instance id is unknown: the name + state folder marker counts

    def marked(self, p: ProcFacts) -> bool:
        if not self.by_marker or p.stat.start_ticks < self.since:
            return False
        return p.marker == Marker.OURS or (self.named_ok and p.marker == Marker.NAMED)


def _reachable(rule: Rule, p: ProcFacts, by_identity: bool) -> bool:
    """A non-root caller means only its own processes; root reaches another user's only by identity."""
    if p.uid is None:
        return False
    return p.uid == rule.caller_uid or (rule.caller_uid == 0 and by_identity)


class Number(str, Enum):
    """The kinds of process number the kernel reuses that a unit's membership may rest on."""

    SESSION = "session"
    GROUP = "group"

    def __str__(self) -> str:
        return self.value


class Held(NamedTuple):
    """A session or group number taken as the unit's, on the word of these witnesses."""

    kind: Number
    number: int
    witnesses: tuple[ProcessId, ...]


class Decision(NamedTuple):
    members: dict[int, str]  # pid -> why it belongs
    by_number: dict[int, tuple[Number, int]]  # the members taken in by a number: which one
    held: tuple[Held, ...]  # the numbers trusted, with their witnesses


def decide(rule: Rule, procs: Sequence[ProcFacts], exclude: Iterable[int] = ()) -> Decision:
    """The unit's live processes among ``procs`` (zombies included: they are never members, but
    they witness), why each belongs, and the numbers trusted on a witness's word. Pure, total.
    ``exclude``: never members (the caller and its ancestors)."""
    skip = set(exclude)
    present = {p.stat.pid: p for p in procs if p.stat.pid not in skip}
    out: dict[int, str] = {}

    def add(p: ProcFacts, why: str, by_identity: bool) -> None:
        if not p.stat.has_exited and p.stat.pid not in out and _reachable(rule, p, by_identity):
            out[p.stat.pid] = why

    # 1. identities. A witness, alive or a zombie (which still holds its pid, group and session
    # numbers), proves that the numbers it is in are still the unit's
    witnesses: list[ProcFacts] = []
    parents: list[ProcFacts] = []  # live processes verified by identity: their descendants are the unit's
    for p in present.values():
        if rule.main is not None and p.stat.ident == rule.main:
            why, strong = "main process", True
        elif p.stat.ident in rule.recorded:
            why, strong = "recorded as the unit's", True
        elif p.in_cgroup:
            why, strong = "in the unit's cgroup", True
        elif rule.marked(p):
            why, strong = "carries the unit's marker", p.marker == Marker.OURS  # a name: the caller's own only
        else:
            continue
        if _reachable(rule, p, strong):  # a name marker on another user's process proves nothing
            witnesses.append(p)
            add(p, why, strong)
            if strong and not p.stat.has_exited:  # a zombie has no children: they were reparented away
                parents.append(p)
    if parents:
        kids: dict[int, list[ProcFacts]] = {}
        for p in present.values():
            kids.setdefault(p.stat.ppid, []).append(p)
        seen = {w.stat.pid for w in parents}
        stack = [k for w in parents for k in kids.get(w.stat.pid, [])]
        while stack:
            p = stack.pop()
            if p.stat.pid in seen or p.marker == Marker.FOREIGN:  # another unit started from inside: its own
                continue
            seen.add(p.stat.pid)
            add(p, "descendant of a process of the unit", True)
            stack.extend(kids.get(p.stat.pid, []))
    # 2. the port's listener (a torn record's last clue): the caller's own, never another instance's
    listener = next((p for p in present.values() if p.listener), None)
    if listener is not None and listener.stat.start_ticks >= rule.since and listener.marker != Marker.FOREIGN:
        add(listener, "listens on the unit's port", False)
        if listener.stat.pid in out:
            witnesses.append(listener)
    # 3. numbers, only while a witness holds them: the unit's session and group, and the sessions
    # its processes lead (setsid after a double fork took the unit there). With no witness left,
    # a number may name a stranger's session: the kernel reuses it once its last member is gone.
    sessions = {w.stat.sid for w in witnesses if w.stat.sid == rule.sid or w.stat.sid == w.stat.pid}
    groups = {w.stat.pgid for w in witnesses if w.stat.pgid == rule.pgid}
    held = tuple([Held(Number.SESSION, n, tuple(w.stat.ident for w in witnesses if w.stat.sid == n))
                  for n in sorted(sessions)] +
                 [Held(Number.GROUP, n, tuple(w.stat.ident for w in witnesses if w.stat.pgid == n))
                  for n in sorted(groups)])
    by_number: dict[int, tuple[Number, int]] = {}
    floor = rule.main.start_ticks if rule.main is not None else rule.since
    for p in present.values():
        if p.marker == Marker.FOREIGN or p.stat.start_ticks < floor or p.stat.pid in out:
            continue
        if p.stat.sid in sessions:
            add(p, "in the unit's session", True)
            by_number[p.stat.pid] = (Number.SESSION, p.stat.sid)
        elif p.stat.pgid in groups:
            add(p, "in the unit's process group", True)
            by_number[p.stat.pid] = (Number.GROUP, p.stat.pgid)
    return Decision(out, {pid: n for pid, n in by_number.items() if pid in out}, held)


def still_held(h: Held) -> bool:
    """Whether a witness of ``h`` is, read again now, the same process still in that number (a
    zombie counts: it holds its numbers until reaped). Read after every candidate was: a number
    still held now was the unit's when each of them was read (it is reused only once empty)."""
    for w in h.witnesses:
        st = read_stat(w.pid)
        if st is not None and st.start_ticks == w.start_ticks and \
                (st.sid if h.kind == Number.SESSION else st.pgid) == h.number:
            return True
    return False


def confirmed(d: Decision, holds: Callable[[Held], bool] = still_held) -> dict[int, str]:
    """The members of ``d``, less those a number took in that no witness holds any more: between
    the read of the witness and of the candidate, the number may have changed hands."""
    lost = {(h.kind, h.number) for h in d.held if not holds(h)}
    return {pid: why for pid, why in d.members.items() if d.by_number.get(pid) not in lost}


def gather(table: ProcTable, floor: int, *, mark: UnitMark | None, cgroup: Iterable[int] = (),
           listener: int | None = None, keep: Iterable[ProcessId] = ()) -> list[ProcFacts]:
    """Facts on every process (zombies too) started at or after ``floor``, and on the processes of
    ``cgroup`` and ``keep`` whenever they started. Environments are read only with ``mark``."""
    in_cg, kept = set(cgroup), set(keep)
    out: list[ProcFacts] = []
    for st in table.all():
        if st.start_ticks < floor and st.pid not in in_cg and st.ident not in kept:
            continue
        marker = classify(read_environ(st.pid), mark) if mark is not None else Marker.UNREAD
        out.append(ProcFacts(st, table.uid(st.pid), marker, st.pid in in_cg, st.pid == listener))
    return out


def _exclude(table: ProcTable) -> list[int]:
    # never ourselves, nor whatever runs us (gpuslate started from inside the unit)
    return [os.getpid(), *table.ancestors(os.getpid())]


def _stats(table: ProcTable, members: dict[int, str]) -> list[ProcStat]:
    return sorted((st for pid in members if (st := table.get(pid)) is not None), key=lambda s: s.pid)


class Fence(Protocol):
    @property
    def kind(self) -> FenceKind:
        """Which containment this is (read-only: the fences are frozen)."""

    @property
    def cgroup(self) -> str | None:
        """The cgroup (relative to the cgroup2 mount) when there is one."""
        ...

    def members(self, table: ProcTable) -> list[ProcStat]:
        """Every live process of the unit (never zombies, never this process or its ancestors)."""
        ...

    def kill(self) -> bool:
        """SIGKILL everything inside at once where the kernel can; False when it cannot."""
        ...

    def release(self, wait: float = 0.0) -> None:
        """Remove what the fence left behind once it is empty; blocks at most ``wait`` seconds."""
        ...


@dataclass(frozen=True)
class SessionFence:
    mark: UnitMark
    main: ProcessId
    pgid: int
    sid: int
    recorded: tuple[ProcessId, ...] = ()
    scan_marker: bool = True  # only when no cgroup holds the unit: the scan reads every environ
    kind: FenceKind = "session"

    @property
    def cgroup(self) -> str | None:
        return None

    @property
    def name(self) -> str:
        return self.mark.name

    def rule(self) -> Rule:
        # without an instance id (a record from before them) only identities and numbers count
        return Rule(os.getuid(), self.main, self.sid, self.pgid, frozenset(self.recorded), self.main.start_ticks,
                    by_marker=self.scan_marker and self.mark.instance is not None)

    def decide_in(self, table: ProcTable, cgroup: Sequence[int] = ()) -> dict[int, str]:
        facts = gather(table, self.main.start_ticks, mark=self.mark if self.scan_marker else None,
                       cgroup=cgroup, keep=self.recorded)
        return confirmed(decide(self.rule(), facts, _exclude(table)))

    def members(self, table: ProcTable) -> list[ProcStat]:
        return _stats(table, self.decide_in(table))

    def kill(self) -> bool:
        return False

    def release(self, wait: float = 0.0) -> None:
        return None


@dataclass(frozen=True)
class CgroupFence:
    path: str | None  # None for a scope whose cgroup was not seen at launch
    session: SessionFence
    kind: FenceKind = "cgroup"

    @property
    def cgroup(self) -> str | None:
        return self.path

    def members(self, table: ProcTable) -> list[ProcStat]:
        return _stats(table, self.session.decide_in(table, cgroup_pids(self.path)))

    def kill(self) -> bool:
        return bool(self.path and cgroup_pids(self.path)) and cgroup_kill(self.path)

    def release(self, wait: float = 0.0) -> None:
        discard_cgroup(self.path, wait)


@dataclass(frozen=True)
class ScopeFence(CgroupFence):
    """A transient systemd scope: a cgroup systemd made (and collects once it is empty)."""

    kind: FenceKind = "scope"


@dataclass(frozen=True)
class MarkerFence:
    """What can still be found of a unit whose record is unreadable."""

    mark: UnitMark
    trusted: tuple[str, ...] = ()  # the cgroup the torn record (ours) still names
    candidates: tuple[str, ...] = ()  # cgroups gpuslate made for a unit of this name: verified before use
    port: int | None = None
    since_ticks: int | None = None  # the torn record's main start time, when it still reads
    main: ProcessId | None = None  # the torn record's main process, when pid and start time read
    written_ticks: float | None = None  # when the record was last written (boot clock ticks)
    recorded: tuple[ProcessId, ...] = ()  # the identities recorded as its instance's (store.UnitStore.seen)
    kind: FenceKind = "marker"

    @property
    def name(self) -> str:
        return self.mark.name

    @property
    def cgroup(self) -> str | None:
        """The first of the unit's cgroups as verified now (never an unverified one by name)."""
        found = self.cgroups(ProcTable())
        return found[0] if found else None

    def rule(self) -> Rule:
        pid = self.main.pid if self.main else None
        return Rule(os.getuid(), self.main, pid, pid, frozenset(self.recorded), self.since_ticks or 0,
                    by_marker=True, named_ok=self.mark.instance is None)

    def cgroups(self, table: ProcTable) -> list[str]:
        """The trusted cgroup, and those found by name in which a process carries the unit's marker
        (two state folders of one user may each have a unit of this name)."""
        rule = self.rule()
        out = list(self.trusted)
        for cg in self.candidates:
            pids = cgroup_pids(cg)
            facts = [ProcFacts(st, table.uid(st.pid), classify(read_environ(st.pid), self.mark))
                     for pid in pids if (st := table.get(pid)) is not None and not st.has_exited]
            if any(rule.marked(p) and _reachable(rule, p, p.marker == Marker.OURS) for p in facts):
                out.append(cg)
        return out

    def members(self, table: ProcTable) -> list[ProcStat]:
        in_cg = [pid for cg in self.cgroups(table) for pid in cgroup_pids(cg)]
        listener = self._listener(table)
        facts = gather(table, self.since_ticks or 0, mark=self.mark, cgroup=in_cg,
                       listener=listener, keep=[*([self.main] if self.main else []), *self.recorded])
        return _stats(table, confirmed(decide(self.rule(), facts, _exclude(table))))

    def _listener(self, table: ProcTable) -> int | None:
        if self.port is None or self.written_ticks is None:
            return None
        # The server on the unit's port, started before the record was last written: the port was
        # free when the unit launched (pre-flight) and the record is rewritten at ready and at stop,
        # so a listener started later is not it. Its owner and marker are checked by decide().
        pid = port_listener(self.port)
        st = table.get(pid) if pid else None
        if st is None or st.has_exited or not (self.since_ticks or 0) <= st.start_ticks <= self.written_ticks:
            return None
        return st.pid

    def kill(self) -> bool:
        return any([cgroup_kill(cg) for cg in self.cgroups(ProcTable()) if cgroup_pids(cg)])  # noqa: C419 - kill all

    def release(self, wait: float = 0.0) -> None:
        for cg in self.trusted + self.candidates:
            discard_cgroup(cg, wait)  # removes only an empty cgroup


def fence_of(rec: UnitRecord, state: str, seen: Iterable[ProcessId] = ()) -> Fence:
    """The fence of a unit as its record describes it; ``state``: the state folder the record is
    in, as its units carry it (:meth:`~.store.UnitStore.mark`); ``seen``: the identities recorded as
    its instance's since (:meth:`~.store.UnitStore.seen`)."""
    mark = UnitMark(rec.name, rec.instance or None, state)
    if rec.boot and rec.boot != boot_id():
        # launched in another boot: pids and start ticks began again since, its identities may name strangers
        # now; only its instance's marker (128 random bits) can still find a process of it
        main, recorded = ProcessId(rec.pid, -1), tuple[ProcessId, ...]()
    else:
        main, recorded = rec.ident, tuple(sorted({*rec.member_ids, *seen}))
    session = SessionFence(mark, main, rec.pgid, rec.sid, recorded, scan_marker=rec.cgroup is None)
    if rec.containment == Containment.CGROUP:
        return CgroupFence(rec.cgroup, session)
    if rec.containment == Containment.SCOPE:
        return ScopeFence(rec.cgroup, session)
    return session
