"""``gpuslate logs NAME [--follow] [--tail N] [--since WHEN] [--timestamps] [--json]``: a unit's output
(its options: gpuslate/verbs.py's LOGS).

``--json`` prints the ``gpuslate.logs.v1`` document (the unit, its log file
and the lines, with their times when asked); it is a snapshot, so it does not
go with ``--follow``. ``--since`` and ``--timestamps`` read the time of each
line the log relay recorded (units/logfile.py), as ``docker logs`` does.
"""

from __future__ import annotations

import argparse
import sys

from ...api import Host
from ...errors import UsageError
from ...units.logfile import UnitLog
from ...verbs import LOGS
from ..render.logs import stamp
from ..render.output import OutputLost
from . import present


def run(args: argparse.Namespace) -> int:
    line = LOGS.read(args)
    options = line.options
    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        if not line.follow:
            return present(args, host.logs(line.name, options))
        log = UnitLog(host, line.name)  # an unknown unit first, as without --follow
        if args.json:
            raise UsageError("--json prints a snapshot: use it without --follow")
        shown = present(args, log.read(options))
        out = sys.stdout
        try:
            for at, text in log.follow_on():
                if options.timestamps:
                    out.write(stamp(at) + " ")
                out.write(text)
                out.flush()
        except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/render/output.py)
            raise
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a follow ends
    return shown
