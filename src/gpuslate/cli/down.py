"""``gpuslate down NAME``: stop every process of a unit and verify its GPU memory is released."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from .common import add_common, nonnegative_float, note, print_json, size
from .exits import exit_epilog, exit_status_for_result
from .plain import safe
from .up import unit_name


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("down", help="stop a managed unit and verify its GPUs are released",
                       description="SIGTERM every process of the unit (cgroup, session, process group), grace, "
                       "SIGKILL; sweep processes of the unit that appeared meanwhile; then verify its GPU memory "
                       "is released, as 'clear' does. A unit with a corrupt record is stopped by what can still "
                       "be found of it (its cgroup, its instance's marker, its port); the record is then "
                       "set aside. Only this unit instance's processes are reached (never another user's or "
                       "another state folder's unit of the same name).",
                       epilog=exit_epilog({0: "stopped and its GPU memory released", 2: "bad input, or unknown unit",
                                           4: "not released in time (or held by processes not found in the "
                                           "unit: see --clear)", 5: "permission denied on some process"}))
    add_common(p)
    p.add_argument("name", metavar="NAME", type=unit_name)
    p.add_argument("--grace", type=nonnegative_float, metavar="SECONDS", help="default: the unit's (10)")
    p.add_argument("--timeout", type=nonnegative_float, metavar="SECONDS",
                   help="for stopping and memory release together (default: the unit's stop timeout, 60)")
    p.add_argument("--max-used", type=size, metavar="SIZE", help="most memory a free GPU may show (default: as clear)")
    p.add_argument("--clear", action="store_true",
                   help="also end processes holding the unit's GPUs that started while it ran but are not found "
                   "in it (a late fork that left the session and renamed itself), with 'clear' rules")
    p.set_defaults(handler=run)


def down_status(result: Any) -> int:
    if result.ok:
        return exit_status_for_result("stopped")
    return exit_status_for_result("permission_denied" if result.report.permission_denied else "timeout")


def memory_text(rep: Any) -> str:
    """What the stop proved about GPU memory: released or not, on which GPUs; or why nothing was
    verified (never "released" for an empty set)."""
    if rep.released is None:
        return f"GPU memory not verified: {safe(rep.unverified)}"
    gpus = ",".join(map(str, rep.verified_gpus))
    return f"GPU memory on GPU {gpus} {'released' if rep.released else 'NOT released'}"


def print_down(result: Any) -> None:
    rep = result.report
    procs = rep.results + rep.swept
    by = {s: sum(1 for r in procs if r.ended_by == s) for s in ("SIGTERM", "SIGKILL")}
    t = rep.timings
    if result.set_aside:
        print(f"Unit {result.name}: corrupt record ({safe(result.corrupt)}) moved to {result.set_aside}")
    if result.cleared is not None:
        print(f"Cleared {len(result.cleared.results)} processes the unit left on its GPUs")
    if not procs:
        print(f"Unit {result.name} ({result.previous_state}): no process left to stop; {memory_text(rep)}"
              + (f" ({t['verify_s']:.2f} s)" if rep.released is not None else ""))
        return
    print(f"Unit {result.name} stopped ({result.previous_state} before): {len(procs)} processes "
          f"(SIGTERM {by['SIGTERM']}, SIGKILL {by['SIGKILL']}) in {t['stop_s']:.2f} s; {memory_text(rep)}"
          + (f" after {t['verify_s']:.2f} s more" if rep.released is not None else ""))
    if rep.released is not None and rep.unverified:
        print(f"  not verified: {safe(rep.unverified)}")


def run(args: argparse.Namespace) -> int:
    from ..api import Host  # lazy: startup
    from ..units import DownOptions  # lazy: startup
    from ..units.interrupts import deferred_interrupts  # lazy: startup

    opts = DownOptions(grace=args.grace, timeout=args.timeout, max_used=args.max_used, clear_strays=args.clear)
    # a dropped ssh session must not leave it half-stopped
    with deferred_interrupts(signals=(signal.SIGHUP,)), Host.open(getattr(args, "sim", None), on_event=note) as host:
        result = host.down(args.name, opts)
    if args.json:
        print_json(result.to_json())
    else:
        print_down(result)
    if not result.ok:
        for d in result.report.diagnosis:
            sys.stderr.write(f"gpuslate: {d.summary()}\n")
        alive = [r.victim.ident.pid for r in result.report.results + result.report.swept if r.alive]
        strays = [s.pid for s in result.strays]
        why = (f"processes still running: {alive}" if alive else
               f"its GPUs are held by processes not found in it: {strays} (add --clear to end them)"
               if strays and result.cleared is None else
               f"its GPU memory could not be verified: {result.report.unverified}" if result.report.released is None
               else "its GPU memory was not released in time")
        sys.stderr.write(f"gpuslate: error: unit {args.name} not fully stopped: {safe(why)}\n")
    return down_status(result)
