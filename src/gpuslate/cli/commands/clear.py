"""``gpuslate clear``: terminate the right processes, prove the GPUs free (its options: gpuslate/verbs.py's CLEAR)."""

from __future__ import annotations

import argparse

from ...api import Host
from ...verbs import CLEAR
from ..render.live import LiveLine
from . import present
from .common import confirm_plan


def run(args: argparse.Namespace) -> int:
    line = CLEAR.read(args)
    # without --yes, the plan is asked about: cli/main.py has refused to go on without a terminal
    ask = CLEAR.needs_consent(line) and not args.yes
    options = line.options._replace(confirm=confirm_plan) if ask else line.options
    # The CLI opens the host and never closes it: the process exits right after,
    # and nvmlShutdown would only add milliseconds to every clear (as for status).
    with LiveLine.of(args) as live:
        result = Host.open(args.sim, on_event=live.note, on_progress=live.sink).clear(line.selection, options)
    return present(args, result)
