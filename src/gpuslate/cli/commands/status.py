"""``gpuslate status``: every GPU and every process that holds it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from ..._parse import selected_gpus
from ..exits import ExitStatus, exit_epilog
from ..render.output import OutputLost
from . import present
from .common import add_common, gpus_arg, positive_float

if TYPE_CHECKING:
    from ...api import Host


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show every GPU and every process that holds it",
                       description="Show every GPU (never truncated) with memory, utilization, "
                       "temperature, power and P-state, and its processes grouped under their launcher.",
                       epilog=exit_epilog({0: "shown (with --watch: ended by Ctrl-C)"}))
    add_common(p)
    p.add_argument("--gpus", type=gpus_arg, metavar="LIST", help="only these GPUs, e.g. 0,2-3 (default: all)")
    p.add_argument("--watch", type=positive_float, nargs="?", const=1.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 1) until Ctrl-C; with --json, one document per line")
    p.add_argument("--compact", action="store_true",
                   help="one line per GPU: a memory bar, used/total, utilization, temperature and its holders "
                        "(PID, user, memory), as gpustat shows them (--json: the same document)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup

    host = Host.open(getattr(args, "sim", None))
    if args.watch:
        with host:
            return _watch(args, host)
    # Not closed for one snapshot: the process exits now and the driver releases
    # everything; nvmlShutdown would add milliseconds to every call.
    snap = host.status(selected_gpus(args.gpus))
    if args.compact and not args.json:
        from ..render.status import print_compact  # lazy: startup

        print_compact(snap)
        return ExitStatus.OK
    return present(args, snap)


def _watch(args: argparse.Namespace, host: Host) -> int:
    try:
        if args.json:
            while True:
                sys.stdout.write(json.dumps(host.status(selected_gpus(args.gpus)).to_json()) + "\n")
                sys.stdout.flush()
                time.sleep(args.watch)
        from ..render.status import print_compact, print_status  # lazy: startup

        show = print_compact if args.compact else print_status
        while True:
            show(host.status(selected_gpus(args.gpus)), redraw=True)
            time.sleep(args.watch)
    except OutputLost:  # the reader went away: 141, not a Ctrl-C (cli/render/output.py)
        raise
    except KeyboardInterrupt:
        return ExitStatus.OK  # Ctrl-C is how a watch ends: not a failure
