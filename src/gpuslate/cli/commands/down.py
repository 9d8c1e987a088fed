"""``gpuslate down NAME``: stop every process of a unit and verify its GPU memory is released;
``gpuslate down [NAME...]``: several, or every unit of the unit file (as ``docker compose down``)."""

from __future__ import annotations

import argparse
import signal
from typing import TYPE_CHECKING

from ..exits import exit_epilog
from ..render.live import LiveLine
from . import present
from .common import add_common, nonnegative_float, size
from .up import file_units, unit_name

if TYPE_CHECKING:
    from ...units import DownOptions


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("down", help="stop a managed unit and verify its GPUs are released",
                       description="SIGTERM every process of the unit (cgroup, session, process group), grace, "
                       "SIGKILL; sweep processes of the unit that appeared meanwhile; then verify its GPU memory "
                       "is released, as 'clear' does. A unit with a corrupt record is stopped by what can still "
                       "be found of it (its cgroup, its instance's marker, its port); the record is then "
                       "set aside. Only this unit instance's processes are reached (never another user's or "
                       "another state folder's unit of the same name). 'down A B' stops those (in the reverse "
                       "order, each even when another fails), 'down' alone every unit of the unit file, as "
                       "'docker compose down'.",
                       epilog=exit_epilog({0: "stopped and its GPU memory released", 2: "bad input, or unknown unit",
                                           4: "not released in time (or its GPUs or port held by processes not "
                                           "found in the unit, never signaled: each named with the command "
                                           "that ends it)", 5: "permission denied on some process",
                                           7: "several units: some stopped, some not"}))
    add_common(p)
    p.add_argument("names", metavar="NAME", type=unit_name, nargs="*",
                   help="the unit (none: every unit of the unit file)")
    p.add_argument("--config", metavar="PATH",
                   help="with no NAME: the unit file (default: $GPUSLATE_CONFIG, else gpuslate.toml here or above)")
    p.add_argument("--grace", type=nonnegative_float, metavar="SECONDS", help="default: the unit's (10)")
    p.add_argument("--timeout", type=nonnegative_float, metavar="SECONDS",
                   help="for stopping and memory release together (default: the unit's stop timeout, 60)")
    p.add_argument("--max-used", type=size, metavar="SIZE", help="most memory a free GPU may show (default: as clear)")
    p.add_argument("--clear", action="store_true",
                   help="kept for scripts: ends nothing down does not (a process not proven the unit's is never "
                   "signaled; it is named with the 'gpuslate clear --pid N' that ends it)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ...api import Host  # lazy: startup
    from ...units import DownOptions  # lazy: startup
    from ...units.interrupts import deferred_interrupts  # lazy: startup

    opts = DownOptions(grace=args.grace, timeout=args.timeout, max_used=args.max_used, clear_strays=args.clear)
    if len(args.names) != 1:
        return run_many(args, opts)
    # a dropped ssh session must not leave it half-stopped
    with deferred_interrupts(signals=(signal.SIGHUP,)), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = host.down(args.names[0], opts)
    return present(args, result)


def run_many(args: argparse.Namespace, opts: DownOptions) -> int:
    from ...api import Host  # lazy: startup
    from ...units import down_many  # lazy: startup
    from ...units.interrupts import deferred_interrupts  # lazy: startup

    names = list(dict.fromkeys(args.names)) or file_units(args.config, "down")
    with deferred_interrupts(signals=(signal.SIGHUP,)), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = down_many(host, names, opts, known_only=not args.names)
    return present(args, result)
