"""``gpuslate swap OLD NEW [--rollback]``: replace one unit by another, each phase timed (its options:
gpuslate/verbs.py's SWAP)."""

from __future__ import annotations

import argparse

from ...api import Host
from ...units.interrupts import stop_signals_interrupt
from ...verbs import SWAP
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = SWAP.read(args)
    # a SIGTERM or SIGHUP cleans up NEW's start like Ctrl-C (exit 130)
    with stop_signals_interrupt(), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = host.swap(line.old, line.new, line.options)
    return present(args, result)
