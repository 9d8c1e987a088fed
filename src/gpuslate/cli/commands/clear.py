"""``gpuslate clear``: terminate the right processes, prove the GPUs free (its options: gpuslate/verbs.py's CLEAR)."""

from __future__ import annotations

import argparse
import sys

from ...api import Host
from ...clearing.plan import Plan
from ...verbs import CLEAR
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = CLEAR.read(args)
    ask = not line.yes and not line.options.dry_run and sys.stdin.isatty()
    options = line.options._replace(confirm=_confirm) if ask else line.options
    # The CLI opens the host and never closes it: the process exits right after,
    # and nvmlShutdown would only add milliseconds to every clear (as for status).
    with LiveLine.of(args) as live:
        result = Host.open(args.sim, on_event=live.note, on_progress=live.sink).clear(line.selection, options)
    return present(args, result)


def _confirm(plan: Plan) -> bool:
    """On a terminal: show the plan, ask before any signal."""
    from ..render.clear import print_plan  # lazy: startup (only a terminal is asked)

    print_plan(plan, file=sys.stderr)
    n = len(plan.targets)
    sys.stderr.write(f"Terminate {'this process' if n == 1 else f'these {n} processes'}? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")
