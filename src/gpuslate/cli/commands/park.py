"""``gpuslate park NAME``: release a unit's GPU memory while it lives, proven by NVML (its options:
gpuslate/verbs.py's PARK; docs/units.md, Park and resume)."""

from __future__ import annotations

import argparse
import signal

from ...api import Host
from ...units.interrupts import deferred_interrupts
from ...verbs import PARK
from ..render.live import LiveLine
from . import present


def run(args: argparse.Namespace) -> int:
    line = PARK.read(args)
    # a dropped ssh session must not leave it half-parked (a Ctrl-C does, named: 'gpuslate resume' ends it)
    with deferred_interrupts(signals=(signal.SIGHUP,)), LiveLine.of(args) as live, \
            Host.open(getattr(args, "sim", None), on_event=live.note, on_progress=live.sink) as host:
        result = host.park(line.name, line.options)
    return present(args, result)
