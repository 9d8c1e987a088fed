"""The output of ``logs NAME``, here or from another host's document (see :mod:`.results`): the
server's lines as it wrote them, like ``docker logs`` (not escaped: they are the unit's own output)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..units.logfile import LogsResult


def show_logs(result: LogsResult) -> None:
    out = sys.stdout
    for line in result.lines:
        out.write(line + "\n")
    out.flush()
