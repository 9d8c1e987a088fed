"""``gpuslate wait --free``: wait until GPUs are free; signals nothing."""

from __future__ import annotations

import argparse

from ..._parse import selected_gpus
from ..exits import exit_epilog
from ..render.live import LiveLine
from . import present
from .common import add_common, gpus_arg, nonnegative_float, size


def register(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("wait", help="wait until GPUs are free; signals nothing",
                       description="Return 0 as soon as the selected GPUs are free (no process with a context, "
                       "used memory at most --max-used), 4 on timeout with a diagnosis. Signals nothing.",
                       epilog=exit_epilog({0: "free", 4: "not free within --timeout (with a diagnosis)"}))
    add_common(w)
    w.add_argument("--free", action="store_true", required=True, help="wait for the GPUs to be free")
    w.add_argument("--gpus", type=gpus_arg, metavar="LIST", help="GPUs to wait for, e.g. 0,2-3 or all (default: all)")
    w.add_argument("--max-used", type=size, metavar="SIZE",
                   help="most memory a free GPU may show (default 64MiB; 1GiB on drivers without NVML's v2 memory API)")
    w.add_argument("--timeout", type=nonnegative_float, default=60.0, metavar="SECONDS",
                   help="give up after this long (default 60)")
    w.set_defaults(handler=run_wait)


def run_wait(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...clearing.wait import WaitOptions  # lazy: startup

    with LiveLine.of(args) as live:
        result = Host.open(args.sim, on_progress=live.sink).wait(
            selected_gpus(args.gpus), WaitOptions(max_used=args.max_used, timeout=args.timeout))
    return present(args, result)
