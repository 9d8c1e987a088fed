"""``gpuslate clear``: terminate the right processes, prove the GPUs free."""

from __future__ import annotations

import argparse
import sys

from ..._parse import selected_gpus
from ..exits import exit_epilog
from ..render.live import LiveLine
from . import present
from .common import add_common, gpus_arg, nonnegative_float, pid_type, size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "clear", help="terminate the jobs holding GPUs (SIGTERM, grace, SIGKILL) and verify the memory is free",
        description="Plan, act, verify: terminate whole jobs holding the selected GPUs (your own processes "
        "unless --all-users), then wait until every GPU is free. Monitors, GPU daemons, gpuslate and its "
        "ancestors are never targets. With --pid, --user or --match and no --gpus, only the GPUs the selected "
        "jobs held are verified.",
        epilog=exit_epilog({0: "clean (or --dry-run)", 4: "not free within --timeout, or held by processes "
                            "that are not targets (at once, with the diagnosis), or the host lock still held",
                            5: "permission denied on some target (the others were signaled), or an unsafe "
                            "state folder", 130: "interrupted, or the confirmation answered no"}))
    add_common(p)
    p.add_argument("--gpus", type=gpus_arg, metavar="LIST", help="GPUs to clear, e.g. 0,2-3 or all (default: all)")
    p.add_argument("--pid", type=pid_type, action="append", default=[], metavar="PID",
                   help="only the jobs of the GPU holders that are PID or its descendants (repeatable)")
    p.add_argument("--user", metavar="NAME", help="only this user's processes")
    p.add_argument("--match", metavar="REGEX",
                   help="only the jobs of holders whose command line or title matches (their jobs come along)")
    p.add_argument("--holders-only", action="store_true",
                   help="only the selected holders and their descendants, not the rest of their jobs")
    p.add_argument("--all-users", action="store_true",
                   help="allow other users' processes as targets (needed even as root)")
    p.add_argument("--include-handles", action="store_true",
                   help="also terminate processes that only hold device handles (monitors, daemons)")
    p.add_argument("--grace", type=nonnegative_float, default=10.0, metavar="SECONDS",
                   help="time between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--timeout", type=nonnegative_float, default=60.0, metavar="SECONDS",
                   help="give up after this long in total, with a diagnosis (default 60)")
    p.add_argument("--max-used", type=size, metavar="SIZE",
                   help="most memory a free GPU may show (default 64MiB; 1GiB on drivers without NVML's v2 memory API)")
    p.add_argument("--dry-run", action="store_true", help="show the plan; signal nothing")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation on a terminal")
    p.set_defaults(handler=run_clear)


def run_clear(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...clearing.clear import ClearOptions  # lazy: startup
    from ...clearing.plan import Selection  # lazy: startup

    ask = not args.yes and not args.dry_run and sys.stdin.isatty()
    gpus = selected_gpus(args.gpus)
    sel = Selection(tuple(gpus) if gpus is not None else None, tuple(args.pid), args.user, args.match,
                    args.all_users, args.include_handles, args.holders_only)
    opts = ClearOptions(grace=args.grace, timeout=args.timeout, max_used=args.max_used, dry_run=args.dry_run,
                        confirm=_confirm if ask else None)
    # The CLI opens the host and never closes it: the process exits right after,
    # and nvmlShutdown would only add milliseconds to every clear (as for status).
    with LiveLine.of(args) as live:
        result = Host.open(args.sim, on_event=live.note, on_progress=live.sink).clear(sel, opts)
    return present(args, result)


def _confirm(plan) -> bool:
    """On a terminal: show the plan, ask before any signal."""
    from ..render.clear import print_plan  # lazy: startup

    print_plan(plan, file=sys.stderr)
    n = len(plan.targets)
    sys.stderr.write(f"Terminate {'this process' if n == 1 else f'these {n} processes'}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")
