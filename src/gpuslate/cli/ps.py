"""``gpuslate ps``: the managed units and their live state."""

from __future__ import annotations

import argparse

from .._parse import format_size
from .._time import format_duration
from .common import add_common, print_json
from .exits import exit_epilog


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ps", help="list managed units: state, pid, uptime, port, GPUs, memory, time to ready",
                       description="List managed units with their state as the host shows it now: "
                       "starting, ready, exited, failed, stopped, orphaned (the main process died while "
                       "processes of the unit live on, or 'up' vanished before it was ready; 'gpuslate down NAME' "
                       "cleans them up), or corrupt (its record cannot be read).",
                       epilog=exit_epilog({0: "listed", 5: "unsafe state folder"}))
    add_common(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .._parse import format_size  # lazy: startup
    from ..api import Host  # lazy: startup
    from .render import safe  # lazy: startup
    from .up import gpu_text  # lazy: startup

    with Host.open(getattr(args, "sim", None)) as host:
        result = host.ps()
    if args.json:
        print_json(result.to_json())
        return 0
    if not result.units:
        print("No units. Start one with: gpuslate up NAME --gpus LIST --port PORT -- COMMAND ...")
        return 0
    head = ("NAME", "STATE", "PID", "UPTIME", "PORT", "GPUS", "GPU MEMORY", "READY IN")
    rows = [head]
    for u in result.units:
        r = u.record
        ttr = r.time_to_ready_s if r is not None else None
        rows.append((u.unit.name, u.state.value, str(u.pid or "-"), format_duration(u.uptime_s),
                     str((r.port if r else None) or "-"), gpu_text(u.unit.gpus),
                     format_size(u.gpu_memory) if u.gpu_memory is not None else "-",
                     f"{ttr:.2f}s" if ttr is not None else "-"))
    rows = [tuple(safe(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for w in result.warnings:
        print(f"warning: {safe(w)}")
    return 0
