"""``gpuslate logs [NAME...] [--follow] [--tail N] [--since WHEN] [--timestamps] [--json]``: a unit's
output; several units' (or, with no NAME, every unit's) interleaved by the time each line was written,
each line after its unit's name, as ``docker compose logs`` shows services (its options:
gpuslate/verbs.py's LOGS).

``--json`` prints the ``gpuslate.logs.v1`` document (the unit, its log file and the lines, with their
times when asked; several units: ``gpuslate.logs.many.v1``, one such document each); it is a
snapshot, so it does not go with ``--follow``. ``--since`` and ``--timestamps`` read the time of each
line the log relay recorded (units/logfile.py), as ``docker logs`` does; so does the interleaving.
With ``--follow``, several units' new lines are shown as they come, until every one of them is gone.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Iterator

from ...api import Host
from ...errors import UsageError
from ...units.logfile import UnitLog, read_many, unit_logs
from ...verbs import LOGS
from ..render.logs import Prefixes, stamp
from ..render.output import OutputLost
from . import present


def run(args: argparse.Namespace) -> int:
    line = LOGS.read(args)
    options = line.options
    if line.follow and args.json:
        raise UsageError("--json prints a snapshot: use it without --follow")
    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        if len(line.names) == 1:
            if not line.follow:
                return present(args, host.logs(line.names[0], options))
            log = UnitLog(host, line.names[0])  # an unknown unit first, as without --follow
            shown = present(args, log.read(options))
            prefixes = None
            news: Iterator[tuple[str, float | None, str]] = ((log.name, at, text) for at, text in log.follow_on())
        else:
            logs = unit_logs(host, list(dict.fromkeys(line.names)))  # every one found before any is read
            shown = present(args, read_many(logs, options))
            if not line.follow:
                return shown
            prefixes = Prefixes([log.name for log in logs], sys.stdout)
            news = _interleaved(logs)
        out = sys.stdout
        try:
            for name, at, text in news:
                if prefixes is not None:
                    out.write(prefixes.of(name))
                if options.timestamps:
                    out.write(stamp(at) + " ")
                out.write(text if text.endswith("\n") or prefixes is None else text + "\n")
                out.flush()
        except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/render/output.py)
            raise
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a follow ends
    return shown


def _interleaved(logs: list[UnitLog]) -> Iterator[tuple[str, float | None, str]]:
    """Every unit's new lines as they come (one reader thread each), until each unit is gone and
    everything it wrote was read."""
    lines: queue.Queue[tuple[str, float | None, str] | None] = queue.Queue()

    def read(log: UnitLog) -> None:
        try:
            for at, text in log.follow_on():
                lines.put((log.name, at, text))
        finally:
            lines.put(None)

    for log in logs:
        threading.Thread(target=read, args=(log,), name=f"logs {log.name}", daemon=True).start()
    left = len(logs)
    while left:
        try:
            item = lines.get(timeout=0.5)  # a timeout: Ctrl-C is seen while nothing comes
        except queue.Empty:
            continue
        if item is None:
            left -= 1
        else:
            yield item
