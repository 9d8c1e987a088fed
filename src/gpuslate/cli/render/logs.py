"""The output of ``logs NAME``, here or from another host's document (see :mod:`.results`): the
server's lines as it wrote them, like ``docker logs`` (not escaped: they are the unit's own output),
each after the time it was written with ``--timestamps``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..._time import iso_time_us

if TYPE_CHECKING:
    from ...units.logfile import LogsResult


def stamp(at: float | None) -> str:
    """A line's time as --timestamps prints it; a line whose time was not recorded gets a dash of
    the same width, so the lines still line up."""
    return iso_time_us(at) if at is not None else "-".ljust(27)


def show_logs(result: LogsResult) -> None:
    out = sys.stdout
    if result.times is None:
        for line in result.lines:
            out.write(line + "\n")
    else:
        for line, at in zip(result.lines, result.times):
            out.write(f"{stamp(at)} {line}\n")
    out.flush()
