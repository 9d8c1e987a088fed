"""A unit's state, decided from what is alive now, not from the last phase written.

``up`` and ``down`` write a *phase* into the unit's record (starting, ready,
failed, stopped); ``park`` and ``resume`` write a *park phase* beside it
(draining, parking, parked, resuming, broken), each before the step it names.
A process that was killed (``up`` or ``park`` by SIGKILL, the server by the OOM
killer) writes nothing more. So the state ``ps`` shows is a pure function of
gathered facts: the phases, whether the main process and other processes of the
unit live, whether the ``up`` that launched it (or the ``park``/``resume`` under
way) still runs, what the readiness check answers, and which processes started
after the unit hold memory on its GPUs without being found in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Phase(str, Enum):
    """What ``up``/``down`` recorded last (a ``str``: records and older callers compare strings)."""

    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


class ParkPhase(str, Enum):
    """What ``park``/``resume`` recorded last, each before its step (units/park.py): a gpuslate
    killed at any point leaves one of these, which ``ps`` names and ``resume`` or ``down`` ends."""

    DRAINING = "draining"  # new work stopped (the front holds), requests in flight finishing
    PARKING = "parking"  # the engine's park call, or the driver's lock and checkpoint, under way
    PARKED = "parked"  # proven: its GPU memory left, down to its method's residue
    RESUMING = "resuming"  # the engine's resume, or the driver's restore and unlock, under way
    BROKEN = "broken"  # it lives, but a park or resume left it unable to serve as before (see its reason)

    def __str__(self) -> str:
        return self.value


class UnitState(str, Enum):
    """What ``ps`` reports (docs/units.md has the table)."""

    STARTING = "starting"  # up is waiting for readiness; up and the main process live
    READY = "ready"  # ready (or answers its readiness check after up vanished); main process lives
    EXITED = "exited"  # the main process ended by itself; nothing of the unit is left
    FAILED = "failed"  # up gave up on it and cleaned up
    STOPPED = "stopped"  # down stopped it
    ORPHANED = "orphaned"  # processes of the unit (or the caller's GPU holders started after it) live on
    CORRUPT = "corrupt"  # its record cannot be read; what it may still run is found by name
    PARKING = "parking"  # a park or its drain is under way (the gpuslate doing it lives)
    PARKED = "parked"  # alive with its GPU memory released (held in host memory, or dropped)
    RESUMING = "resuming"  # a resume is under way (the gpuslate doing it lives)
    INTERRUPTED = "interrupted"  # the gpuslate parking or resuming it is gone mid-way: 'resume' or 'down' ends it
    BROKEN = "broken"  # alive, but a park or resume left it unable to serve as before: 'restart' or 'down'

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class UnitFacts:
    """Everything :func:`unit_state` needs, gathered once from the host."""

    phase: Phase | None  # None: the record is corrupt
    main_alive: bool  # the main process, with its recorded start time
    members_alive: bool  # any process of the unit (main included)
    up_alive: bool  # the gpuslate process that launched the unit still runs (same start time)
    ready_answer: bool | None  # the readiness check answered (None: not asked)
    strays: tuple[int, ...] = ()  # the caller's GPU holders started after the unit, on its GPUs, not found in it
    park: ParkPhase | None = None  # the park phase recorded (None: not parked, nor being parked)
    park_by_alive: bool = False  # the gpuslate that recorded it (park, resume) still runs


def unit_state(f: UnitFacts) -> UnitState:
    """The state of a unit; total over every combination of facts (never raises)."""
    if f.phase is None:
        return UnitState.CORRUPT
    leftover = f.members_alive or bool(f.strays)
    if f.phase in (Phase.FAILED, Phase.STOPPED):
        # what gpuslate could not stop (permission, a process it could not find) is still running
        return UnitState.ORPHANED if leftover else UnitState(f.phase.value)
    if f.main_alive:
        if f.phase == Phase.READY and f.park is not None:
            return park_state(f.park, f.park_by_alive)
        if f.phase == Phase.READY:
            return UnitState.READY
        if f.up_alive:
            return UnitState.STARTING
        # up is gone (SIGKILL, a crash) with the unit still starting: the unit says what it is
        return UnitState.READY if f.ready_answer else UnitState.ORPHANED
    return UnitState.ORPHANED if leftover else UnitState.EXITED


def needs_readiness_answer(phase: Phase | None, main_alive: bool, up_alive: bool) -> bool:
    """Whether :func:`unit_state` will look at ``ready_answer``: ask the server only then."""
    return phase == Phase.STARTING and main_alive and not up_alive


def park_state(phase: ParkPhase, by_alive: bool) -> UnitState:
    """The state of a live, ready unit with a park phase recorded: parked or broken as recorded; a
    step under way while the gpuslate doing it lives; interrupted once it is gone."""
    if phase is ParkPhase.PARKED:
        return UnitState.PARKED
    if phase is ParkPhase.BROKEN:
        return UnitState.BROKEN
    if not by_alive:
        return UnitState.INTERRUPTED
    return UnitState.RESUMING if phase is ParkPhase.RESUMING else UnitState.PARKING
