"""``gpuslate swap OLD NEW [--rollback]``: replace one unit by another, each phase timed."""

from __future__ import annotations

import argparse

from ..exits import exit_epilog
from ..render.live import LiveLine
from . import present
from .common import add_common, nonnegative_float
from .up import unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("swap", help="down OLD, verify its GPUs clean, up NEW and wait until it serves",
                       description="Replace unit OLD by unit NEW under the host lock: down OLD, verify its GPUs "
                       "are clean, up NEW (from gpuslate.toml or its last run) and wait until it is ready; each "
                       "phase timed. With --rollback, if NEW fails, OLD is started again and made ready.",
                       epilog=exit_epilog({0: "NEW is ready", 4: "OLD not stopped in time (NEW not started), or "
                                           "NEW not ready in time", 5: "permission denied stopping OLD",
                                           6: "NEW failed (with --rollback, OLD is serving again if it "
                                           "could be restarted)"}))
    add_common(p)
    p.add_argument("old", metavar="OLD", type=unit_name)
    p.add_argument("new", metavar="NEW", type=unit_name)
    p.add_argument("--rollback", action="store_true", help="if NEW fails, start OLD again")
    p.add_argument("--config", metavar="PATH",
                   help="unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or in a folder above)")
    p.add_argument("--no-prefetch", action="store_true",
                   help="do not read NEW's weight files into the page cache before stopping OLD")
    p.add_argument("--drain-timeout", type=nonnegative_float, metavar="SECONDS", default=60.0,
                   help="behind a front: the most the requests in flight on OLD may take to finish before "
                   "it is stopped (what still runs then is cut, and counted; default 60)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units import SwapOptions  # lazy: startup
    from ...units.interrupts import stop_signals_interrupt  # lazy: startup

    opts = SwapOptions(rollback=args.rollback, config=args.config, prefetch=not args.no_prefetch,
                       drain_timeout=args.drain_timeout)
    # a SIGTERM or SIGHUP cleans up NEW's start like Ctrl-C (exit 130)
    with stop_signals_interrupt(), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = host.swap(args.old, args.new, opts)
    return present(args, result)
