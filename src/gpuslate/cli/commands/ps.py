"""``gpuslate ps``: the managed units and their live state."""

from __future__ import annotations

import argparse

from ..exits import exit_epilog
from . import present
from .common import add_common


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ps", help="list managed units: state, pid, uptime, port, GPUs, memory, time to ready",
                       description="List managed units with their state as the host shows it now: "
                       "starting, ready, exited, failed, stopped, orphaned (the main process died while "
                       "processes of the unit live on, or 'up' vanished before it was ready; 'gpuslate down NAME' "
                       "cleans them up), or corrupt (its record cannot be read). Like 'docker ps', units "
                       "stopped (or failed) more than an hour ago are left out unless -a; a unit that exited "
                       "by itself is listed until 'gpuslate down' or 'gpuslate rm'.",
                       epilog=exit_epilog({0: "listed", 5: "unsafe state folder"}))
    add_common(p)
    p.add_argument("-a", "--all", action="store_true", help="also the units stopped more than an hour ago")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units.listing import PsOptions  # lazy: startup

    with Host.open(getattr(args, "sim", None)) as host:
        result = host.ps(PsOptions(all=args.all))
    return present(args, result)
