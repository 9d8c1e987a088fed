"""What a result's status means, said where the status is defined: each member of a result's status
enum carries its :class:`Outcome` (done, not done in time, denied, failed, partial...).

The library never picks an exit code (only cli/ does, in cli/exits.py, one dict from Outcome to
exit status); but whether ``leaked`` means the job is not done (``clear``: exit 4) or done
(``sim leak``: exit 0) is the status's own meaning, and it belongs beside the member, not in a
second table keyed by the enum's name. A member is written ``CLEAN = "clean", Outcome.DONE``: its
value (and so every JSON document, and ``ClearStatus("clean")``) stays the string; a status enum
without an outcome for a member cannot be defined.

A low, dependency-free module: every layer's result types import it.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence


class Outcome(Enum):
    """What a finished result means for the caller (cli/exits.py gives each its exit status)."""

    DONE = "done"
    NOT_DONE = "not_done"  # not within the time allowed, or a state that keeps it from being done
    DENIED = "denied"  # permission denied
    FAILED = "failed"  # what was started failed (a server, every request)
    PARTIAL = "partial"  # some parts done, some failed
    NOT_DRAINED = "not_drained"  # slurm prolog/epilog: the GPUs not free and the node not drained
    INTERRUPTED = "interrupted"  # a run ended by Ctrl-C, what finished reported


class StatusEnum(str, Enum):
    """The base of every result's status enum: a string value, and the member's :class:`Outcome`."""

    outcome: Outcome

    if not TYPE_CHECKING:  # to a type checker, the enum's own __new__: a member is looked up by its value alone
        def __new__(cls, value: str, outcome: Outcome) -> StatusEnum:
            if not isinstance(outcome, Outcome):
                raise TypeError(f"{cls.__name__}.{value}: its second item must be an Outcome, not {outcome!r}")
            obj = str.__new__(cls, value)
            obj._value_ = value
            obj.outcome = outcome
            return obj


class PartedStatus(StatusEnum):
    """The status of a result made of parts (a swap's or a restart's stop and start, a batch's units):
    when it failed, the failed parts' own statuses decide the exit status (cli/exits.py), the
    member's outcome being what the status alone says."""


if TYPE_CHECKING:
    class HasStatus(Protocol):
        """A finished result: its status enum member says what it means (a Protocol for type checkers
        only: defining one at run time costs ``status`` start-up)."""

        @property
        def status(self) -> StatusEnum: ...


class Parted:
    """The base of a result made of parts (its status a :class:`PartedStatus`): when it failed, the
    parts that decide what that means, each a result with its own status (a swap's or a restart's
    failed stop or start; every unit a batch ran). A plain base, so that asking is one isinstance."""

    __slots__ = ()

    def deciding_parts(self) -> Sequence[HasStatus]:
        raise NotImplementedError(f"{type(self).__name__} names no deciding parts")


def status_enums() -> list[type[StatusEnum]]:
    """Every status enum defined so far (those of modules not imported yet are not listed)."""
    found: list[type[StatusEnum]] = []
    todo: list[type[StatusEnum]] = [StatusEnum]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if len(sub):  # a base without members (PartedStatus) is no result's
                found.append(sub)
    return found
