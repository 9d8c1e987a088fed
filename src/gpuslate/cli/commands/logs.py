"""``gpuslate logs NAME [--follow] [--tail N] [--since WHEN] [--timestamps] [--json]``: a unit's output.

``--json`` prints the ``gpuslate.logs.v1`` document (the unit, its log file
and the lines, with their times when asked); it is a snapshot, so it does not
go with ``--follow``. ``--since`` and ``--timestamps`` read the time of each
line the log relay recorded (units/logfile.py), as ``docker logs`` does.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..._time import parse_since
from ...errors import UsageError
from ..exits import exit_epilog
from ..render.logs import stamp
from ..render.output import OutputLost
from . import present
from .common import add_common, whole
from .up import unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="show a unit's output (stdout and stderr)",
                       description="Print a unit's log (its stdout and stderr, rotated at every start: "
                       "older runs are NAME.log.1 ... .5 next to it). The server's output is printed as it "
                       "wrote it, like 'docker logs'; the time of each line is recorded as it is written.",
                       epilog=exit_epilog({0: "printed (with --follow: until the unit is gone or Ctrl-C)",
                                           2: "bad input, unknown unit, --json with --follow, or --since on a "
                                           "log without line times"}, backend=False))
    add_common(p)
    p.add_argument("name", metavar="NAME", type=unit_name)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new lines until the unit is gone (or Ctrl-C)")
    p.add_argument("-n", "--tail", type=whole(0, 10**9), metavar="N", help="only the last N lines")
    p.add_argument("--since", type=since_type, metavar="WHEN",
                   help="only lines written since WHEN: a duration back from now (10m, 1h30m, 42s) or a time "
                   "(2013-01-02T13:23:37Z; without a zone, local time; or Unix seconds), as docker logs --since")
    p.add_argument("-t", "--timestamps", action="store_true",
                   help="start each line with the time it was written (RFC 3339, UTC)")
    p.set_defaults(handler=run)


def since_type(text: str) -> float:
    """``--since``: the epoch time it names, now (bad input is exit 2 before anything is read)."""
    try:
        return parse_since(text, time.time())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


since_type.__name__ = "time or duration"


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units.logfile import LogsOptions, UnitLog  # lazy: startup

    options = LogsOptions(tail=args.tail, since=args.since, timestamps=args.timestamps)
    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        if not args.follow:
            return present(args, host.logs(args.name, options))
        log = UnitLog(host, args.name)  # an unknown unit first, as without --follow
        if args.json:
            raise UsageError("--json prints a snapshot: use it without --follow")
        shown = present(args, log.read(options))
        out = sys.stdout
        try:
            for at, line in log.follow_on():
                if args.timestamps:
                    out.write(stamp(at) + " ")
                out.write(line)
                out.flush()
        except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/render/output.py)
            raise
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a follow ends
    return shown
