"""The output of ``logs NAME``, here or from another host's document (see :mod:`.results`): the
server's lines as it wrote them, like ``docker logs`` (not escaped: they are the unit's own output),
each after the time it was written with ``--timestamps``; several units' lines interleaved by time,
each after its unit's name (``web  | ...``, a colour per unit on a terminal), as ``docker compose logs``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from ..._time import iso_time_us
from .plain import Style, paint, safe, use_color

if TYPE_CHECKING:
    from ...units.logfile import LogsResult, ManyLogs

#: the prefixes' colours, one unit after another (as compose cycles through its own)
_COLOURS: tuple[Style, ...] = ("cyan", "yellow", "green", "magenta", "red")


def stamp(at: float | None) -> str:
    """A line's time as --timestamps prints it; a line whose time was not recorded gets a dash of
    the same width, so the lines still line up."""
    return iso_time_us(at) if at is not None else "-".ljust(27)


class Prefixes:
    """``NAME | `` before each line of several units: the names padded to the longest, escaped (a
    unit's name is checked, but the document may be another host's), coloured on a terminal."""

    def __init__(self, names: Sequence[str], out: IO[str]) -> None:
        width = max((len(safe(n)) for n in names), default=0)
        color = use_color(out)
        self._of = {n: paint(safe(n).ljust(width) + " |", (_COLOURS[i % len(_COLOURS)],), color) + " "
                    for i, n in enumerate(dict.fromkeys(names))}

    def of(self, name: str) -> str:
        return self._of.get(name) or f"{safe(name)} | "


def show_logs(result: LogsResult) -> None:
    out = sys.stdout
    if result.times is None:
        for line in result.lines:
            out.write(line + "\n")
    else:
        for line, at in zip(result.lines, result.times):
            out.write(f"{stamp(at)} {line}\n")
    out.flush()


def show_many(result: ManyLogs) -> None:
    """Several units' lines, interleaved by the time each was written."""
    out = sys.stdout
    prefixes = Prefixes([log.name for log in result.logs], out)
    for name, at, line in result.merged():
        out.write(prefixes.of(name) + (stamp(at) + " " if result.timestamps else "") + line + "\n")
    out.flush()
