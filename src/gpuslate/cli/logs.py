"""``gpuslate logs NAME [--follow] [--tail N] [--json]``: a unit's output.

``--json`` prints the ``gpuslate.logs.v1`` document (the unit, its log file
and the lines); it is a snapshot, so it does not go with ``--follow``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import UsageError
from .common import add_common, print_json, whole
from .exits import exit_epilog, exit_status_for_result
from .output import OutputLost
from .render_logs import show_logs
from .results import as_sent
from .up import unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("logs", help="show a unit's output (stdout and stderr)",
                       description="Print a unit's log (its stdout and stderr, rotated at every start: "
                       "older runs are NAME.log.1 ... .5 next to it). The server's output is printed as it "
                       "wrote it, like 'docker logs'.",
                       epilog=exit_epilog({0: "printed (with --follow: until the unit is gone or Ctrl-C)",
                                           2: "bad input, unknown unit, or --json with --follow"}, backend=False))
    add_common(p)
    p.add_argument("name", metavar="NAME", type=unit_name)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new lines until the unit is gone (or Ctrl-C)")
    p.add_argument("-n", "--tail", type=whole(0, 10**9), metavar="N", help="only the last N lines")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..api import Host  # lazy: startup
    from ..units import Unit, UnitStore  # lazy: startup
    from ..units.logfile import LogsResult, follow, tail_at  # lazy: startup

    with Host.open(getattr(args, "sim", None)) as host:  # its state folder; no GPU is needed
        units = UnitStore.of(host)
    unit = Unit.load(units, args.name)
    if unit is None:
        raise UsageError(f"unknown unit {args.name!r}: see 'gpuslate ps'")
    if args.tail is not None and args.tail < 0:
        raise UsageError(f"invalid --tail {args.tail}: must be at least 0")
    if args.json and args.follow:
        raise UsageError("--json prints a snapshot: use it without --follow")
    path = Path(unit.record.log) if unit.record else units.log_path(args.name)  # corrupt: where logs go
    lines, since = tail_at(path, args.tail)
    result = LogsResult(args.name, str(path), since is not None, unit.running(), args.tail, lines)
    if args.json:
        print_json(result.to_json())
        return exit_status_for_result(result.status)
    show_logs(as_sent(result))
    if not args.follow:
        return exit_status_for_result(result.status)
    out = sys.stdout

    def running() -> bool:
        return (Unit.load(units, args.name) or unit).running()  # a restart is a new record: follow it

    try:
        for line in follow(path, since=since, keep_going=running):
            out.write(line)
            out.flush()
    except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/output.py)
        raise
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow ends
    return 0
