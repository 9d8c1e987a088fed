"""``gpuslate rm NAME...``: remove the records and logs of units nothing of which runs (``docker rm``)."""

from __future__ import annotations

import argparse

from ..exits import exit_epilog
from . import present
from .common import add_common
from .up import unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rm", help="remove stopped units: their records and logs",
                       description="Remove the record and the logs of each unit NAME, which must be stopped, "
                       "failed or exited; a running unit (starting, ready, or orphaned: processes of it still "
                       "run) or one whose record is corrupt is refused, and then nothing is removed (stop it "
                       "with 'gpuslate down NAME' first). As 'docker rm'. The audit log keeps every signal "
                       "sent to it. See docs/units.md.",
                       epilog=exit_epilog({0: "removed", 2: "bad input, unknown unit, or a unit still running "
                                           "(nothing removed)", 5: "a file could not be removed"}))
    add_common(p)
    p.add_argument("names", metavar="NAME", type=unit_name, nargs="+")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup

    with Host.open(getattr(args, "sim", None)) as host:
        result = host.rm(list(dict.fromkeys(args.names)))
    return present(args, result)
