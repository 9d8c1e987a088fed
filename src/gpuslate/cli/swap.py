"""``gpuslate swap OLD NEW [--rollback]``: replace one unit by another, each phase timed."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .._parse import format_size
from .common import add_common, note, print_json
from .exits import exit_epilog, exit_status_for_result
from .up import print_up, report_failure, unit_name, up_status

if TYPE_CHECKING:
    from ..units.swap import SwapResult

PHASE_LABELS = (("lock_wait_s", "wait for the host lock"), ("prefetch_wait_s", "prefetch {new} (old serves)"),
           ("stop_old_s", "stop {old}"), ("verify_clean_s", "verify GPUs clean"),
           ("preflight_new_s", "pre-flight {new}"),
           ("launch_new_s", "launch {new}"), ("ready_new_s", "{new} ready"), ("smoke_new_s", "smoke completion"),
           ("rollback_s", "rollback to {old}"))


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
    p.add_argument("--config", metavar="PATH", help="unit file (default: ./gpuslate.toml if present)")
    p.add_argument("--no-prefetch", action="store_true",
                   help="do not read NEW's weight files into the page cache before stopping OLD")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..api import Host  # lazy: startup
    from ..units import SwapOptions  # lazy: startup
    from ..units.interrupts import stop_signals_interrupt  # lazy: startup
    from .down import down_status, print_down  # lazy: startup
    from .up import print_up, report_failure, up_status  # lazy: startup

    opts = SwapOptions(rollback=args.rollback, config=args.config, prefetch=not args.no_prefetch)
    # a SIGTERM or SIGHUP cleans up NEW's start like Ctrl-C (exit 130)
    with stop_signals_interrupt(), Host.open(getattr(args, "sim", None), on_event=note) as host:
        result = host.swap(args.old, args.new, opts)
    if args.json:
        print_json(result.to_json())
    else:
        print_down(result.down)
        if result.up is not None and result.up.ok:
            print_up(result.up)
        if result.rollback is not None and result.rollback.ok:
            print(f"Rolled back: {args.old} is serving again.")
            print_up(result.rollback)
        for key, label in PHASE_LABELS:
            if key in result.phases:
                print(f"  {label.format(old=args.old, new=args.new):<28} {result.phases[key]:8.3f} s")
        print(f"  {'total':<28} {result.total_s:8.3f} s" +
              (f"  (gpuslate overhead {result.overhead_s:.3f} s)" if result.overhead_s is not None else ""))
        print_prefetch(result)
        print_downtime(result)
    if result.status == "down_failed":
        sys.stderr.write(f"gpuslate: error: could not stop {args.old} cleanly; {args.new} was not started\n")
        return down_status(result.down)
    if result.up is not None and not result.up.ok:
        report_failure(result.up)
        if result.rollback is not None:
            if result.rollback.ok:
                sys.stderr.write(f"gpuslate: rolled back: {args.old} is ready again\n")
            else:
                report_failure(result.rollback)
        return up_status(result.up)
    return exit_status_for_result(result.status)


_DOWNTIME_LABELS = (("stop_old_s", "stop {old}"), ("verify_clean_s", "verify GPUs clean"),
                    ("preflight_new_s", "pre-flight {new}"), ("spawn_new_s", "spawn {new}"),
                    ("start_to_port_open_s", "process start -> port open"),
                    ("port_open_to_ready_s", "port open -> ready"), ("smoke_new_s", "smoke completion"))


def print_prefetch(result: SwapResult) -> None:
    pf = result.prefetch
    if pf is None:
        return
    if pf.status in ("done", "partial"):
        n = len(pf.plan.files)
        took = f" in {pf.seconds:.3f} s, {format_size(int(pf.read_bytes / pf.seconds))}/s" if pf.seconds else ""
        print(f"  prefetch: {pf.status}, {format_size(pf.read_bytes)} of {format_size(pf.plan.total)} in "
              f"{n} file{'s' if n != 1 else ''}{took}")
    else:
        print(f"  prefetch: {pf.status}" + (f" ({pf.plan.warning or pf.error})" if pf.plan.warning or pf.error else ""))


def print_downtime(result: SwapResult) -> None:
    """Nothing served for downtime_s: its parts, one line each."""
    if result.downtime_s is None or not result.downtime:
        return
    print(f"  {'downtime (nothing serves)':<28} {result.downtime_s:8.3f} s")
    parts = result.downtime
    for key, label in _DOWNTIME_LABELS:
        if key in parts:
            print(f"    {label.format(old=result.old, new=result.new):<26} {parts[key]:8.3f} s")
    if "start_to_port_open_s" not in parts:
        print(f"    {'process start -> ready':<26} {parts['start_to_ready_s']:8.3f} s")
