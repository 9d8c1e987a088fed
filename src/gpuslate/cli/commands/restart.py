"""``gpuslate restart [NAME...]``: stop units and start them again as they last ran (``docker compose
restart``); none named: every unit of the unit file that has run."""

from __future__ import annotations

import argparse

from ..exits import exit_epilog
from . import present
from .common import add_common, nonnegative_float, note
from .up import file_units, unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("restart", help="stop a unit and start it again as it last ran",
                       description="Stop the unit NAME (its GPUs verified free, as 'down') and start it again "
                       "with the spec it last ran with, under one hold of the host lock, the downtime measured as "
                       "'swap' measures it; a unit nothing of which runs is just started. As 'docker compose "
                       "restart': the unit file's changes since are not taken ('down' then 'up' takes them). "
                       "Several NAMEs: one after another, stopping at the first that fails; none: every unit "
                       "of the unit file that has run. See docs/units.md.",
                       epilog=exit_epilog({0: "ready again", 2: "bad input, or unknown unit",
                                           4: "not stopped in time (not started again), or not ready in time",
                                           5: "permission denied stopping it", 6: "it failed to start again",
                                           7: "several units: one failed after others were restarted"}))
    add_common(p)
    p.add_argument("names", metavar="NAME", type=unit_name, nargs="*",
                   help="the unit (none: every unit of the unit file that has run)")
    p.add_argument("--prefetch", action="store_true",
                   help="read its weight files into the page cache before stopping it, as swap does "
                   "(off: the server that just ran them has them cached)")
    p.add_argument("--drain-timeout", type=nonnegative_float, metavar="SECONDS", default=60.0,
                   help="behind a front: the most the requests in flight on it may take to finish before "
                   "it is stopped (what still runs then is cut, and counted; default 60)")
    p.add_argument("--config", metavar="PATH",
                   help="with no NAME: the unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or above)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units import RestartOptions, UnitStore, restart_many  # lazy: startup
    from ...units.interrupts import stop_signals_interrupt  # lazy: startup

    opts = RestartOptions(prefetch=args.prefetch, drain_timeout=args.drain_timeout)
    with stop_signals_interrupt(), Host.open(getattr(args, "sim", None), on_event=note) as host:
        if len(args.names) == 1:
            result = host.restart(args.names[0], opts)
        else:
            names = list(dict.fromkeys(args.names))
            if not names:
                units = UnitStore.of(host)
                names = [n for n in file_units(args.config, "restart") if units.record_path(n).exists()]
            return present(args, restart_many(host, names, opts))
    return present(args, result)
